"""Whose turn it is: the run token (scheduled) or the baton (concurrent).

Both answer the same questions for the scheduler: what happens when a rank
becomes runnable (woken, or interrupted out of a wait), when it parks, when it
leaves, when a helper thread blocks. Scheduled, one rank holds the token and
runs; it hands the token on (the policy picks) when it waits or leaves, so
the interleaving depends only on the program and the seed. Concurrent, every
runnable rank runs; the baton only paces OS wake-ups (see ``Baton``).
Every ``*_locked`` method is called with the world's lock held.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from ..policy import Policy
from . import affinity
from .affinity import Handoffs
from .records import RankState, Waitable, copy_error
from .slots import Aborts, RankSlot, Slots


def _nothing() -> None:
    pass


def _nothing_for(rank: int) -> None:
    pass


class Turns:
    """The interface, and the parts both modes share."""

    # Scheduled, the deadlock walk is never deferred: when it runs must not
    # depend on timing.
    defer_settle = False

    def __init__(self, slots: Slots) -> None:
        self._slots = slots
        # After a rank gave up the token, and when it runs again (both
        # outside the lock). Attributes, not methods: the run token puts its
        # callbacks here, called at every switch without a frame around each.
        self.yielded: Callable[[], None] = _nothing
        self.resumed: Callable[[int], None] = _nothing_for

    # -- the shared part ------------------------------------------------------

    def wake_locked(self, rank: int, waitable: Waitable, now: bool = True) -> None:
        """The thread of ``rank`` waiting on ``waitable`` may run again. With
        ``now=False`` a main thread's OS wake-up may be deferred (concurrent)."""
        slots = self._slots
        slot = slots.ranks[rank]
        if slot.state is RankState.WAITING and slot.waiting_on is waitable:
            slots.resume_locked(slot)
            self._runnable_locked(rank, slot, now)
        elif slot.helpers:
            for helper in slot.helpers:
                if helper.waiting_on is waitable:
                    slots.helper_stop_wait_locked(helper)
                    helper.parker.unpark()

    def interrupt_main_locked(self, rank: int, error: BaseException) -> None:
        """Raise ``error`` in the rank's main thread's current or next wait."""
        slot = self._slots.ranks[rank]
        if self._slots.resume_locked(slot):
            self._interrupted_locked(rank)
        slot.interrupt = error
        self._token_idle_locked()  # found from a helper thread, the token idle
        slot.parker.unpark()

    def interrupt_rank_locked(self, rank: int, error: BaseException) -> None:
        """Every thread of a rank that can never complete is stuck too."""
        self.interrupt_main_locked(rank, error)
        for helper in self._slots.ranks[rank].helpers:
            if helper.waiting_on is not None:
                self._slots.interrupt_helper_locked(helper, copy_error(error))

    # -- what each mode decides -----------------------------------------------

    def begin(self) -> None:
        """Every rank thread has started."""

    def acquire(self, rank: int) -> None:
        """Block a starting rank until it may run."""

    def holds_locked(self, rank: int) -> bool:
        """Whether ``rank`` may run now (its wait is not just waiting for its turn)."""
        return True

    def queued_ranks_locked(self) -> set[int]:
        """The runnable ranks that may not run now."""
        return set()

    def parked_locked(self, rank: int, slot: RankSlot) -> bool:
        """``rank`` has started to wait (deadlock check done). True when it
        gave up the run token (the caller then calls ``yielded``)."""
        raise NotImplementedError

    def left_locked(self, rank: int) -> None:
        raise NotImplementedError

    def helper_blocked_locked(self) -> None:
        """A helper thread blocked (waits, idles, or a queued item was dropped)."""

    def _runnable_locked(self, rank: int, slot: RankSlot, now: bool) -> None:
        raise NotImplementedError

    def _interrupted_locked(self, rank: int) -> None:
        """A waiting rank was made runnable by an interrupt."""

    def _token_idle_locked(self) -> None:
        """Hand the token on if nobody holds it."""


