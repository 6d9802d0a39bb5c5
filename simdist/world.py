"""``simdist.run``: one thread per rank, joined before returning, errors gathered.

Structured like a nursery: every thread started here is joined (or, for a rank
stuck in plain compute past the watchdog, interrupted and then joined) before
``run`` returns or raises, and the first failure is never swallowed.
"""

from __future__ import annotations

import copy
import ctypes
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from . import c10d_state, comm_stats, helpers, stacks
from ._backend.group import SimGroup
from ._backend.hooks import CallHooks
from .backend import BACKEND_NAME, bind_current, register_backend
from .context import RankContext, build_groups
from .errors import (
    CollectiveMismatchError,
    DeadlockError,
    RankError,
    SimulationError,
    SimulationTimeout,
)
from .faults import FaultPlan, FaultState
from .layout import Layout
from .policy import make_policy
from .rank_state import RankStates, release_process, resume_process, suspend_process
from .reduction import ReductionModel, make_model
from .rendezvous import GroupInfo, PendingCollective, Scheduler, Waitable
from .spawn import TreeStart
from .store import RankStore
from .trace import DEFAULT_RECORDS, Recorder

DEFAULT_TIMEOUT_S = 300.0
# After the watchdog interrupts stuck ranks, how long to wait for them to unwind.
_GRACE_S = 5.0
# A rank's own clean-up (stopping its helpers) ends this long before the
# watchdog's deadline, so the rank's outcome is reported, not a timeout.
_GRACE_MARGIN_S = 0.25


class World(CallHooks):
    """The shared state of one simulation (implements ``backend.WorldHooks``;
    its per-call hooks are ``_backend.hooks.CallHooks``)."""

    def __init__(
        self,
        layout: Layout | None,
        world_size: int,
        reduction: ReductionModel,
        timeout: float,
        faults: FaultPlan | None = None,
        keep_trace: bool = False,
        flight_records: int = DEFAULT_RECORDS,
        schedule: str = "rank",
        schedule_seed: int = 0,
        rank_local: Sequence[Any] = (),
        strict_call_sites: bool = False,
    ) -> None:
        self.layout = layout
        self.strict_call_sites = strict_call_sites
        self.run_name = ""
        self.world_size = world_size
        self.reduction = reduction
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout  # the watchdog's; run() sets it from its call
        self.recorder = Recorder(world_size, keep=flight_records, keep_all=keep_trace)
        self.faults = FaultState(faults, layout, world_size) if faults else None
        policy = make_policy(schedule, schedule_seed)
        if policy is None and rank_local:
            raise ValueError(
                "rank_local needs a scheduled run (schedule='rank' or 'random'): "
                "with schedule='concurrent' every rank runs at once, so "
                "process-wide values cannot belong to one rank at a time"
            )
        # Unscheduled, every rank shares the process's state as it always did.
        self.states = RankStates(world_size, rank_local) if policy is not None else None
        try:
            self.scheduler = Scheduler(
                world_size,
                self.describe_rank,
                self._on_done,
                policy,
                self._resume if self.states else lambda rank: None,
                release_process,
            )
            self.store = RankStore(self.scheduler) if policy is not None else dist.HashStore()
            self.store.set_timeout(timedelta(seconds=timeout))
        except BaseException:
            # run() never gets to restore them: undo what RankStates set up
            # (its import hook for modules first imported during a run).
            if self.states is not None:
                self.states.restore_caller()
            raise
        self._groups: dict[str, SimGroup] = {}
        self._groups_lock = threading.Lock()
        # The world group's global -> group rank map, the identity: one for
        # every rank instead of a copy each (O(world) memory per rank).
        self.world_rank_map = {r: r for r in range(world_size)}
        # Exceptions that escaped a rank's helper threads, per rank: the rank
        # fails with the first once its body has returned (never swallowed).
        self.helper_failures: dict[int, list[tuple[str, BaseException]]] = {}

    def helper_failed(self, rank: int, name: str, exc: BaseException) -> None:
        with self._groups_lock:
            self.helper_failures.setdefault(rank, []).append((name, exc))

    def _resume(self, rank: int) -> None:
        assert self.states is not None
        self.states.switch_to(rank, lambda: self.scheduler.aborted)

    def describe_rank(self, rank: int) -> str:
        if self.layout is None:
            return f"rank {rank} of {self.world_size}"
        c = self.layout.coords(rank)
        return f"tp={c.tp} cp={c.cp} dp={c.dp} pp={c.pp}"

    # -- groups -------------------------------------------------------------

    def register_group(self, name: str, ranks: tuple[int, ...], rank: int) -> GroupInfo:
        with self._groups_lock:
            info = self._groups.get(name)
            if info is None:
                label = "world" if ranks == tuple(range(self.world_size)) and name == "0" else f"group {name}"
                info = SimGroup(name, ranks, label, run=self.run_name)
                self._groups[name] = info
            elif info.ranks != ranks:
                error = CollectiveMismatchError(
                    f"rank {rank} created group {name!r} with ranks {list(ranks)}, but a peer "
                    f"created it with ranks {list(info.ranks)}: every member must call "
                    f"new_group with the same ranks, in the same order"
                )
                self.scheduler.record(rank, error)
                raise error
            return info

    def label_group(self, name: str, label: str) -> None:
        with self._groups_lock:
            self._groups[name].relabel(label)

    def _on_done(self, waitable: Waitable) -> None:
        failed = waitable.error is not None
        if isinstance(waitable, PendingCollective):
            for call in waitable.calls.values():
                Recorder.finish(call.record, failed)
        else:
            Recorder.finish(getattr(waitable, "record", None), failed)


