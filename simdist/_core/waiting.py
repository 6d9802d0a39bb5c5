"""The scheduler's blocking waits, a mixin over its parts.

A wait marks its thread waiting, runs the deadlock check, hands the turn on
and parks; it returns once its waitable is done, raises an interrupt meant
for it (a deadlock, a failed peer) or the world's abort. Every park is a
bounded poll, so the watchdog always reaches a waiting thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .deadlock import Detector
from .records import RankState, Waitable, copy_error
from .slots import Aborts, HelperSlot, RankSlot, Slots
from .turns import Turns

# How often a parked rank re-checks for aborts it was not woken for. Wake-ups are
# explicit; this only bounds a lost wake-up. Large worlds poll less often, so
# that the parked ranks together wake at most _MAX_POLLS_PER_S times a second:
# 4096 ranks polling every 0.5 s would spend most of the run waking up.
POLL_S = 0.5
_MAX_POLLS_PER_S = 200.0
# A rank that waits on ranks that are themselves waiting looks for a closed set
# after this long, not at once: most such waits end sooner (the peer's own
# collective completes), and the graph walk would cost more than the handoff.
# Exactness is unaffected: a closed set never opens again.
_SETTLE_AFTER_S = 0.02


def poll_interval(world_size: int) -> float:
    return max(POLL_S, world_size / _MAX_POLLS_PER_S)


class Waits:
    """``Scheduler``'s blocking waits (its lock and parts are the scheduler's)."""

    _lock: threading.Lock
    _slots: Slots
    _aborts: Aborts
    _turns: Turns
    _detector: Detector
    _poll_s: float

    def wait(self, rank: int, waitable: Waitable) -> None:
        """Block ``rank`` until ``waitable`` is done; raise its error if any."""
        slot = self._slots.ranks[rank]
        if slot.helpers and slot.thread_id != threading.get_ident():
            helper = self._slots.helper_of(rank)
            if helper is not None:
                self._wait_helper(rank, helper, waitable)
                return
        try:
            self._wait_main(rank, slot, waitable)
        finally:
            if slot.yielded:
                slot.yielded = False
                self._turns.resumed(rank)
        if waitable.error is not None:
            raise copy_error(waitable.error)

    def raise_if_aborted_locked(self, rank: int) -> None:
        if self._aborts.error is None:
            return
        self._slots.resume_locked(self._slots.ranks[rank])
        raise self._aborts.fresh_error()

    def sleep(self, seconds: float) -> None:
        """Sleep in a rank (a ``delay`` fault); an abort cuts it short."""
        if self._aborts.event.wait(seconds):
            with self._lock:
                raise self._aborts.fresh_error()

    def _wait_main(self, rank: int, slot: RankSlot, waitable: Waitable) -> None:
        settle_pending = False
        gave_up = False
        turns, detector = self._turns, self._detector
        while True:
            with self._lock:
                if slot.yielded and not turns.holds_locked(rank) and self._aborts.error is None:
                    pass  # runnable or still waiting, but not this rank's turn
                elif slot.interrupt is not None:
                    error, slot.interrupt = slot.interrupt, None
                    raise error
                elif waitable.done:
                    self._slots.resume_locked(slot)
                    return
                elif self._aborts.error is not None:
                    self.raise_if_aborted_locked(rank)
                elif settle_pending:
                    settle_pending = False
                    detector.settle_locked(rank, defer=False)
                    if slot.interrupt is not None:
                        continue
                elif slot.state is RankState.RUNNING:
                    self._slots.start_wait_locked(slot, waitable)
                    settle_pending = detector.settle_locked(rank, defer=turns.defer_settle)
                    gave_up = turns.parked_locked(rank, slot)
                    if slot.interrupt is not None:
                        continue  # this rank can never complete: raise on the next pass
            if gave_up:
                gave_up = False
                turns.yielded()
            slot.parker.park(_SETTLE_AFTER_S if settle_pending else self._poll_s)

    def _wait_helper(self, rank: int, helper: HelperSlot, waitable: Waitable) -> None:
        """A helper thread's wait: no run token to give up or take back."""
        slots = self._slots
        while True:
            with self._lock:
                if helper.interrupt is not None:
                    error, helper.interrupt = helper.interrupt, None
                    raise error
                if waitable.done:
                    slots.helper_stop_wait_locked(helper)
                    break
                if self._aborts.error is not None:
                    slots.helper_stop_wait_locked(helper)
                    raise self._aborts.fresh_error()
                if helper.waiting_on is None:
                    slots.helper_start_wait_locked(helper, waitable)
                    blocked = not slots.progressing(rank)
                    # Even while its rank runs on, this thread alone may wait
                    # on a peer that has left.
                    self._detector.settle_locked(None)
                    if blocked and helper.interrupt is None:
                        self._turns.helper_blocked_locked()
                    if helper.interrupt is not None:
                        continue
            helper.parker.park(POLL_S)
        if waitable.error is not None:
            raise copy_error(waitable.error)

    def wait_timed(
        self, rank: int, waitable: Waitable, seconds: float, make_error: Callable[[], BaseException]
    ) -> None:
        """``wait`` with a timeout: should the wait never complete, it raises
        ``make_error()`` at once (the deadlock report as its cause) instead of
        ``DeadlockError``. simdist keeps no clock: a wait that can complete is
        never timed out, however long it takes."""
        if self._slots.ranks[rank].thread_id != threading.get_ident():
            self.wait(rank, waitable)  # a helper thread's wait: deadlock detection as usual
            return
        with self._lock:
            self._detector.timed[rank] = (waitable, seconds, make_error)
        try:
            self.wait(rank, waitable)
        finally:
            with self._lock:
                self._detector.timed.pop(rank, None)
