"""Helper threads and pool work items of each rank, as the scheduler counts them.

A helper (a thread a rank started, a ThreadPoolExecutor worker included) has
its own wait slot; a rank is blocked only when its main thread and every live
helper wait. A pool worker between work items is idle (blocked on its queue,
outside simdist); a work item submitted but not yet started keeps its rank
unblocked. Whenever a helper stops running, the deadlock check runs again.
"""

from __future__ import annotations

import threading
from typing import Any

from . import identity
from .deadlock import Detector
from .records import ThreadExit
from .slots import Aborts, HelperSlot, Slots
from .turns import Turns


class HelperBook:
    def __init__(
        self, lock: threading.Lock, slots: Slots, turns: Turns, detector: Detector, aborts: Aborts
    ) -> None:
        self._lock = lock
        self._slots = slots
        self._turns = turns
        self._detector = detector
        self._aborts = aborts

    def add(self, rank: int, name: str, daemon: bool, executor: Any = None) -> HelperSlot:
        """A thread of ``rank`` starts a helper (called before it starts, so
        the rank never looks blocked in between); ``executor`` for a pool
        worker, idle until it starts a work item."""
        pool = None if executor is None else id(executor())
        helper = HelperSlot(name, daemon, idle=executor is not None, executor=executor, pool=pool)
        with self._lock:
            self._slots.ranks[rank].helpers.append(helper)
        return helper

    def remove(self, rank: int, helper: HelperSlot) -> None:
        """A helper thread ends: its joiners complete, and its rank may now be blocked."""
        with self._lock:
            slot = self._slots.ranks[rank]
            if helper in slot.helpers:
                slot.helpers.remove(helper)
            self._slots.helper_stop_wait_locked(helper)
            for waitable in helper.joiners:
                waitable.done = True
                self._turns.wake_locked(rank, waitable)
            if not any(not h.daemon for h in slot.helpers):
                for waitable in slot.helpers_done:
                    waitable.done = True
                    self._turns.wake_locked(rank, waitable)
                slot.helpers_done = []
            self._blocked_locked()

    def join_waitable(self, rank: int, helper: HelperSlot) -> ThreadExit:
        """A wait until ``helper`` (a thread of ``rank``) has ended."""
        waitable = ThreadExit(rank, f"join of helper thread {helper.name!r}")
        with self._lock:
            if helper in self._slots.ranks[rank].helpers:
                helper.joiners.append(waitable)
                # A pool worker is joined once its pool is shut down: it
                # wakes from its queue and leaves on its own.
                helper.idle = False
            else:
                waitable.done = True
        return waitable

    def helpers_waitable(self, rank: int) -> ThreadExit | None:
        """A wait until every non-daemon helper of ``rank`` has ended (as a
        process waits for its threads at exit), or None when none is left."""
        with self._lock:
            slot = self._slots.ranks[rank]
            names = [h.name for h in slot.helpers if not h.daemon]
            if not names:
                return None
            waitable = ThreadExit(rank, f"the end of helper thread(s) {names} after the body returned")
            slot.helpers_done.append(waitable)
            return waitable

    def woken(self, helper: HelperSlot) -> None:
        """An idle pool worker's pool was shut down: it leaves on its own."""
        with self._lock:
            helper.idle = False

    def live(self, rank: int) -> list[HelperSlot]:
        with self._lock:
            return list(self._slots.ranks[rank].helpers)

    def live_everywhere(self) -> list[HelperSlot]:
        """Every rank's live helpers, read in one hold of the lock (a lock per
        rank contends with thousands of running ranks for seconds)."""
        with self._lock:
            return [h for slot in self._slots.ranks for h in slot.helpers]

    def item_queued(self, rank: int, pool: int) -> None:
        """A thread of ``rank`` submitted a work item to its pool ``pool`` (an
        id): the rank is not blocked while a worker of that pool can start it."""
        with self._lock:
            slot = self._slots.ranks[rank]
            slot.queued_by_pool[pool] = slot.queued_by_pool.get(pool, 0) + 1

    def item_started(self, rank: int, pool: int, dropped: bool = False) -> HelperSlot | None:
        """A work item of ``rank`` starts (on the calling pool worker: its
        slot is returned), or was ``dropped`` (cancelled) before it could."""
        with self._lock:
            slot = self._slots.ranks[rank]
            left = slot.queued_by_pool[pool] - 1
            if left:
                slot.queued_by_pool[pool] = left
            else:
                del slot.queued_by_pool[pool]
            helper = None if dropped else self._slots.helper_of(rank)
            if helper is not None:
                helper.idle = False
                helper.in_item = True
            elif dropped:
                self._blocked_locked()
            return helper

    def item_returned(self, helper: HelperSlot | None) -> None:
        """The work item's function returned or raised (its Future is not set yet)."""
        if helper is not None:
            with self._lock:
                helper.in_item = False

    def stop(self, helper: HelperSlot, error: BaseException) -> None:
        """Stop a helper of a rank that has ended (``error``'s type is raised
        in a thread running Python, see ``identity.interrupt``). A helper waiting
        in simdist is told at its wait instead, and a pool worker outside its
        work item's function is left to leave by itself (its pool is shut
        down): an exception raised at a random point there would land in
        concurrent.futures' own code (its callbacks, its worker loop) and be
        logged instead of raised. Under the lock, so the helper's state cannot
        change between the look and the raise."""
        with self._lock:
            if helper.waiting_on is not None:
                self._slots.interrupt_helper_locked(helper, error)
            elif helper.thread_id is not None and (helper.executor is None or helper.in_item):
                identity.interrupt(helper.thread_id, type(error))

    def item_finished(self, helper: HelperSlot | None) -> None:
        """The work item a pool worker ran is done (its Future is set)."""
        with self._lock:
            if helper is not None and helper.executor is not None and not _pool_closed(helper):
                helper.idle = True
                self._blocked_locked()

    def _blocked_locked(self) -> None:
        """A helper stopped running: its rank may now be stuck."""
        if self._aborts.error is None:
            self._detector.settle_locked(None)
            self._turns.helper_blocked_locked()


def _pool_closed(helper: HelperSlot) -> bool:
    """Whether the worker's pool is shut down (or gone): then a worker done
    with an item is not idle but on its way to the next queued item or out,
    so its rank is not blocked on it. (Counting it idle made a rank that left
    queued work look deadlocked on its own helpers at its end.)"""
    executor = helper.executor()
    return executor is None or bool(getattr(executor, "_shutdown", False))