def _resolve_world(layout: Layout | None, world_size: int | None) -> tuple[Layout | None, int]:
    if layout is not None and not isinstance(layout, Layout):
        raise TypeError(f"layout must be a simdist.Layout, got {type(layout).__name__}")
    if layout is None:
        if world_size is None:
            raise ValueError("run() needs layout=Layout(...) or world_size=N")
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        return None, world_size
    if world_size is not None and world_size != layout.world_size:
        raise ValueError(
            f"world_size={world_size!r} disagrees with {layout} (world size {layout.world_size})"
        )
    return layout, int(layout.world_size)  # type: ignore[arg-type]


def _resolve_device(device: str | torch.device, rank: int) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for, but torch.cuda.is_available() is False")
        if dev.index is None:
            return torch.device("cuda", rank % torch.cuda.device_count())
    return dev


def run(
    fn: Callable[..., Any],
    *,
    layout: Layout | None = None,
    world_size: int | None = None,
    device: str | torch.device = "cpu",
    timeout: float = DEFAULT_TIMEOUT_S,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    reduction: str | ReductionModel = "rank",
    seed: int = 0,
    faults: FaultPlan | None = None,
    trace: str | os.PathLike[str] | None = None,
    flight_records: int = DEFAULT_RECORDS,
    attempt: int = 0,
    schedule: str = "rank",
    schedule_seed: int | None = None,
    rank_local: Sequence[Any] = (),
    share_args: bool = False,
    strict_call_sites: bool = False,
) -> list[Any]:
    """Run ``fn(ctx, *args, **kwargs)`` once per rank, each rank in its own thread.

    Returns the per-rank results, indexed by global rank. Raises ``RankError``
    when a rank raised (``__cause__`` is the lowest failed rank's error),
    ``DeadlockError`` when some waiting ranks could never complete,
    ``CollectiveMismatchError`` when members of a group called different
    collectives (both even if every rank caught them), ``SimulationTimeout``
    when ranks were still running after ``timeout`` seconds.

    ``reduction`` picks the reduction-order model ("rank", "ring", "tree",
    "shuffled" seeded by ``seed``); ``faults`` injects a ``FaultPlan``;
    ``trace`` writes a Chrome/Perfetto trace of every call to that path;
    ``flight_records`` is how many recent calls per rank errors quote.

    One rank runs at a time: it holds the run token until it blocks in simdist
    (a collective, P2P or store wait) or returns; ``schedule`` picks who runs
    next: "rank" (the lowest runnable rank), "random" (seeded by
    ``schedule_seed``, default ``seed``), or "concurrent" (every rank at once,
    no per-rank process state). Scheduled, each rank has its own torch,
    ``random`` and numpy generator state and its own copy of every
    ``rank_local`` entry (a module, its name, or an ``(object, "attr")`` pair),
    all starting from their values at run start and put back when it ends.
    ``args``/``kwargs`` reach each rank as its own deep copy, as with processes,
    unless ``share_args=True`` (large read-only inputs, or deliberate sharing).
    ``strict_call_sites=True`` makes members that meet at one sequence number
    from different call sites a ``CollectiveMismatchError``.
    """
    # The watchdog's clock starts now: building inputs and starting threads count.
    called_at = time.monotonic()
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    layout, n = _resolve_world(layout, world_size)
    if (
        not isinstance(timeout, (int, float))
        or isinstance(timeout, bool)
        or not (timeout > 0 and math.isfinite(timeout))
    ):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    kwargs = dict(kwargs or {})
    devices = [_resolve_device(device, r) for r in range(n)]
    if faults is not None and not isinstance(faults, FaultPlan):
        raise TypeError(f"faults must be a simdist.FaultPlan, got {type(faults).__name__}")
    if isinstance(flight_records, bool) or not isinstance(flight_records, int) or flight_records < 1:
        raise ValueError(f"flight_records must be a positive int, got {flight_records!r}")
    if trace is not None:
        _check_trace_path(trace)
    if not isinstance(share_args, bool):
        raise TypeError(f"share_args must be True or False, got {share_args!r}")
    if not isinstance(strict_call_sites, bool):
        raise TypeError(f"strict_call_sites must be True or False, got {strict_call_sites!r}")
    inputs = _rank_inputs(tuple(args), kwargs, n, share_args)
    counting = comm_stats.active()
    # A rank that starts a run of its own (nested) lets that run's ranks
    # execute, and its world take the caller's state, while it waits.
    suspended = suspend_process()
    try:
        world = World(
            layout,
            n,
            make_model(reduction, seed),
            float(timeout),
            faults,
            keep_trace=trace is not None or bool(counting),
            flight_records=flight_records,
            schedule=schedule,
            schedule_seed=seed if schedule_seed is None else schedule_seed,
            rank_local=rank_local,
            strict_call_sites=strict_call_sites,
        )
    except BaseException:
        resume_process(suspended)
        raise
    world.deadline = called_at + float(timeout)
    run_name = _name_run(fn)
    world.run_name = run_name
    run_id = c10d_state.new_run_id()

    register_backend()
    results: list[Any] = [None] * n
    failures: dict[int, BaseException] = {}

    # Whether a rank has ended, by simdist's own bookkeeping: CPython marks a
    # thread as stopped when a join() on it is interrupted (Ctrl-C), so
    # is_alive() cannot be trusted to find the ranks still to take down.
    exited = [threading.Event() for _ in range(n)]
    # Bodies start once every rank thread has: a rank that computes from the
    # start must not slow the start of the others (with 32 busy ranks, starting
    # threads took many times the watchdog's timeout).
    go = threading.Event()

    def rank_main(rank: int) -> None:
        # Threads the body starts are not daemons by default, as in a process
        # whose main thread starts them; the rank thread itself stays a daemon
        # for the interpreter (its flag was read when it started).
        threading.current_thread()._daemonic = False  # type: ignore[attr-defined]
        bind_current(world, rank)
        world.scheduler.bind_thread(rank)
        try:
            c10d_state.enter_thread(c10d_state.new_rank_state(run_id, rank))
            go.wait()
            world.scheduler.acquire(rank)
            if world.scheduler.aborted is not None:  # interrupted before its body began
                raise world.scheduler.aborted
            # Autograd would run CUDA backward on its device threads, which have
            # no rank; keep backward on the rank's own thread.
            with torch.autograd.set_multithreading_enabled(False):
                dist.init_process_group(
                    BACKEND_NAME,
                    rank=rank,
                    world_size=n,
                    store=world.store,
                    timeout=timedelta(seconds=timeout),
                )
                _share_world_rank_map(world)
                ctx = RankContext(
                    rank=rank,
                    world_size=n,
                    layout=layout,
                    device=devices[rank],
                    groups=build_groups(layout),
                    attempt=attempt,
                    seed=seed,
                )
                rank_args, rank_kwargs = inputs[rank]
                results[rank] = fn(ctx, *rank_args, **rank_kwargs)
                _end_helpers(world, rank)
            world.scheduler.rank_finished(rank)
        except BaseException as exc:
            failures[rank] = exc
            try:
                _end_helpers(world, rank, failure=exc)
            finally:
                world.scheduler.rank_failed(rank, exc)
        finally:
            release_process()
            c10d_state.leave_rank_thread()
            bind_current(None)
            exited[rank].set()

    c10d_state.install()
    helpers.install()
    timed_out: str | None = None
    try:
        starter = TreeStart(n, rank_main, lambda r: f"simdist-rank-{r}")
        threads = starter.threads
        for t, done in zip(threads, exited):
            t.simdist_exited = done  # type: ignore[attr-defined]
            t._simdist_helper = False  # type: ignore[attr-defined]  # a rank, never a helper
        try:
            starter.start()
            go.set()
            world.scheduler.begin()
            timed_out = _join_all(threads, world, called_at + float(timeout), float(timeout))
        except BaseException as exc:
            # Ctrl-C (or any error) in the caller: take the ranks down before
            # the per-thread c10d state is removed from under them.
            go.set()
            still = _interrupt(threads, world, SimulationError("run() was interrupted"))
            if still and hasattr(exc, "add_note"):
                exc.add_note(_stuck_report(still, "run() was interrupted"))
            raise
    finally:
        if world.states is not None:
            world.states.restore_caller()
        resume_process(suspended)
        helpers.uninstall()
        c10d_state.uninstall()
        # A group object can outlive its run (returned from the body, kept in a
        # global): calls on it must fail at once, not wait for ranks that are gone.
        world.scheduler.close(
            SimulationError(
                f"this process group belongs to {run_name}, which has already ended: a group "
                f"can only be used inside the run that created it"
            )
        )
        for stats in counting:
            stats.add_records(world.recorder.all_records())
        trace_error = None
        if trace is not None:
            try:
                world.recorder.write_chrome_trace(trace, world.describe_rank)
            except OSError as exc:  # never hide the run's own outcome behind it
                trace_error = exc
    results = _outcome(world, results, failures, timed_out, trace_error)
    if trace_error is not None:
        raise trace_error
    return results


