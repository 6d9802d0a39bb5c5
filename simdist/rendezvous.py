"""Matching of collective and point-to-point calls between rank threads.

One lock guards the whole world's matching state, so the scheduler always knows
every rank's state (running, waiting on what, finished, failed). That makes
deadlock detection exact: ranks wait for ranks (a collective for the members
that have not joined, a send for its receiver), and a waiting rank can complete
only if every rank it needs is running or can itself complete. The waiting
ranks outside that set form a closed set nothing can ever wake: those blocked
(transitively) on a failed rank are released with ``PeerFailedError``, the
others are deadlocked and get ``DeadlockError``; ranks still running are left
alone. Which ranks are released therefore depends only on what each rank
waits for, never on thread timing. Every blocking wait is a bounded poll too,
so the watchdog always reaches a waiting rank.

A rank may have helper threads (see ``helpers``): each has its own wait slot.
A rank is blocked only when its main thread and every live helper wait, and
can complete as soon as any one of its threads can (``cannot_complete_threads``);
a single thread waiting on a peer that has left is told alone.
"""

from __future__ import annotations

import enum
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import stacks
from .errors import DeadlockError, PeerFailedError, SimulationError
from .policy import Policy
from .waitfor import cannot_complete_threads, deadlock_headline, on_cycle, reachable

# How often a parked rank re-checks for aborts it was not woken for. Wake-ups are
# explicit; this only bounds a lost wake-up. Large worlds poll less often, so
# that the parked ranks together wake at most _MAX_POLLS_PER_S times a second:
# 4096 ranks polling every 0.5 s would spend most of the run waking up.
_POLL_S = 0.5
_MAX_POLLS_PER_S = 200.0
# A rank that waits on ranks that are themselves waiting looks for a closed set
# after this long, not at once: most such waits end sooner (the peer's own
# collective completes), and the graph walk would cost more than the handoff.
# Exactness is unaffected: a closed set never opens again.
_SETTLE_AFTER_S = 0.02
_MAX_RECORDED = 1000


class RankState(enum.Enum):
    RUNNING = "running"
    WAITING = "waiting"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(eq=False)
class GroupInfo:
    """A communicator: its c10d name, member global ranks (group-rank order), label.

    Shared by the members' group objects; the label is refined once c10d tells
    a group its description (e.g. "dp/dp_cp"), hence mutable.
    """

    name: str
    ranks: tuple[int, ...]
    label: str

    def describe(self) -> str:
        return f"{self.label} {list(self.ranks)}"


class Call:
    """One rank's part of a collective (built on every call, hence slots)."""

    __slots__ = (
        "fingerprint",
        "group_rank",
        "inference",
        "injected",
        "op",
        "payload",
        "rank",
        "record",
        "site",
    )

    def __init__(
        self,
        op: str,
        rank: int,
        group_rank: int,
        fingerprint: tuple[tuple[str, Any], ...],
        site: str,
        payload: dict[str, Any],
        inference: bool = False,
    ) -> None:
        self.op = op
        self.rank = rank
        self.group_rank = group_rank
        self.fingerprint = fingerprint
        self.site = site
        self.payload = payload
        self.inference = inference  # an inference tensor is written: complete in inference mode
        self.record: Any = None  # the flight recorder's entry
        self.injected: BaseException | None = None  # a fault that fails the whole call


