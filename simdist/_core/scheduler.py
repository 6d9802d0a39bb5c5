"""The scheduler of one simulated world: a facade over the rooms of ``_core``.

One lock guards the whole world's matching state, so the scheduler always
knows every rank's state (running, waiting on what, finished, failed), which
makes deadlock detection exact (see ``deadlock``). The backend and the run
layer talk only to this class; it owns the lock and wires the parts:
``Slots`` (thread states and counts), ``Turns`` (run token or baton),
``CollectiveTable``/``P2PTable`` (matching), ``Detector`` (stuck waits),
``HelperBook`` (helper threads and pool items); its blocking waits are the
``waiting.Waits`` mixin.
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
from .slots import Aborts, Findings, Slots
from .turns import Baton, RunToken, Turns
from .waiting import Waits, poll_interval


class Scheduler(Waits):
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