def _share_world_rank_map(world: World) -> None:
    """Replace this rank's copy of c10d's world rank map (``{i: i}``, built by
    ``init_process_group``) by the world's shared one: 4096 ranks would keep
    4096 copies of a 4096-entry dict (250 KiB each). c10d only reads it."""
    c10d = dist.distributed_c10d
    default = c10d._world.default_pg
    ranks = c10d._world.pg_group_ranks
    if default in ranks and len(ranks[default]) == world.world_size:
        ranks[default] = world.world_rank_map


def _end_helpers(world: World, rank: int, failure: BaseException | None = None) -> None:
    """A rank's end, as a process's: wait for its non-daemon helper threads
    (a wait in simdist, so deadlocks among them are found), stop daemon ones
    (a process's exit would kill them), and fail with what a helper raised.
    A rank that failed (``failure``) stops all its helpers. A helper that
    cannot be stopped is reported by name and stack: as the rank's failure,
    or as a note on the failure it already has."""
    scheduler = world.scheduler
    helpers.shut_down_pools(scheduler, rank)
    if failure is None:
        waitable = scheduler.helpers_waitable(rank)
        if waitable is not None:
            scheduler.wait(rank, waitable)
    failed = list(world.helper_failures.get(rank, ()))  # before stopping any
    left = scheduler.live_helpers(rank)
    for helper in left:
        # An idle pool worker leaves by itself now that its pool is shut down.
        if helper.thread_id is not None and not helper.idle:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(helper.thread_id), ctypes.py_object(SimulationError)
            )
    # Never past the run's watchdog: it would interrupt this clean-up and
    # report a timeout instead of what the rank did.
    grace = min(time.monotonic() + _GRACE_S, world.deadline - _GRACE_MARGIN_S)
    while left and time.monotonic() < grace:
        time.sleep(0.005)
        left = scheduler.live_helpers(rank)
    if left:
        helpers.forget_at_exit({h.thread_id for h in left if h.thread_id is not None})
        frames = sys._current_frames()
        lines = [
            f"rank {rank}'s {'body returned' if failure is None else 'body failed'}, but "
            f"{len(left)} helper thread(s) it started could not be stopped (blocked in "
            f"native code, or catching the interrupt); they are left running as daemon "
            f"threads:"
        ]
        for helper in left:
            lines.append(f"  {helper.name}:")
            lines.extend("      " + s for s in stacks.user_stack(frames.get(helper.thread_id or -1)))
        if failure is None:
            raise SimulationError("\n".join(lines))
        if hasattr(failure, "add_note"):
            failure.add_note("\n".join(lines))
    if failed and failure is None:
        name, exc = failed[0]
        raise exc


