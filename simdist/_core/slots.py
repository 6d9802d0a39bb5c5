"""Each thread's slot, the counters only these methods edit, and the world's
aborts and findings.

A rank has its main thread's slot (``RankSlot``) and one ``HelperSlot`` per
live helper thread. ``Slots`` keeps the world's counts in step with the
states: how many ranks run (``running``), how many helper threads wait
(``helper_waits``), which ranks have left (``gone``). Every state change goes
through its methods, so the counts cannot drift; every method is called with
the world's lock held.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ..errors import DeadlockError
from .records import RankState, ThreadExit, Waitable, copy_error


class Parker:
    """A binary semaphore: park() sleeps until unpark() (a permit may come first)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def park(self, timeout: float) -> None:
        self._lock.acquire(timeout=timeout)

    def unpark(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:
            pass  # a permit is already pending


@dataclass(eq=False)
class HelperSlot:
    """A thread a rank started (a helper): its own wait, parker and interrupt.

    Helpers do not take the run token: they run alongside whichever rank
    holds it. A rank is blocked only when its main thread and every live
    helper wait."""

    name: str
    daemon: bool
    thread_id: int | None = None
    waiting_on: Waitable | None = None
    parker: Parker = field(default_factory=Parker)
    interrupt: BaseException | None = None
    joiners: list[ThreadExit] = field(default_factory=list)  # ThreadExit waits on this thread
    # A ThreadPoolExecutor worker between work items blocks on the pool's
    # queue: blocked, though not in simdist. Its executor (a weak reference).
    idle: bool = False
    executor: Any = None
    pool: int | None = None  # id() of that executor, the key of its queued items
    in_item: bool = False  # a pool worker inside a work item's own function


@dataclass
class RankSlot:
    state: RankState = RankState.RUNNING
    waiting_on: Waitable | None = None
    thread_id: int | None = None
    native_id: int | None = None  # the OS's id of the thread (affinity pins it)
    parker: Parker = field(default_factory=Parker)
    # An error for this rank alone (a deadlock it is part of, a failed peer it
    # waits on), raised by its current or next wait.
    interrupt: BaseException | None = None
    # For a rank that has left: the rank whose failure it was or passed on
    # (itself when it failed on its own), or None when it finished.
    root_failure: int | None = None
    yielded: bool = False  # gave up the run token in its current wait
    failure: str = ""  # "Type: message" of a rank that failed on its own
    helpers: list[HelperSlot] = field(default_factory=list)  # live HelperSlots
    helpers_done: list[ThreadExit] = field(default_factory=list)  # waits for non-daemon helpers
    # Pool work items submitted by the rank, not yet started, per pool (id of
    # its executor; a pool with none queued has no entry).
    queued_by_pool: dict[int, int] = field(default_factory=dict)


class Slots:
    """Every thread slot of one world, and the counts kept in step with them."""

    def __init__(self, world_size: int) -> None:
        self.ranks = [RankSlot() for _ in range(world_size)]
        self.world_size = world_size
        self.running = world_size  # ranks in RUNNING
        self.helper_waits = 0  # helper threads waiting right now
        self.gone: set[int] = set()  # ranks that finished or failed

    # -- main threads -------------------------------------------------------

    def start_wait_locked(self, slot: RankSlot, waitable: Waitable) -> None:
        """RUNNING -> WAITING on ``waitable``."""
        slot.state = RankState.WAITING
        slot.waiting_on = waitable
        waitable.waiters += 1
        self.running -= 1

    def resume_locked(self, slot: RankSlot) -> bool:
        """WAITING -> RUNNING (the one place it happens); False if it was not waiting."""
        if slot.state is not RankState.WAITING:
            return False
        slot.state = RankState.RUNNING
        if slot.waiting_on is not None:
            slot.waiting_on.waiters -= 1
        slot.waiting_on = None
        self.running += 1
        return True

    def leave_locked(self, rank: int, state: RankState) -> bool:
        """The rank's body ended (FINISHED or FAILED); False if it had already left."""
        slot = self.ranks[rank]
        if slot.state in (RankState.FINISHED, RankState.FAILED):
            return False
        if slot.state is RankState.RUNNING:
            self.running -= 1
        elif slot.waiting_on is not None:
            slot.waiting_on.waiters -= 1
        slot.state = state
        self.gone.add(rank)
        slot.waiting_on = None
        slot.interrupt = None
        return True

    def waiting_count(self) -> int:
        """Main threads waiting right now."""
        return self.world_size - self.running - len(self.gone)

    # -- helper threads -----------------------------------------------------

    def helper_start_wait_locked(self, helper: HelperSlot, waitable: Waitable) -> None:
        helper.waiting_on = waitable
        self.helper_waits += 1

    def helper_stop_wait_locked(self, helper: HelperSlot) -> bool:
        """The helper no longer waits; False if it was not waiting."""
        if helper.waiting_on is None:
            return False
        helper.waiting_on = None
        self.helper_waits -= 1
        return True

    def interrupt_helper_locked(self, helper: HelperSlot, error: BaseException) -> None:
        self.helper_stop_wait_locked(helper)
        helper.interrupt = error
        helper.parker.unpark()

    def helper_of(self, rank: int) -> HelperSlot | None:
        """The calling thread's helper slot, when it is a helper of ``rank``."""
        me = threading.get_ident()
        for helper in self.ranks[rank].helpers:
            if helper.thread_id == me:
                return helper
        return None

    # -- questions ------------------------------------------------------------

    def progressing(self, rank: int) -> bool:
        """Whether some thread of ``rank`` runs (its main thread, or a helper),
        or a work item it queued can start (its pool has a worker not waiting
        in simdist, or is about to start one)."""
        slot = self.ranks[rank]
        if slot.state is RankState.RUNNING:
            return True
        if slot.state is not RankState.WAITING:
            return False
        helpers = slot.helpers
        if any(h.waiting_on is None and not h.idle for h in helpers):
            return True
        for pool in slot.queued_by_pool:
            workers = [h for h in helpers if h.pool == pool]
            # Every worker waiting in simdist: the item waits for one of those waits.
            if not workers or any(h.waiting_on is None for h in workers):
                return True
        return False

    def waiting_threads(self, rank: int) -> list[tuple[HelperSlot | None, Waitable]]:
        """Each waiting thread of ``rank`` (None: its main thread) with its wait."""
        slot = self.ranks[rank]
        threads: list[tuple[HelperSlot | None, Waitable]] = []
        if slot.state is RankState.WAITING and slot.waiting_on is not None:
            threads.append((None, slot.waiting_on))
        threads += [(h, h.waiting_on) for h in slot.helpers if h.waiting_on is not None]
        return threads


_MAX_RECORDED = 1000


class Aborts:
    """A world-wide abort (watchdog, Ctrl-C, the run's end) and aborted communicators."""

    def __init__(self) -> None:
        self.error: BaseException | None = None  # every wait raises it
        self.event = threading.Event()
        # Set once the run is over: any later call on this world raises this.
        self.closed: str | None = None
        self.closed_error: BaseException | None = None
        # Aborted communicators: checked under the lock, so a call entering an
        # aborted group can never start a pending call nobody will complete.
        self.groups: dict[str, BaseException] = {}

    def abort_locked(self, error: BaseException, slots: Slots) -> None:
        self.error = error
        self.event.set()
        for slot in slots.ranks:
            slot.parker.unpark()
            for helper in slot.helpers:
                helper.parker.unpark()

    def fresh_error(self) -> BaseException:
        """What a wait raises once aborted: the run's end says more than the abort."""
        error = self.closed_error or self.error
        assert error is not None
        return copy_error(error)


class Findings:
    """What the run's outcome is decided from, whatever the ranks caught."""

    def __init__(self) -> None:
        # Ranks that raised out of their body because of another rank's failure.
        self.released: set[int] = set()
        # simdist errors raised inside ranks (deadlocks, mismatches, injected
        # crashes), in the order they happened: run() reports them even when
        # every rank caught them.
        self.recorded: list[tuple[int, BaseException]] = []
        self.deadlock: DeadlockError | None = None

    def record_locked(self, rank: int, error: BaseException) -> None:
        # Only the first errors matter to the outcome; a body that catches and
        # retries forever must not grow this without bound.
        if len(self.recorded) < _MAX_RECORDED:
            self.recorded.append((rank, error))

    def deadlock_found_locked(self, error: DeadlockError) -> None:
        if self.deadlock is None:
            self.deadlock = error
