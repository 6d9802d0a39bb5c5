"""Per-rank process state, swapped when the run token passes between ranks.

A process keeps some state once: torch's default generators, Python's and
numpy's global random state, module globals. Processes of a real world each
have their own; simdist's rank threads share one. Since only the rank holding
the run token executes, the process-wide values can belong to that rank: on
every switch the previous owner's values are saved and the incoming rank's
loaded, as an OS switches address spaces. Every rank starts from the values at
run start (deep copies), and the caller's values are put back when the run ends.

Runs in progress at the same time (from several threads) are kept apart by
the process hold (``hold``): a rank holds it while it holds its run's token and
executes, so one rank of all runs executes at a time. When a rank of another
run takes it, the previous run's values are saved (its rank's) and its
caller's values put back before the new run loads its own: each run sees
only its own ranks' state and its caller's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .._core.identity import me
from . import hold, rank_local_defaults
from .generators import _builtin_slots, numpy_unvouched
from .slots import _Slot, resolve_rank_local

# The run whose values the process holds (the last run whose rank held the
# process, or whose caller captured its values); written with the hold held.
_owner: RankStates | None = None


def _aborted() -> Any:
    """This thread's run's abort (a nested run's caller is a rank of it)."""
    world = me.world
    return None if world is None else world.scheduler.aborted


# The calling thread gives up its hold of the process, if it has one (its
# rank blocked in simdist, or left): called at every switch, so the hold's
# own function, without a frame around it.
release_process = hold.release


def suspend_process() -> tuple[RankStates, int] | None:
    """A rank that starts a run of its own (a nested run) lets that run's
    ranks take the process while it waits; ``resume_process`` takes it back."""
    states = hold.held_states()
    if states is None:
        return None
    rank = states._loaded
    hold.release()
    return None if rank is None else (states, rank)


def resume_process(held: tuple[RankStates, int] | None) -> None:
    if held is not None:
        states, rank = held
        # Bounded by the caller's own run: if that run is being taken down
        # (Ctrl-C, its watchdog), the rank only unwinds.
        states.switch_to(rank, _aborted)


def _set_all(slots: Sequence[_Slot], values: Sequence[Any]) -> None:
    """Write every slot, even when one fails (the first error is raised after)."""
    error: BaseException | None = None
    for slot, value in zip(slots, values):
        try:
            slot.set(value)
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error


class RankStates:
    """The process state of every rank of one run, and the caller's."""

    def __init__(self, world_size: int, rank_local: Sequence[Any] = ()) -> None:
        global _owner
        explicit = resolve_rank_local(rank_local)
        self._slots = (
            _builtin_slots() + explicit + rank_local_defaults.default_slots({s.name for s in explicit})
        )
        self._lock = threading.Lock()
        # Generator snapshots are immutable, so every rank starts from the
        # caller's very objects: a rank that never draws is never written.
        self._ranks: list[list[Any] | None] = [None] * world_size
        self._loaded: int | None = None  # whose values the process holds now
        self.switches = 0
        # The caller's values, not those of a rank of another run in progress.
        try:
            if not hold.take(self, _aborted):
                raise _aborted()
            try:
                if _owner is not None:
                    previous, _owner = _owner, None
                    previous._evict()
                fingerprints = [slot.fingerprint() for slot in self._slots]
                self._caller = [slot.get() for slot in self._slots]
                self._held = list(self._caller)  # the values the process holds now
                # The fingerprint of the process state when each held value was
                # read or loaded (None: cannot vouch, read it at the next switch).
                self._marks = [
                    self._mark(i, v, f) for i, (v, f) in enumerate(zip(self._caller, fingerprints))
                ]
                # The process holds the caller's values, just read: the first
                # switch checks fingerprints instead of reading every slot again
                # (numpy's state alone costs tens of us to read and to write).
                _owner = self
            finally:
                hold.release()
        except BaseException:
            for slot in self._slots:
                slot.close()  # the import hook a default slot put in place
            raise

    def _mark(self, i: int, value: Any, fingerprint: Any) -> Any:
        if fingerprint is not None and self._slots[i].name == "numpy.random" and numpy_unvouched(value):
            return None
        return fingerprint

    def switch_to(self, rank: int, aborted: Callable[[], Any] = lambda: None) -> None:
        """Make the process state ``rank``'s (called by ``rank`` on taking the
        token): take the process-wide lock, then swap."""
        global _owner
        # (A thread holding the process for another run keeps it, now for
        # this one: take() moves it, as giving it up first and taking it
        # back at once would, without waking the waiters for nothing.)
        if not hold.holds(self):
            if not hold.take(self, aborted):
                return  # the run is being taken down; the rank only unwinds
        with self._lock:
            if _owner is not self:
                previous, _owner = _owner, self
                if previous is not None:
                    previous._evict()
                # Whatever another run left, nothing of it is this run's.
                self._held = [s.get() for s in self._slots]
                self._marks = [None] * len(self._slots)
            if self._loaded == rank:
                return
            held, marks = self._held, self._marks
            # Nobody ran since the owner gave up the token: the process still
            # holds the owner's values; read only what it changed (each
            # fingerprint is read once).
            for i, slot in enumerate(self._slots):
                mark = marks[i]
                fingerprint = slot.fingerprint()
                if mark is None or fingerprint != mark:
                    held[i] = value = slot.get()
                    marks[i] = self._mark(i, value, fingerprint)
            if self._loaded is not None:
                self._ranks[self._loaded] = list(held)
            values = self._ranks[rank]
            if values is None:
                values = [s.copy(v) for s, v in zip(self._slots, self._caller)]
            for i, (slot, value) in enumerate(zip(self._slots, values)):
                if value is not held[i]:
                    slot.set(value)
                    held[i] = value
                    # Read after writing: a module slot's fingerprint is the
                    # ids of the objects now bound, which a copy changes.
                    marks[i] = self._mark(i, value, slot.fingerprint())
            self._loaded = rank
            self.switches += 1

    def _evict(self) -> None:
        """Another run takes the process: keep the loaded rank's values and
        put this run's caller's back (called with the process lock held)."""
        with self._lock:
            try:
                if self._loaded is not None:
                    self._ranks[self._loaded] = [s.get() for s in self._slots]
            finally:
                self._loaded = None
                _set_all(self._slots, self._caller)

    def _changed_from_caller(self) -> tuple[list[_Slot], list[Any]]:
        """The slots (with the caller's values) the process may no longer hold
        the caller's value of: all but those it was last seen holding, by a
        fingerprint that still vouches for it (called with the lock held)."""
        slots, values = [], []
        for i, (slot, value) in enumerate(zip(self._slots, self._caller)):
            mark = self._marks[i]
            if mark is None or self._held[i] is not value or slot.fingerprint() != mark:
                slots.append(slot)
                values.append(value)
        return slots, values

    def restore_caller(self) -> None:
        """Put the caller's values back (the run has ended). The run gives
        up ownership first, whatever fails: a slot whose write fails must not
        leave an owner that every later run would try to evict again."""
        global _owner
        hold.release_for(self)
        taken = False
        try:
            # A rank of another run may be executing: wait for the hold
            # (polled: Ctrl-C reaches a caller waiting here).
            taken = hold.take(self)
            with self._lock:
                if _owner is self:
                    _owner = None
                    _set_all(*self._changed_from_caller())
        finally:
            self._loaded = None
            if taken:
                hold.release()
            for slot in self._slots:
                slot.close()