def _rank_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], n: int, share: bool
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Each rank's own deep copy of the inputs (one memo per rank keeps aliasing
    between arguments), or the same objects for all with ``share``."""
    if share:
        return [(args, kwargs)] * n
    try:
        return [copy.deepcopy((args, kwargs)) for _ in range(n)]
    except Exception as exc:
        raise TypeError(
            f"args/kwargs cannot be copied for each rank ({type(exc).__name__}: {exc}); "
            f"pass share_args=True to give every rank the same objects (as no real "
            f"process could share them, make sure that is what the test means)"
        ) from exc


_run_counter = itertools.count(1)


def _name_run(fn: Callable[..., Any]) -> str:
    return f"simdist.run #{next(_run_counter)} (body {getattr(fn, '__qualname__', repr(fn))})"


def _check_trace_path(trace: str | os.PathLike[str]) -> None:
    """Refuse a trace path that cannot be written before any rank starts."""
    if not isinstance(trace, (str, os.PathLike)):
        raise TypeError(f"trace must be a file path, got {type(trace).__name__}")
    path = os.fspath(trace)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"trace={path!r} is a directory; pass a file path such as 'step.json'")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"trace={path!r}: its directory does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise PermissionError(f"trace={path!r}: its directory is not writable")


def _join_all(threads: list[threading.Thread], world: World, deadline: float, timeout: float) -> str | None:
    """Join every rank thread; at the watchdog's ``deadline`` (``timeout``
    seconds after ``run`` was called) interrupt the stuck ones.

    Returns the watchdog report when it fired, else None.
    """
    for t in threads:
        _join(t, max(0.0, deadline - time.monotonic()))
    alive = [t for t in threads if _alive(t)]
    if not alive:
        return None
    frames = sys._current_frames()
    # Scheduled, a rank that never got the run token back did not hang: the
    # rank holding it did (or a rank the holder waits on outside simdist).
    queued = world.scheduler.queued_ranks()
    # Stop the ranks first, describe them after (from the frames taken at the
    # deadline): formatting stacks while dozens of busy ranks fight for the
    # GIL took many times the timeout itself.
    _signal(
        alive,
        world,
        SimulationTimeout(f"watchdog: the run was still going {timeout:g} s after run() was called"),
    )
    running = [t for t in alive if int(t.name.rsplit("-", 1)[1]) not in queued]
    lines = [f"watchdog: {len(running)} rank(s) still running after {timeout:g} s"]
    stalled = sorted(r for r in queued if _alive(threads[r]))
    if stalled:
        lines.append(
            f"  rank(s) {stalled} were ready to run, but never got the run token back "
            f"(one rank runs at a time, until it blocks in simdist or returns)"
        )
    for t in running:
        rank = int(t.name.rsplit("-", 1)[1])
        lines.append(f"  rank {rank} ({world.describe_rank(rank)}):")
        lines.extend("      " + s for s in stacks.user_stack(frames.get(t.ident or -1)))
    report = "\n".join(lines)
    still = _wait_for(alive)
    if still:
        report += "\n" + _stuck_report(still, "the watchdog fired")
    return report


def _stuck_report(still: list[threading.Thread], why: str) -> str:
    """Name the threads nothing could stop, with where they are stuck."""
    frames = sys._current_frames()
    lines = [
        f"  after {why}, {len(still)} thread(s) could not be interrupted within {_GRACE_S:g} s "
        f"(blocked in native code such as a lock or Event wait, or catching the interrupt); "
        f"they are left running as daemon threads. Their groups are closed and "
        f"their c10d names are their own, so they cannot disturb the caller or "
        f"a later run, but they keep their memory and CPU until they return:"
    ]
    for t in still:
        lines.append(f"    {t.name}:")
        lines.extend("        " + s for s in stacks.user_stack(frames.get(t.ident or -1)))
    return "\n".join(lines)


def _interrupt(
    threads: list[threading.Thread], world: World, error: SimulationError
) -> list[threading.Thread]:
    """Abort the world, raise ``error``'s type in running ranks, join them.

    Returns the threads that did not stop within the grace period.
    """
    _signal(threads, world, error)
    return _wait_for(threads)


def _signal(threads: list[threading.Thread], world: World, error: SimulationError) -> None:
    world.scheduler.abort(error)
    idents = [t.ident for t in threads if _alive(t) and t.ident is not None]
    # Helper threads too: a rank waits for its helpers before it ends.
    for rank in range(world.world_size):
        idents += [
            h.thread_id for h in world.scheduler.live_helpers(rank) if h.thread_id and not h.idle
        ]  # idle pool workers leave at their rank's end
    for ident in idents:
        # Interrupts Python-level loops; a thread blocked inside C code stays
        # stuck, and is reported by the caller.
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(type(error)))


def _wait_for(threads: list[threading.Thread]) -> list[threading.Thread]:
    grace = time.monotonic() + _GRACE_S
    for t in threads:
        _join(t, max(0.0, grace - time.monotonic()))
    return [t for t in threads if _alive(t)]


def _alive(t: threading.Thread) -> bool:
    done = getattr(t, "simdist_exited", None)
    return t.is_alive() if done is None or not t.ident else not done.is_set()


def _join(t: threading.Thread, timeout: float) -> None:
    done = getattr(t, "simdist_exited", None)
    if not t.ident:
        return  # never started (the OS refused a thread, or interrupted while starting)
    if done is None:
        t.join(timeout)
    elif done.wait(timeout):
        t.join(1.0)  # it has left simdist; let the thread itself end


def _outcome(
    world: World,
    results: list[Any],
    failures: dict[int, BaseException],
    timed_out: str | None,
    trace_error: BaseException | None = None,
) -> list[Any]:
    """What ``run`` returns or raises, decided from what happened, not from
    which thread got somewhere first. In order: a deadlock, a collective
    mismatch (both even when every rank caught them), the watchdog, rank
    failures (the lowest failed rank is the cause), calls left incomplete.
    Every error carries ``results``: what each rank returned (None if it raised)."""
    sched = world.scheduler
    note = "" if trace_error is None else f"\n(the trace could not be written: {trace_error})"
    tail = world.recorder.tail(None if world.world_size <= 16 else sorted(failures)) + world.call_site_notes()
    watchdog = "" if timed_out is None else f"\nafterwards the watchdog fired:\n{timed_out}"

    def fail(error: SimulationError, cause: BaseException | None = None) -> None:
        if not isinstance(error, RankError):
            error.failures = failures  # type: ignore[attr-defined]
        error.results = results  # type: ignore[attr-defined]
        raise error from cause

    if sched.deadlock is not None:
        fail(DeadlockError(f"{sched.deadlock}{watchdog}\n{tail}{note}"), sched.deadlock)
    mismatch = next((e for _, e in sched.recorded if isinstance(e, CollectiveMismatchError)), None)
    if mismatch is not None:
        fail(CollectiveMismatchError(f"{mismatch}{watchdog}\n{tail}{note}"), mismatch)
    if timed_out is not None:
        fail(SimulationTimeout(f"{timed_out}\n{tail}{note}"))
    own = {r: e for r, e in failures.items() if r not in sched.released}
    caught: dict[int, BaseException] = {}
    for r, e in sched.recorded:  # simdist errors a rank caught and went on from
        if r not in failures and r not in caught:
            caught[r] = e
    if own or caught:
        lines = []
        for r in sorted({**own, **caught}):
            if r in own:
                lines.append(f"rank {r} ({world.describe_rank(r)}) failed: {type(own[r]).__name__}: {own[r]}")
            else:
                lines.append(
                    f"rank {r} ({world.describe_rank(r)}) caught {type(caught[r]).__name__} and "
                    f"went on (a failure all the same): {caught[r]}"
                )
        released = sorted(sched.released)
        if released:
            lines.append(f"released from waits by the failure: rank(s) {released}")
        lines.append(tail + note)
        everything = {**caught, **own}
        fail(RankError("\n".join(lines), everything, released), everything[min(everything)])
    if failures:  # only released ranks: cannot happen, but never return silently
        fail(RankError(f"rank(s) {sorted(failures)} failed\n{tail}{note}", failures))
    leftovers = sched.leftovers()
    if leftovers is not None:
        fail(DeadlockError(f"every rank returned, but {leftovers}\n{tail}{note}"))
    return results