class Waitable:
    """Something a rank can wait on: a collective instance or a P2P operation."""

    done: bool = False
    error: SimulationError | BaseException | None = None

    def needed_ranks(self) -> Sequence[int]:
        """Global ranks that must still act for this to complete."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class PendingCollective(Waitable):
    def __init__(self, group: GroupInfo, seq: int) -> None:
        self.group = group
        self.seq = seq
        self.calls: dict[int, Call] = {}
        self.done = False
        self.error = None
        self.completing = False

    def needed_ranks(self) -> Sequence[int]:
        if self.completing or self.done:
            return ()
        return [r for i, r in enumerate(self.group.ranks) if i not in self.calls]

    def describe(self) -> str:
        ops = sorted({c.op for c in self.calls.values()})
        return f"{'/'.join(ops)} on {self.group.describe()} seq {self.seq}"


@dataclass(eq=False)
class P2POp(Waitable):
    kind: str  # "send" or "recv"
    group: GroupInfo
    src: int  # global ranks
    dst: int
    tag: int
    tensor: Any
    site: str
    done: bool = False
    error: BaseException | None = None
    record: Any = None  # the flight recorder's entry

    def needed_ranks(self) -> Sequence[int]:
        if self.done:
            return ()
        return [self.dst if self.kind == "send" else self.src]

    def describe(self) -> str:
        if self.kind == "send":
            return f"send to rank {self.dst} (tag {self.tag}) on {self.group.describe()}"
        return f"recv from rank {self.src} (tag {self.tag}) on {self.group.describe()}"


class _Parker:
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


class ThreadExit(Waitable):
    """A wait for threads of the waiter's own rank to end (a join of a helper
    thread, or a rank's end waiting for its helpers): only that rank's other
    threads can complete it."""

    def __init__(self, rank: int, what: str) -> None:
        self.rank = rank
        self.what = what
        self.done = False
        self.error = None

    def needed_ranks(self) -> Sequence[int]:
        return () if self.done else (self.rank,)

    def describe(self) -> str:
        return self.what


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
    parker: _Parker = field(default_factory=_Parker)
    interrupt: BaseException | None = None
    joiners: list = field(default_factory=list)  # ThreadExit waits on this thread
    # A ThreadPoolExecutor worker between work items blocks on the pool's
    # queue: blocked, though not in simdist. Its executor (a weak reference).
    idle: bool = False
    executor: Any = None


@dataclass
class _RankSlot:
    state: RankState = RankState.RUNNING
    waiting_on: Waitable | None = None
    thread_id: int | None = None
    parker: _Parker = field(default_factory=_Parker)
    # An error for this rank alone (a deadlock it is part of, a failed peer it
    # waits on), raised by its current or next wait.
    interrupt: BaseException | None = None
    # For a rank that has left: the rank whose failure it was or passed on
    # (itself when it failed on its own), or None when it finished.
    root_failure: int | None = None
    yielded: bool = False  # gave up the run token in its current wait
    failure: str = ""  # "Type: message" of a rank that failed on its own
    helpers: list = field(default_factory=list)  # live HelperSlots
    helpers_done: list = field(default_factory=list)  # ThreadExit waits for non-daemon helpers
    queued_items: int = 0  # pool work items submitted by the rank, not yet started


def consequence_origin(exc: BaseException, rank: int) -> int | None:
    """The failed rank ``exc`` is a consequence of, or None when ``rank``
    raised it on its own.

    simdist marks the errors it delivers because of another rank
    (``PeerFailedError``, a communicator aborted elsewhere) with
    ``simdist_origin``; a body may wrap them (``raise X from err``) or raise
    while handling them, so the whole cause/context chain is searched.
    """
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        origin = getattr(e, "simdist_origin", None)
        if origin is not None and origin != rank:
            return origin
        todo += [e.__cause__, e.__context__]
    return None


class Scheduler:
    """The matching state of one simulated world."""

    # Wake the members of a finished collective one at a time (see
    # _pass_baton_locked); a class switch so benchmarks can compare.
    defer_wakeups = True

    def __init__(
        self,
        world_size: int,
        describe_rank: Callable[[int], str],
        on_done: Callable[[Waitable], None] = lambda w: None,
        policy: Policy | None = None,
        on_resume: Callable[[int], None] = lambda rank: None,
        on_yield: Callable[[], None] = lambda: None,
    ) -> None:
        self.world_size = world_size
        self._poll_s = max(_POLL_S, world_size / _MAX_POLLS_PER_S)
        # The run token : with a policy, only
        # the holder executes; None runs every rank at once.
        self._policy = policy
        self._on_resume = on_resume
        self._on_yield = on_yield  # after giving up the token (see rank_state)
        self._holder: int | None = None
        # The first holder, given the token by ``begin``: a rank that ran while
        # the caller still starts threads would make every later start wait
        # for the GIL (a switch interval, 5 ms, per thread).
        self._first: int | None = None
        if policy is not None:
            for r in range(world_size):
                policy.push(r)
            self._first = policy.pick(lambda r: True)
        self.switches = 0
        self._describe_rank = describe_rank
        self._on_done = on_done
        self._lock = threading.Lock()
        self._slots = [_RankSlot() for _ in range(world_size)]
        self._running = world_size
        self._gone: set[int] = set()  # ranks that finished or failed
        self._ready: deque[int] = deque()  # runnable ranks whose wake-up is deferred
        self._pending: dict[tuple[str, int], PendingCollective] = {}
        # Indexes for the deadlock check when a rank leaves, so it looks only
        # at calls that may need that rank (not at every waiting rank, which
        # would make a 4096-rank run quadratic): the incomplete collectives of
        # each group by sequence number, each rank's groups (with its index
        # in them), and the P2P channels that wait on each rank.
        self._open: dict[str, dict[int, PendingCollective]] = {}
        self._groups_of: dict[int, list[tuple[GroupInfo, int]]] = {}
        self._p2p_on: dict[int, set[tuple[str, int, int, int]]] = {}
        # P2P channels: (group name, src, dst, tag) -> unmatched sends / recvs.
        self._sends: dict[tuple[str, int, int, int], deque[P2POp]] = {}
        self._recvs: dict[tuple[str, int, int, int], deque[P2POp]] = {}
        # A world-wide abort (watchdog, Ctrl-C): every wait raises it.
        self._abort: BaseException | None = None
        self._abort_event = threading.Event()
        # Aborted communicators: checked under the lock, so a call entering an
        # aborted group can never start a pending call nobody will complete.
        self._aborted_groups: dict[str, BaseException] = {}
        # Ranks that raised out of their body because of another rank's failure.
        self.released: set[int] = set()
        # simdist errors raised inside ranks (deadlocks, mismatches, injected
        # crashes), in the order they happened: run() reports them even when
        # every rank caught them.
        self.recorded: list[tuple[int, BaseException]] = []
        self.deadlock: DeadlockError | None = None
        # Set once the run is over: any later call on this world raises this.
        self.closed: str | None = None
        self._closed_error: BaseException | None = None
        self._helper_waits = 0  # helper threads waiting right now

    # -- helper threads -----------------------------------------------------

    def add_helper(self, rank: int, name: str, daemon: bool, executor: Any = None) -> HelperSlot:
        """A thread of ``rank`` starts a helper (called before it starts, so
        the rank never looks blocked in between); ``executor`` for a pool
        worker, idle until it starts a work item."""
        helper = HelperSlot(name, daemon, idle=executor is not None, executor=executor)
        with self._lock:
            self._slots[rank].helpers.append(helper)
        return helper

    def bind_helper(self, helper: HelperSlot) -> None:
        helper.thread_id = threading.get_ident()

    def remove_helper(self, rank: int, helper: HelperSlot) -> None:
        """A helper thread ends: its joiners complete, and its rank may now be blocked."""
        with self._lock:
            slot = self._slots[rank]
            if helper in slot.helpers:
                slot.helpers.remove(helper)
            if helper.waiting_on is not None:
                helper.waiting_on = None
                self._helper_waits -= 1
            for waitable in helper.joiners:
                waitable.done = True
                self._wake_locked(rank, waitable)
            if not any(not h.daemon for h in slot.helpers):
                for waitable in slot.helpers_done:
                    waitable.done = True
                    self._wake_locked(rank, waitable)
                slot.helpers_done = []
            if self._abort is None:
                self._settle_locked(None)
                if self._policy is not None:
                    self._nothing_runnable_locked()

    def join_waitable(self, rank: int, helper: HelperSlot) -> ThreadExit:
        """A wait until ``helper`` (a thread of ``rank``) has ended."""
        waitable = ThreadExit(rank, f"join of helper thread {helper.name!r}")
        with self._lock:
            if helper in self._slots[rank].helpers:
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
            slot = self._slots[rank]
            names = [h.name for h in slot.helpers if not h.daemon]
            if not names:
                return None
            waitable = ThreadExit(rank, f"the end of helper thread(s) {names} after the body returned")
            slot.helpers_done.append(waitable)
            return waitable

    def helper_woken(self, helper: HelperSlot) -> None:
        """An idle pool worker's pool was shut down: it leaves on its own."""
        with self._lock:
            helper.idle = False

    def live_helpers(self, rank: int) -> list[HelperSlot]:
        with self._lock:
            return list(self._slots[rank].helpers)

    def item_queued(self, rank: int) -> None:
        """A thread of ``rank`` submitted a pool work item: the rank is not
        blocked while it waits to start."""
        with self._lock:
            self._slots[rank].queued_items += 1

    def item_started(self, rank: int, dropped: bool = False) -> HelperSlot | None:
        """A work item of ``rank`` starts (on the calling pool worker: its
        slot is returned), or was ``dropped`` (cancelled) before it could."""
        with self._lock:
            self._slots[rank].queued_items -= 1
            helper = None if dropped else self._helper_of(rank)
            if helper is not None:
                helper.idle = False
            elif dropped:
                self._after_helper_blocked_locked()
            return helper

    def item_finished(self, helper: HelperSlot | None) -> None:
        """The work item a pool worker ran is done (its Future is set)."""
        with self._lock:
            if helper is not None and helper.executor is not None:
                helper.idle = True
                self._after_helper_blocked_locked()

    def _after_helper_blocked_locked(self) -> None:
        if self._abort is None:
            self._settle_locked(None)
            if self._policy is not None:
                self._nothing_runnable_locked()

    def _helper_of(self, rank: int) -> HelperSlot | None:
        """The calling thread's helper slot, when it is a helper of ``rank``."""
        me = threading.get_ident()
        for helper in self._slots[rank].helpers:
            if helper.thread_id == me:
                return helper
        return None

    def _progressing(self, rank: int) -> bool:
        """Whether some thread of ``rank`` runs (its main thread, or a helper)."""
        slot = self._slots[rank]
        return slot.state is RankState.RUNNING or (
            slot.state is RankState.WAITING
            and (slot.queued_items > 0 or any(h.waiting_on is None and not h.idle for h in slot.helpers))
        )

    def _wait_helper(self, rank: int, helper: HelperSlot, waitable: Waitable) -> None:
        """A helper thread's wait: no run token to give up or take back."""
        while True:
            with self._lock:
                if helper.interrupt is not None:
                    error, helper.interrupt = helper.interrupt, None
                    raise error
                if waitable.done:
                    if helper.waiting_on is not None:
                        helper.waiting_on = None
                        self._helper_waits -= 1
                    break
                if self._abort is not None:
                    if helper.waiting_on is not None:
                        helper.waiting_on = None
                        self._helper_waits -= 1
                    raise _copy_error(self._closed_error or self._abort)
                if helper.waiting_on is None:
                    helper.waiting_on = waitable
                    self._helper_waits += 1
                    if not self._progressing(rank):
                        self._settle_locked(None)
                        if self._policy is not None and helper.interrupt is None:
                            self._nothing_runnable_locked()
                    else:
                        # Its rank runs on, but this thread alone may wait on
                        # a peer that has left.
                        self._settle_locked(None)
                    if helper.interrupt is not None:
                        continue
            helper.parker.park(_POLL_S)
        if waitable.error is not None:
            raise _copy_error(waitable.error)

    # -- rank lifecycle ---------------------------------------------------

    def bind_thread(self, rank: int) -> None:
        self._slots[rank].thread_id = threading.get_ident()

    @property
    def scheduled(self) -> bool:
        return self._policy is not None

    def queued_ranks(self) -> set[int]:
        """Scheduled: the runnable ranks that do not hold the run token."""
        if self._policy is None:
            return set()
        with self._lock:
            return {
                r for r, s in enumerate(self._slots) if s.state is RankState.RUNNING and r != self._holder
            }

    def begin(self) -> None:
        """Every rank thread has started: hand the run token to the first rank."""
        with self._lock:
            if self._first is not None and self._holder is None and self._abort is None:
                self._holder, self._first = self._first, None
                self._slots[self._holder].parker.unpark()

    def acquire(self, rank: int) -> None:
        """Block a starting rank until it holds the run token."""
        if self._policy is None:
            return
        slot = self._slots[rank]
        while True:
            with self._lock:
                if self._holder == rank or self._abort is not None:
                    break
            slot.parker.park(self._poll_s)
        self._on_resume(rank)

    def rank_finished(self, rank: int) -> None:
        with self._lock:
            self._leave(rank, RankState.FINISHED)

    def rank_failed(self, rank: int, exc: BaseException) -> None:
        """``rank`` raised out of its body: released if ``exc`` is (or was
        raised while handling) a consequence of another rank's failure, else
        a failure of its own. Only ranks that wait on it are affected."""
        origin = consequence_origin(exc, rank)
        with self._lock:
            if origin is not None:
                self.released.add(rank)
                root = self._slots[origin].root_failure
                self._slots[rank].root_failure = origin if root is None else root
            else:
                self._slots[rank].root_failure = rank
                self._slots[rank].failure = f"{type(exc).__name__}: {exc}"
            self._leave(rank, RankState.FAILED)

    def record(self, rank: int, error: BaseException) -> None:
        """Note a simdist error raised inside ``rank`` (it may be caught there)."""
        with self._lock:
            self._record_locked(rank, error)

    def _record_locked(self, rank: int, error: BaseException) -> None:
        # Only the first errors matter to the outcome; a body that catches and
        # retries forever must not grow this without bound.
        if len(self.recorded) < _MAX_RECORDED:
            self.recorded.append((rank, error))

    def abort(self, error: BaseException) -> None:
        """Abort the world (watchdog, external): every wait raises ``error``."""
        with self._lock:
            if self._abort is None:
                self._abort_locked(error)

    def close(self, error: BaseException) -> None:
        """The run is over: every later call or wait on this world raises ``error``."""
        with self._lock:
            self.closed = str(error)
            # Later calls say the run is over, even when the world had been
            # aborted earlier (watchdog, deadlock): that is what the caller needs.
            self._closed_error = error
            if self._abort is None:
                self._abort_locked(error)

    def sleep(self, seconds: float) -> None:
        """Sleep in a rank (a ``delay`` fault); an abort cuts it short."""
        if self._abort_event.wait(seconds):
            with self._lock:
                raise _copy_error(self._closed_error or self._abort)  # type: ignore[arg-type]

    @property
    def aborted(self) -> BaseException | None:
        return self._abort

    def group_aborted(self, name: str) -> BaseException | None:
        return self._aborted_groups.get(name)

    @property
    def any_group_aborted(self) -> bool:
        return bool(self._aborted_groups)

    def _leave(self, rank: int, state: RankState) -> None:
        slot = self._slots[rank]
        if slot.state in (RankState.FINISHED, RankState.FAILED):
            return
        if slot.state is RankState.RUNNING:
            self._running -= 1
        slot.state = state
        self._gone.add(rank)
        slot.waiting_on = None
        slot.interrupt = None
        if self._policy is None:
            self._pass_baton_locked()
            self._settle_locked(None, left=rank)
        elif self._abort is None:
            self._settle_locked(None, left=rank)
            self._nothing_runnable_locked()
            if self._holder == rank:
                self._hand_token_locked()

    # -- collectives ------------------------------------------------------

    def join_collective(
        self,
        group: GroupInfo,
        seq: int,
        call: Call,
        complete: Callable[[list[Call]], None],
        verify: Callable[[GroupInfo, int, list[Call]], None],
    ) -> PendingCollective:
        """Add this rank's call; the last member to join runs ``complete``."""
        key = (group.name, seq)
        with self._lock:
            if self._abort is not None:  # _raise_if_aborted's own test, kept off the hot path
                self._raise_if_aborted(call.rank)
            if group.name in self._aborted_groups:
                raise _copy_error(self._aborted_groups[group.name])
            pending = self._pending.get(key)
            if pending is None:
                pending = PendingCollective(group, seq)
                self._pending[key] = pending
                open_ = self._open.get(group.name)
                if open_ is None:  # the group's first call: index its members once
                    open_ = self._open[group.name] = {}
                    for i, member in enumerate(group.ranks):
                        self._groups_of.setdefault(member, []).append((group, i))
                open_[seq] = pending
            if call.group_rank in pending.calls:
                raise SimulationError(f"internal: rank {call.rank} joined {pending.describe()} twice")
            pending.calls[call.group_rank] = call
            if len(pending.calls) < len(group.ranks):
                # A peer that has already left is noticed when this rank waits.
                return pending
            pending.completing = True
            del self._pending[key]
            del self._open[group.name][seq]
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
                    self._record_locked(r, error)
            pending.error = error
            pending.done = True
            self._on_done(pending)
            first = True
            for r in group.ranks:
                if r != call.rank:
                    self._wake_locked(r, pending, now=first or not self.defer_wakeups)
                    first = False
        return pending

    # -- point to point ---------------------------------------------------

    def post_p2p(self, op: P2POp, deliver: Callable[[P2POp, P2POp], None]) -> None:
        """Post a send or a recv; match it with the oldest opposite one."""
        key = (op.group.name, op.src, op.dst, op.tag)
        me = op.src if op.kind == "send" else op.dst
        with self._lock:
            self._raise_if_aborted(me)
            if op.group.name in self._aborted_groups:
                raise _copy_error(self._aborted_groups[op.group.name])
            mine, theirs = (self._sends, self._recvs) if op.kind == "send" else (self._recvs, self._sends)
            queue = theirs.get(key)
            if not queue:
                mine.setdefault(key, deque()).append(op)
                self._p2p_on.setdefault(op.dst if op.kind == "send" else op.src, set()).add(key)
                return
            other = queue.popleft()
            send, recv = (op, other) if op.kind == "send" else (other, op)
            try:
                deliver(send, recv)
            except BaseException as exc:
                send.error = recv.error = exc
                if isinstance(exc, SimulationError):
                    self._record_locked(send.src, exc)
                    self._record_locked(recv.dst, exc)
            send.done = recv.done = True
            self._on_done(send)
            self._on_done(recv)
            self._wake_locked(other.src if other.kind == "send" else other.dst, other)

    def complete(self, rank: int, waitable: Waitable) -> None:
        """Mark a wait of ``rank`` outside collectives and P2P (a store key) done."""
        with self._lock:
            waitable.done = True
            self._wake_locked(rank, waitable)

    def fail_group(self, name: str, error: BaseException) -> None:
        """Fail every pending and later call on communicator ``name`` (an abort)."""
        with self._lock:
            self._aborted_groups.setdefault(name, error)
            for key in [k for k in self._pending if k[0] == name]:
                pending = self._pending.pop(key)
                self._open[name].pop(key[1], None)
                pending.error, pending.done = error, True
                self._on_done(pending)
                for r in pending.group.ranks:
                    self._wake_locked(r, pending)
            for table in (self._sends, self._recvs):
                for key in [k for k in table if k[0] == name]:
                    for op in table.pop(key):
                        op.error, op.done = error, True
                        self._on_done(op)
                        self._wake_locked(op.src if op.kind == "send" else op.dst, op)

    # -- waiting ----------------------------------------------------------

    def wait(self, rank: int, waitable: Waitable) -> None:
        """Block ``rank`` until ``waitable`` is done; raise its error if any."""
        slot = self._slots[rank]
        if slot.helpers and slot.thread_id != threading.get_ident():
            helper = self._helper_of(rank)
            if helper is not None:
                self._wait_helper(rank, helper, waitable)
                return
        try:
            self._wait(rank, slot, waitable)
        finally:
            if slot.yielded:
                slot.yielded = False
                self._on_resume(rank)
        if waitable.error is not None:
            raise _copy_error(waitable.error)

    def _wait(self, rank: int, slot: _RankSlot, waitable: Waitable) -> None:
        settle_pending = False
        scheduled = self._policy is not None
        gave_up = False
        while True:
            with self._lock:
                if slot.yielded and self._holder != rank and self._abort is None:
                    pass  # runnable or still waiting, but not this rank's turn
                elif slot.interrupt is not None:
                    error, slot.interrupt = slot.interrupt, None
                    raise error
                elif waitable.done:
                    if slot.state is RankState.WAITING:
                        slot.state = RankState.RUNNING
                        slot.waiting_on = None
                        self._running += 1
                    return
                elif self._abort is not None:
                    self._raise_if_aborted(rank)
                elif settle_pending:
                    settle_pending = False
                    self._settle_locked(rank, defer=False)
                    if slot.interrupt is not None:
                        continue
                elif slot.state is RankState.RUNNING:
                    slot.state = RankState.WAITING
                    slot.waiting_on = waitable
                    self._running -= 1
                    # Scheduled, the walk is never deferred: when it runs must
                    # not depend on timing.
                    settle_pending = self._settle_locked(rank, defer=not scheduled)
                    if scheduled and slot.interrupt is None:
                        self._nothing_runnable_locked()
                    if slot.interrupt is not None:
                        continue  # this rank can never complete: raise on the next pass
                    if scheduled:
                        slot.yielded = gave_up = True
                        self._hand_token_locked()
                    else:
                        self._pass_baton_locked()
            if gave_up:
                gave_up = False
                self._on_yield()
            slot.parker.park(_SETTLE_AFTER_S if settle_pending else self._poll_s)

    def _wake_locked(self, rank: int, waitable: Waitable, now: bool = True) -> None:
        """Make ``rank`` runnable. With ``now=False`` the OS wake-up is deferred
        to the next rank that parks or leaves (see ``_pass_baton_locked``)."""
        slot = self._slots[rank]
        if slot.state is RankState.WAITING and slot.waiting_on is waitable:
            slot.state = RankState.RUNNING
            slot.waiting_on = None
            self._running += 1
            if self._policy is not None:
                self._policy.push(rank)
                if self._holder is None and self._first is None:  # never lose the token
                    self._hand_token_locked()
            elif now:
                slot.parker.unpark()
            else:
                self._ready.append(rank)
        elif slot.helpers:
            for helper in slot.helpers:
                if helper.waiting_on is waitable:
                    helper.waiting_on = None
                    self._helper_waits -= 1
                    helper.parker.unpark()

    def _pass_baton_locked(self) -> None:
        """Wake one deferred rank: called by a rank about to park or leave.

        Waking every member of a finished collective at once makes them all
        fight for the GIL (each handoff is an OS wake-up); waking one now and
        the rest one by one as others block keeps about two runnable threads,
        one per core, which is several times faster at 8+ ranks.
        """
        if self._ready:
            self._slots[self._ready.popleft()].parker.unpark()

    def _hand_token_locked(self) -> None:
        """The holder blocked or left: give the token to the policy's pick."""
        slots = self._slots
        self._holder = self._policy.pick(  # type: ignore[union-attr]
            lambda r: slots[r].state is RankState.RUNNING
        )
        if self._holder is not None:
            self.switches += 1
            slots[self._holder].parker.unpark()

    def _nothing_runnable_locked(self) -> None:
        """Scheduled, a rank that waits while no rank can run waits forever,
        whatever it waits for (a store key, say, which the wait-for graph
        cannot attribute to a rank)."""
        if self._running > 0 or self._abort is not None:
            return
        stuck = [r for r, s in enumerate(self._slots) if s.state is RankState.WAITING]
        if not stuck or any(self._progressing(r) for r in stuck):
            return  # a helper thread still runs
        if any(
            isinstance(self._slots[r].waiting_on, ThreadExit) and not self._slots[r].waiting_on.needed_ranks()
            for r in stuck
        ):  # type: ignore[union-attr]
            return  # a Future is done, its callbacks are about to wake the waiter
        error = DeadlockError(
            self.report(
                "deadlock: every live rank is waiting and none can run; rank(s) "
                f"{stuck} wait for something no rank will ever do"
            )
        )
        if self.deadlock is None:
            self.deadlock = error
        for r in stuck:
            self._record_locked(r, error)
            self._interrupt_locked(r, _copy_error(error))

    def _raise_if_aborted(self, rank: int) -> None:
        if self._abort is None:
            return
        slot = self._slots[rank]
        if slot.state is RankState.WAITING:
            slot.state = RankState.RUNNING
            slot.waiting_on = None
            self._running += 1
        raise _copy_error(self._closed_error or self._abort)

    def _abort_locked(self, error: BaseException) -> None:
        self._abort = error
        self._abort_event.set()
        for slot in self._slots:
            slot.parker.unpark()
            for helper in slot.helpers:
                helper.parker.unpark()

    # -- deadlock detection -----------------------------------------------

    def _settle_locked(self, trigger: int | None, defer: bool = False, left: int | None = None) -> bool:
        """Find the waiting ranks that can never complete; interrupt each.

        ``trigger`` is a rank that has just started waiting (only a closed set
        containing it can be new), or None after rank ``left`` left (only ranks
        that need it, directly or not, can be newly stuck). With ``defer``,
        a walk of the graph is not done now: returns True when it is needed
        (the caller runs it again shortly, if ``trigger`` still waits).
        """
        slots = self._slots
        if self._abort is not None:
            return False
        if trigger is not None:
            # The common case, kept O(group size): every rank it needs runs.
            needed = slots[trigger].waiting_on.needed_ranks()  # type: ignore[union-attr]
            if all(slots[p].state is RankState.RUNNING or self._progressing(p) for p in needed):
                return False
            # A peer that has left: certain at once, no walk needed to know it.
            if defer and not any(p in self._gone for p in needed):
                return True
            waits = self._waiting_graph_from(trigger)
            lone = [trigger] if slots[trigger].helpers else []
        elif self.world_size - self._running - len(self._gone) == 0 and not self._helper_waits:
            return False  # nobody waits
        elif left is not None and not self._helper_waits:
            # Only main threads wait: the ranks that need the one that left
            # are found through the indexes, not by scanning every rank.
            waits = {}
            for r in self._waiting_on_closure_locked(left):
                if r not in waits:
                    waits.update(self._waiting_graph_from(r))
            if not waits:
                return False
            lone = []
        else:
            waits = {
                r: self._thread_waits(r)
                for r, s in enumerate(slots)
                if s.state is RankState.WAITING and not self._progressing(r)
            }
            lone = [r for r, s in enumerate(slots) if s.helpers and r not in waits]
        # One list per rank: the ranks any of its threads needs (what reports show).
        graph = {r: sorted({p for needed in lists for p in needed}) for r, lists in waits.items()}
        stuck = cannot_complete_threads(waits, self._progressing)
        if lone:
            self._settle_threads_locked(lone, stuck)
        if not stuck:
            return False
        roots = self._failed_roots(graph, stuck)
        why = {r: f"which failed with {slots[roots[r]].failure}" for r in stuck if roots[r] is not None}
        deadlocked = {r for r in stuck if roots[r] is None}
        # The core of a deadlock (ranks on a cycle, or waiting on a rank that
        # has finished) is the same whatever the timing; ranks that merely
        # wait on the core are released by it, as they would be had they
        # arrived after the core was reported.
        core = sorted(
            r for r in deadlocked if on_cycle(graph, r, deadlocked) or any(p in self._gone for p in graph[r])
        )
        for r in sorted(deadlocked - set(core)):
            roots[r] = next(c for c in reachable(graph, r, deadlocked) if c in core)
            why[r] = "which is deadlocked"
        if core:
            headline = deadlock_headline(graph, core, self._gone, all_wait=self._running == 0)
            error = DeadlockError(self.report(headline))
            if self.deadlock is None:
                self.deadlock = error
            for r in core:
                self._record_locked(r, error)
                self._interrupt_locked(r, _copy_error(error))
        for r in sorted(why):
            root = roots[r]
            assert root is not None
            released = PeerFailedError(
                f"released: rank {r} ({self._describe_rank(r)}) waits in "
                f"{slots[r].waiting_on.describe()}, which needs rank {root} "  # type: ignore[union-attr]
                f"({self._describe_rank(root)}), {why[r]}"
            )
            released.simdist_origin = root  # type: ignore[attr-defined]
            self._interrupt_locked(r, released)
        return False

    def _waiters_on_locked(self, rank: int) -> list[int]:
        """The waiting ranks whose call needs ``rank`` (found through the
        indexes: the open collectives of its groups it has not joined, the
        P2P operations whose peer it is)."""
        slots = self._slots
        out: list[int] = []
        for group, index in self._groups_of.get(rank, ()):
            for pending in self._open.get(group.name, {}).values():
                if index in pending.calls or pending.completing or pending.done:
                    continue
                for call in pending.calls.values():
                    s = slots[call.rank]
                    if s.state is RankState.WAITING and s.waiting_on is pending:
                        out.append(call.rank)
        for key in self._p2p_on.get(rank, ()):
            for table, kind in ((self._sends, "send"), (self._recvs, "recv")):
                for op in table.get(key, ()):
                    if rank in op.needed_ranks():
                        owner = op.src if kind == "send" else op.dst
                        if slots[owner].state is RankState.WAITING and slots[owner].waiting_on is op:
                            out.append(owner)
        return out

    def _waiting_on_closure_locked(self, rank: int) -> set[int]:
        """The waiting ranks that need ``rank``, directly or through other waiting ranks."""
        seen: set[int] = set()
        todo = [rank]
        while todo:
            for w in self._waiters_on_locked(todo.pop()):
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        return seen

    def _waiting_graph_from(self, start: int) -> dict[int, list[list[int]]]:
        """The blocked ranks reachable from ``start`` through needed ranks,
        each with what every one of its threads needs."""
        waits: dict[int, list[list[int]]] = {}
        todo = [start]
        while todo:
            r = todo.pop()
            if r in waits or self._progressing(r):
                continue
            lists = self._thread_waits(r)
            waits[r] = lists
            todo += [p for needed in lists for p in needed if self._slots[p].state is RankState.WAITING]
        return waits

    def _thread_waits(self, rank: int) -> list[list[int]]:
        """What each waiting thread of ``rank`` needs, its main thread first."""
        slot = self._slots[rank]
        lists = []
        if slot.state is RankState.WAITING and slot.waiting_on is not None:
            lists.append(list(slot.waiting_on.needed_ranks()))
        lists += [list(h.waiting_on.needed_ranks()) for h in slot.helpers if h.waiting_on is not None]
        return lists

    def _settle_threads_locked(self, ranks: list[int], stuck: set[int]) -> None:
        """Ranks that still run (a helper or the main thread does) may have
        single threads that can never complete: waiting on a peer that has
        left or on a closed set of blocked ranks. Only those threads hear it."""
        for r in ranks:
            slot = self._slots[r]
            threads: list[tuple[HelperSlot | None, Waitable]] = []
            if slot.state is RankState.WAITING and slot.waiting_on is not None:
                threads.append((None, slot.waiting_on))
            threads += [(h, h.waiting_on) for h in slot.helpers if h.waiting_on is not None]
            for helper, waitable in threads:
                bad = sorted(p for p in waitable.needed_ranks() if p != r and (p in stuck or p in self._gone))
                if not bad:
                    continue
                failed = [p for p in bad if self._slots[p].state is RankState.FAILED]
                who = "its main thread" if helper is None else f"its helper thread {helper.name!r}"
                if failed:
                    root = self._slots[failed[0]].root_failure
                    root = failed[0] if root is None else root
                    error: BaseException = PeerFailedError(
                        f"released: rank {r} ({self._describe_rank(r)}), {who}, waits in "
                        f"{waitable.describe()}, which needs rank {root} "
                        f"({self._describe_rank(root)}), which failed with {self._slots[root].failure}"
                    )
                    error.simdist_origin = root  # type: ignore[attr-defined]
                else:
                    error = DeadlockError(
                        self.report(
                            f"deadlock: rank {r}, {who}, waits in {waitable.describe()}, which needs "
                            f"rank(s) {bad}: finished, or blocked for good"
                        )
                    )
                    if self.deadlock is None:
                        self.deadlock = error
                    self._record_locked(r, error)
                self._interrupt_thread_locked(r, helper, error)

    def _interrupt_thread_locked(self, rank: int, helper: HelperSlot | None, error: BaseException) -> None:
        if helper is None:
            slot = self._slots[rank]
            slot.state = RankState.RUNNING
            slot.waiting_on = None
            self._running += 1
            if self._policy is not None:
                self._policy.push(rank)
                if self._holder is None:  # found from a helper thread, the token idle
                    self._hand_token_locked()
            slot.interrupt = error
            slot.parker.unpark()
            return
        if helper.waiting_on is not None:
            helper.waiting_on = None
            self._helper_waits -= 1
        helper.interrupt = error
        helper.parker.unpark()

    def _failed_roots(self, graph: dict[int, list[int]], stuck: set[int]) -> dict[int, int | None]:
        """For each stuck rank, the failed rank it waits on (transitively), if any."""
        roots: dict[int, int | None] = {}

        def root_of(r: int, path: set[int]) -> int | None:
            if r in roots:
                return roots[r]
            path.add(r)
            found: int | None = None
            for p in sorted(graph[r]):
                slot = self._slots[p]
                if slot.state is RankState.FAILED:
                    found = slot.root_failure
                elif p in stuck and p not in path:
                    found = root_of(p, path)
                if found is not None:
                    break
            path.discard(r)
            roots[r] = found
            return found

        for r in sorted(stuck):
            root_of(r, set())
        return roots

    def _interrupt_locked(self, rank: int, error: BaseException) -> None:
        slot = self._slots[rank]
        if slot.state is RankState.WAITING:
            slot.state = RankState.RUNNING
            slot.waiting_on = None
            self._running += 1
            if self._policy is not None:
                self._policy.push(rank)
        slot.interrupt = error
        if self._policy is not None and self._holder is None:
            self._hand_token_locked()  # found from a helper thread, the token idle
        slot.parker.unpark()
        # Every thread of a rank that can never complete is stuck too.
        for helper in slot.helpers:
            if helper.waiting_on is not None:
                self._interrupt_thread_locked(rank, helper, _copy_error(error))

    def report(self, headline: str) -> str:
        """Every rank's state, pending call and user stack (call with the lock held)."""
        frames = sys._current_frames()
        lines = [headline]
        for rank, slot in enumerate(self._slots):
            where = self._describe_rank(rank)
            if slot.state is RankState.WAITING and slot.waiting_on is not None:
                w = slot.waiting_on
                needed = list(w.needed_ranks())
                lines.append(
                    f"  rank {rank} ({where}): waiting in {w.describe()}"
                    + (f"; still missing rank(s) {needed}" if needed else "")
                )
                frame = frames.get(slot.thread_id) if slot.thread_id is not None else None
                lines.extend("      " + s for s in stacks.user_stack(frame))
            else:
                lines.append(f"  rank {rank} ({where}): {slot.state.value}")
            for helper in slot.helpers:
                w = helper.waiting_on
                lines.append(
                    f"    helper thread {helper.name!r}: "
                    + ("running" if w is None else f"waiting in {w.describe()}")
                )
                if w is not None:
                    frame = frames.get(helper.thread_id) if helper.thread_id is not None else None
                    lines.extend("        " + s for s in stacks.user_stack(frame))
        unmatched = [op for q in list(self._sends.values()) + list(self._recvs.values()) for op in q]
        if unmatched:
            lines.append("  unmatched point-to-point operations:")
            lines.extend(
                f"    rank {op.src if op.kind == 'send' else op.dst}: {op.describe()} at {op.site}"
                for op in unmatched
            )
        return "\n".join(lines)

    def leftovers(self) -> str | None:
        """After every rank has left: calls that never completed, or None."""
        with self._lock:
            items = [
                f"  {p.describe()}: joined by group ranks {sorted(p.calls)}" for p in self._pending.values()
            ]
            items += [
                f"  rank {op.src}: {op.describe()} at {op.site}" for q in self._sends.values() for op in q
            ]
            items += [
                f"  rank {op.dst}: {op.describe()} at {op.site}" for q in self._recvs.values() for op in q
            ]
        if not items:
            return None
        return "calls that were issued but never completed:\n" + "\n".join(items)


def _copy_error(error: BaseException) -> BaseException:
    """A fresh instance per rank, so tracebacks of different threads don't mix."""
    try:
        fresh = type(error)(*error.args)
    except Exception:
        return error
    fresh.__cause__ = error.__cause__
    fresh.__dict__.update(getattr(error, "__dict__", {}))
    return fresh