class RunToken(Turns):
    """Scheduled mode: only the holder executes; the policy picks the next one."""

    def __init__(
        self,
        slots: Slots,
        aborts: Aborts,
        lock: threading.Lock,
        policy: Policy,
        poll_s: float,
        on_resume: Callable[[int], None],
        on_yield: Callable[[], None],
        caller_cpus: set[int] | None = None,
    ) -> None:
        super().__init__(slots)
        self._aborts = aborts
        self._lock = lock
        self._policy = policy
        self._poll_s = poll_s
        self.yielded = on_yield  # gives up the process hold (see rank_state)
        # The next holder is pinned to the hander's CPU before it is woken
        # (see affinity); once it runs, it takes its own CPU mask back.
        self.handoffs = handoffs = Handoffs(caller_cpus)
        self._on_resume: Callable[[int], None] = on_resume
        if handoffs.enabled:
            restore = affinity.restore

            def resumed(rank: int) -> None:
                restore()
                on_resume(rank)

            self._on_resume = resumed
        self.resumed = self._on_resume
        # Late-bound (the detector needs this object first): scheduled, a
        # rank that waits while no rank can run is stuck, whatever it waits for.
        self.nothing_runnable_locked: Callable[[], None] = lambda: None
        self._holder: int | None = None
        for r in range(slots.world_size):
            policy.push(r)
        # The first holder, given the token by ``begin``: a rank that ran while
        # the caller still starts threads would make every later start wait
        # for the GIL (a switch interval, 5 ms, per thread).
        self._first: int | None = policy.pick(lambda r: True)

    def begin(self) -> None:
        with self._lock:
            if self._first is not None and self._holder is None and self._aborts.error is None:
                self._holder, self._first = self._first, None
                slot = self._slots.ranks[self._holder]
                self.handoffs.pin(slot.native_id)
                slot.parker.unpark()

    def acquire(self, rank: int) -> None:
        slot = self._slots.ranks[rank]
        while True:
            with self._lock:
                if self._holder == rank or self._aborts.error is not None:
                    break
            slot.parker.park(self._poll_s)
        self._on_resume(rank)

    def holds_locked(self, rank: int) -> bool:
        return self._holder == rank

    def queued_ranks_locked(self) -> set[int]:
        return {
            r for r, s in enumerate(self._slots.ranks) if s.state is RankState.RUNNING and r != self._holder
        }

    def parked_locked(self, rank: int, slot: RankSlot) -> bool:
        # (While a rank runs, the liveness check has nothing to find.)
        if slot.interrupt is None and self._slots.running == 0:
            self.nothing_runnable_locked()
        if slot.interrupt is not None:
            return False  # this rank can never complete: it raises on its next pass
        slot.yielded = True
        self._hand_locked()
        return True

    def left_locked(self, rank: int) -> None:
        if self._aborts.error is None:
            self.nothing_runnable_locked()
            if self._holder == rank:
                self._hand_locked()
        affinity.restore()  # a thread the pool reuses keeps no pin

    def helper_blocked_locked(self) -> None:
        self.nothing_runnable_locked()

    def _runnable_locked(self, rank: int, slot: RankSlot, now: bool) -> None:
        self._policy.push(rank)
        if self._holder is None and self._first is None:  # never lose the token
            self._hand_locked()

    def _interrupted_locked(self, rank: int) -> None:
        self._policy.push(rank)

    def _token_idle_locked(self) -> None:
        if self._holder is None:
            self._hand_locked()

    def _hand_locked(self) -> None:
        """The holder blocked or left: give the token to the policy's pick."""
        ranks = self._slots.ranks
        self._holder = self._policy.pick(lambda r: ranks[r].state is RankState.RUNNING)
        if self._holder is not None:
            slot = ranks[self._holder]
            self.handoffs.pin(slot.native_id)
            slot.parker.unpark()


class Baton(Turns):
    """Concurrent mode: every runnable rank runs; wake-ups are paced.

    Waking every member of a finished collective at once makes them all fight
    for the GIL (each handoff is an OS wake-up); waking one now and the rest
    one by one as others block keeps about two runnable threads, one per
    core, which is several times faster at 8+ ranks.
    """

    defer_settle = True

    def __init__(self, slots: Slots) -> None:
        super().__init__(slots)
        self._ready: deque[int] = deque()  # runnable ranks whose wake-up is deferred

    def parked_locked(self, rank: int, slot: RankSlot) -> bool:
        if slot.interrupt is None:
            self._pass_locked()
        return False

    def left_locked(self, rank: int) -> None:
        self._pass_locked()

    def _runnable_locked(self, rank: int, slot: RankSlot, now: bool) -> None:
        if now:
            slot.parker.unpark()
        else:
            self._ready.append(rank)

    def _pass_locked(self) -> None:
        """Wake one deferred rank: called by a rank about to park or leave."""
        if self._ready:
            self._slots.ranks[self._ready.popleft()].parker.unpark()
