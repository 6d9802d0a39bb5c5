"""The scheduler of one simulated world: a facade over the rooms of ``_core``.

One lock guards the whole world's matching state, so the scheduler always
knows every rank's state (running, waiting on what, finished, failed), which
makes deadlock detection exact (see ``deadlock``). The backend and the run
layer talk only to this class; it owns the lock and wires the parts:
``Slots`` (thread states and counts), ``Turns`` (run token or baton),
``CollectiveTable``/``P2PTable`` (matching), ``Detector`` (stuck waits),
``HelperBook`` (helper threads and pool items); the blocking waits are its own.
A wait marks its thread waiting, runs the deadlock check, hands the turn on
and parks; it returns once its waitable is done, raises an interrupt meant
for it (a deadlock, a failed peer) or the world's abort. Every park is a
bounded poll, so the watchdog always reaches a waiting thread.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import SimulationError
from ..policy import Policy
from . import affinity
from .deadlock import Detector, helper_lines_locked, wait_text
from .helper_book import HelperBook
from .matching import CollectiveTable, P2PTable
from .records import (
    Call,
    GroupInfo,
    P2POp,
    PendingCollective,
    RankState,
    Waitable,
    consequence_origin,
    copy_error,
)
from .slots import Aborts, Findings, HelperSlot, RankSlot, Slots
from .turns import Baton, RunToken, Turns

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


class Scheduler:
    """The matching state of one simulated world."""

    # Wake the members of a finished collective one at a time (see
    # turns.Baton); a class switch so benchmarks can compare.
    defer_wakeups = True

    def __init__(
        self,
        world_size: int,
        describe_rank: Callable[[int], str],
        on_done: Callable[[Waitable], None] = lambda w: None,
        policy: Policy | None = None,
        on_resume: Callable[[int, Callable[[], BaseException | None]], None] = lambda rank, aborted: None,
        on_yield: Callable[[], None] = lambda: None,
    ) -> None:
        self.world_size = world_size
        self._describe_rank = describe_rank
        self._on_done = on_done
        self._lock = threading.Lock()
        self._caller_mask = affinity.caller_mask()  # every rank thread starts with it
        self._slots = Slots(world_size)
        self._aborts = Aborts()
        self.findings = Findings()
        self._collectives = CollectiveTable()
        self._p2p = P2PTable()
        aborts = self._aborts
        self._poll_s = poll_interval(world_size)

        def resumed(rank: int) -> None:
            # (a closure over the aborts, not the scheduler: no cycle through the token)
            on_resume(rank, lambda: aborts.error)

        turns: Turns
        if policy is None:
            turns = Baton(self._slots)
        else:
            turns = RunToken(
                self._slots,
                self._aborts,
                self._lock,
                policy,
                self._poll_s,
                resumed,
                on_yield,
                self._caller_mask,
            )
        self._turns = turns
        self._detector = Detector(
            self._slots, turns, self._collectives, self._p2p, self._aborts, self.findings, describe_rank
        )
        if isinstance(turns, RunToken):
            # Weakly: the detector holds the token (no cycle for the collector).
            turns.nothing_runnable_locked = _weakly(self._detector.nothing_runnable_locked)
        self.helpers = HelperBook(self._lock, self._slots, turns, self._detector, self._aborts)
        self.scheduled = policy is not None
        # The hot path calls these directly: no extra frame per call.
        self.begin = turns.begin
        self.acquire = turns.acquire

    # -- what the run's outcome reads (with ``findings``) --------------------

    @property
    def recorded(self) -> list[tuple[int, BaseException]]:
        return self.findings.recorded

    @property
    def closed(self) -> str | None:
        return self._aborts.closed

    @property
    def aborted(self) -> BaseException | None:
        return self._aborts.error

    def group_aborted(self, name: str) -> BaseException | None:
        return self._aborts.groups.get(name)

    @property
    def any_group_aborted(self) -> bool:
        return bool(self._aborts.groups)

    def watchdog_view(self, frames: dict[int, Any]) -> tuple[set[int], dict[int, str], dict[int, list[str]]]:
        """For the watchdog's report, taken with ``frames`` (the threads'
        stacks at the deadline): the runnable ranks that do not hold the run
        token (scheduled), what each rank waiting in simdist waits in, and the
        lines naming each rank's live helper threads."""
        with self._lock:
            queued = self._turns.queued_ranks_locked()
            waits = {r: w for r in range(self.world_size) if (w := wait_text(self._slots, r)) is not None}
            helpers = {r: helper_lines_locked(self._slots, r, frames) for r in range(self.world_size)}
        return queued, waits, helpers

    # -- rank lifecycle ---------------------------------------------------------

    def bind_thread(self, rank: int) -> None:
        slot = self._slots.ranks[rank]
        slot.thread_id = threading.get_ident()
        slot.native_id = threading.get_native_id()
        affinity.start_with(self._caller_mask)

    def rank_finished(self, rank: int) -> None:
        with self._lock:
            self._leave_locked(rank, RankState.FINISHED)

    def rank_failed(self, rank: int, exc: BaseException) -> None:
        """``rank`` raised out of its body: released if ``exc`` is (or was
        raised while handling) a consequence of another rank's failure, else
        a failure of its own. Only ranks that wait on it are affected."""
        origin = consequence_origin(exc, rank)
        with self._lock:
            slot = self._slots.ranks[rank]
            if origin is not None:
                self.findings.released.add(rank)
                root = self._slots.ranks[origin].root_failure
                slot.root_failure = origin if root is None else root
            else:
                slot.root_failure = rank
                slot.failure = f"{type(exc).__name__}: {exc}"
            self._leave_locked(rank, RankState.FAILED)

    def _leave_locked(self, rank: int, state: RankState) -> None:
        if self._slots.leave_locked(rank, state):
            self._detector.settle_locked(None, left=rank)
            self._turns.left_locked(rank)

    def record(self, rank: int, error: BaseException) -> None:
        """Note a simdist error raised inside ``rank`` (it may be caught there)."""
        with self._lock:
            self.findings.record_locked(rank, error)

    def abort(self, error: BaseException) -> None:
        """Abort the world (watchdog, external): every wait raises ``error``."""
        with self._lock:
            if self._aborts.error is None:
                self._aborts.abort_locked(error, self._slots)

    def close(self, error: BaseException) -> None:
        """The run is over: every later call or wait on this world raises ``error``."""
        with self._lock:
            self._aborts.closed = str(error)
            # Later calls say the run is over, even when the world had been
            # aborted earlier (watchdog, deadlock): that is what the caller needs.
            self._aborts.closed_error = error
            if self._aborts.error is None:
                self._aborts.abort_locked(error, self._slots)

    # -- blocking waits ------------------------------------------------------------

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

    # -- collectives and point to point ------------------------------------------

    def join_collective(
        self,
        group: GroupInfo,
        seq: int,
        call: Call,
        complete: Callable[[list[Call]], None],
        verify: Callable[[GroupInfo, int, list[Call]], None],
    ) -> PendingCollective:
        """Add this rank's call; the last member to join runs ``complete``."""
        aborts = self._aborts
        with self._lock:
            if aborts.error is not None:  # raise_if_aborted's own test, kept off the hot path
                self.raise_if_aborted_locked(call.rank)
            if group.name in aborts.groups:
                raise copy_error(aborts.groups[group.name])
            pending, last = self._collectives.join_locked(group, seq, call)
            if not last:
                return pending
        calls = [pending.calls[i] for i in range(len(group.ranks))]
        error: BaseException | None = None
        try:
            verify(group, seq, calls)
            complete(calls)
        except BaseException as exc:  # delivered to every member
            error = exc
        with self._lock:
            if isinstance(error, SimulationError):
                for r in group.ranks:
                    self.findings.record_locked(r, error)
            pending.error = error
            pending.done = True
            self._on_done(pending)
            wake = self._turns.wake_locked
            first = True
            for r in group.ranks:
                if r != call.rank:
                    wake(r, pending, now=first or not self.defer_wakeups)
                    first = False
        return pending

    def post_p2p(self, op: P2POp, deliver: Callable[[P2POp, P2POp], None]) -> None:
        """Post a send or a recv; match it with the oldest opposite one."""
        with self._lock:
            self.raise_if_aborted_locked(op.owner)
            if op.group.name in self._aborts.groups:
                raise copy_error(self._aborts.groups[op.group.name])
            other = self._p2p.post_locked(op)
            if other is None:
                return
            send, recv = (op, other) if op.kind == "send" else (other, op)
            try:
                deliver(send, recv)
            except BaseException as exc:
                send.error = recv.error = exc
                if isinstance(exc, SimulationError):
                    self.findings.record_locked(send.src, exc)
                    self.findings.record_locked(recv.dst, exc)
            send.done = recv.done = True
            self._on_done(send)
            self._on_done(recv)
            self._turns.wake_locked(other.owner, other)

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

    def complete(self, rank: int, waitable: Waitable) -> None:
        """Mark a wait of ``rank`` outside collectives and P2P (a store key) done."""
        with self._lock:
            waitable.done = True
            self._turns.wake_locked(rank, waitable)

    def fail_group(self, name: str, error: BaseException) -> None:
        """Fail every pending and later call on communicator ``name`` (an abort)."""
        with self._lock:
            self._aborts.groups.setdefault(name, error)
            for pending in self._collectives.fail_group_locked(name, error):
                self._on_done(pending)
                for r in pending.group.ranks:
                    self._turns.wake_locked(r, pending)
            for op in self._p2p.fail_group_locked(name, error):
                self._on_done(op)
                self._turns.wake_locked(op.owner, op)

    def leftovers(self) -> str | None:
        """After every rank has left: calls that never completed, or None."""
        with self._lock:
            items = self._collectives.leftovers() + self._p2p.leftovers()
        if not items:
            return None
        return "calls that were issued but never completed:\n" + "\n".join(items)


def _weakly(method: Callable[[], None]) -> Callable[[], None]:
    """``method``, called while its object lives, held weakly."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:
            bound()

    return call
