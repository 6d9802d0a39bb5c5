"""``simdist.run``: one thread per rank, joined before returning, errors gathered.

Structured like a nursery: every thread started here is joined (or, for a rank
stuck in plain compute past the watchdog, interrupted and then joined) before
``run`` returns or raises, and the first failure is never swallowed.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .._backend.registration import register_backend
from .._core import identity
from .._core.pool import PooledStart, StartTimedOut
from .._cuda import patch as _cuda_patch  # noqa: F401  # registers the "cuda emulation" patch
from .._isolation import c10d_state, patches
from .._isolation.rank_state import resume_process, suspend_process
from .._isolation.thread_state import forget_thread_caches, thread_state
from ..debug import _hooks as debug_hooks
from ..errors import SimulationError, SimulationTimeout
from ..faults import FaultPlan, report_unfired
from ..layout import Layout
from ..reduction import ReductionModel
from ..trace import DEFAULT_RECORDS
from . import watchdog
from .observers import RunObserver, observers_for, tell_ended
from .options import DEFAULT_TIMEOUT_S, OPTION_NAMES, RunOptions
from .outcome import outcome
from .rank import RankThreads, rank_inputs
from .world import World

EMULATING_PATCHES = (*patches.RUN_PATCHES, "cuda emulation")


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
    check_async: bool = True,
    strict_async: bool = False,
    check_group_order: bool = False,
    cuda: str | None = None,
    cuda_devices: int | None = None,
    post_mortem: bool | None = None,
    break_at: Mapping[str, Any] | str | None = None,
) -> list[Any]:
    """Run ``fn(ctx, *args, **kwargs)`` once per rank, each rank in its own thread.

    Returns the per-rank results, indexed by global rank. Raises ``RankError`` when a rank raised
    (``__cause__`` is the lowest failed rank's error), ``DeadlockError`` when some waiting ranks could
    never complete, ``CollectiveMismatchError`` when members of a group called different collectives
    (both even if every rank caught them), ``SimulationTimeout`` when ranks were still running after
    ``timeout`` seconds (a positive, finite number).

    The world is ``layout=Layout(...)`` (groups for every axis in ``ctx.groups``) or a flat
    ``world_size=N`` (``ctx.groups.world`` only); a ``world_size`` given beside a layout must agree with
    it. ``device`` is each rank's ``ctx.device``: ``"cuda"`` without an index gives rank r GPU
    ``r % device_count()``. ``timeout`` counts from the call (start-up included). ``seed`` seeds the
    ``"shuffled"`` reduction model and the ``"random"`` schedule unless ``schedule_seed`` is given.
    ``attempt`` is what the body sees as ``ctx.attempt`` (``run_with_retry`` numbers its attempts with
    it).

    ``reduction`` picks the reduction-order model ("rank", "ring", "tree", "shuffled" seeded by
    ``seed``); ``faults`` injects a ``FaultPlan``; ``trace`` writes a Chrome/Perfetto trace of every
    call to that path; ``flight_records`` is how many recent calls per rank errors quote.

    One rank runs at a time: it holds the run token until it blocks in simdist (a collective, P2P or
    store wait) or returns; ``schedule`` picks who runs next: "rank" (the lowest runnable rank),
    "random" (seeded by ``schedule_seed``, default ``seed``), or "concurrent" (every rank at once, no
    per-rank process state). Scheduled, each rank has its own torch, ``random`` and numpy generator
    state and its own copy of every ``rank_local`` entry (a module, its name, or an ``(object, "attr")``
    pair), all starting from their values at run start and put back when it ends. ``args``/``kwargs``
    reach each rank as its own deep copy, as with processes, unless ``share_args=True`` (large read-only
    inputs, or deliberate sharing). ``strict_call_sites=True`` makes members that meet at one sequence
    number from different lines of code a ``CollectiveMismatchError``. ``check_async=True`` (the
    default) runs the collective sanitizer: while a rank's async collective or P2P is in flight, an
    operation of that rank that reads its outputs or writes its buffers raises ``AsyncRaceError``
    (docs/sanitizer.md); a Work never waited warns (``UnwaitedWorkWarning``), or raises with
    ``strict_async=True``. ``check_group_order=True`` refuses async collectives two ranks issue on two
    groups in opposite orders (a deadlock on NCCL; always checked for groups created with backend
    "nccl"). ``cuda="emulate"`` runs CUDA-first code without a GPU: in each rank ``torch.cuda`` answers
    as on a node of ``cuda_devices`` GPUs (default the world size, at most 8), each rank's current
    device ``rank % cuda_devices``, and tensors made or moved to ``"cuda"`` compute on the CPU while
    reporting ``cuda:N`` (docs/cuda.md says what is emulated and what is not). ``post_mortem=True``
    opens pdb in a failing rank's own frame before its peers are released, the world paused;
    ``break_at={"rank": 1, "op": "all_reduce", "nth": 3}`` opens it just before that call (see
    ``simdist.debug``; both default to ``simdist.debug.defaults``).
    """
    # The watchdog's clock starts now: building inputs and starting threads count.
    called_at = time.monotonic()
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    # Every keyword but fn, args and kwargs is a RunOptions field of the same name.
    given = locals()
    options = RunOptions(layout=layout, world_size=world_size, **{name: given[name] for name in OPTION_NAMES})
    return run_with_options(fn, options, args, kwargs, called_at=called_at)


_run_counter = itertools.count(1)


def run_with_options(
    fn: Callable[..., Any],
    options: RunOptions,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    called_at: float | None = None,
) -> list[Any]:
    """``simdist.run`` with its options already built (the pytest marker's way in)."""
    called_at = time.monotonic() if called_at is None else called_at
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    devices = options.devices()
    inputs = rank_inputs(tuple(args), dict(kwargs or {}), options.size, options.share_args)
    observers = observers_for(options)
    debugging = debug_hooks.options(options.post_mortem, options.break_at, options.size)  # debug hook
    # A rank that starts a run of its own (nested) lets that run's ranks
    # execute, and its world take the caller's state, while it waits.
    suspended = suspend_process()
    try:
        keep = any(o.keeps_all_records for o in observers) or debug_hooks.keep_trace(debugging)  # debug hook
        world = World(options, keep_all_records=keep)
    except BaseException:
        resume_process(suspended)
        raise
    world.deadline = called_at + options.timeout
    debug_hooks.attach(world, debugging, fn)  # debug hook: world.debug, the paused clock
    run_name = f"simdist.run #{next(_run_counter)} (body {getattr(fn, '__qualname__', repr(fn))})"
    register_backend()
    ranks = RankThreads(world, fn, inputs, devices, c10d_state.new_run_id())
    try:
        # c10d routing, helper threads (see _isolation.patches); CUDA's device API when emulated
        lease = patches.lease(EMULATING_PATCHES if options.cuda == "emulate" else patches.RUN_PATCHES)
    except BaseException:
        if world.states is not None:
            world.states.restore_caller()
        resume_process(suspended)
        raise
    try:
        timed_out = _start_and_join(ranks, world.deadline)
    finally:
        restore_error, observer_error = _tear_down(world, suspended, lease, run_name, observers)
    if restore_error is not None:
        raise restore_error
    report_unfired(world.faults)  # a plan that matched no call tested nothing: say so
    # debug hook: a failing run writes its trace when asked to
    results = debug_hooks.outcome(
        world, lambda: outcome(world, ranks.results, ranks.failures, timed_out, observer_error)
    )
    if observer_error is not None:
        raise observer_error
    return results


def _start_and_join(ranks: RankThreads, deadline: float) -> str | None:
    """Start every rank thread, join them by the deadline; the watchdog's report, if it fired."""
    world = ranks.world
    starter = PooledStart(
        world.world_size, ranks.main, lambda r: f"simdist-rank-{r}", thread_state, forget_thread_caches
    )
    threads = starter.threads
    for t, done in zip(threads, ranks.exited):
        t.simdist_exited = done  # a Seat: _simdist_helper is set on its thread by the pool
    try:
        try:
            starter.start(deadline)
            ranks.go.set()
            world.scheduler.begin()
            return watchdog.join_all(threads, world, deadline, world.timeout)
        except StartTimedOut as exc:
            # The timeout bounds the run from its call, start-up included. No
            # body has begun: the ranks see the abort before their bodies and
            # end, with nothing to interrupt.
            timeout = SimulationTimeout(
                f"the run's start passed its timeout of {world.timeout:g} s: {exc.started} of the "
                f"{world.world_size} ranks' new threads were started (the OS starts each one); "
                f"give a larger timeout= or fewer ranks"
            )
            world.scheduler.abort(timeout)
            ranks.go.set()
            still = watchdog.wait_for(threads)
            if still and hasattr(timeout, "add_note"):  # Python 3.11+
                timeout.add_note(watchdog.stuck_report(still, "the start passed its timeout"))
            raise timeout from None
        except BaseException as exc:
            # Ctrl-C (or any error) in the caller: take the ranks down before
            # the per-thread c10d state is removed from under them.
            ranks.go.set()
            still = watchdog.interrupt(threads, world, SimulationError("run() was interrupted"))
            if still and hasattr(exc, "add_note"):
                exc.add_note(watchdog.stuck_report(still, "run() was interrupted"))
            raise
    finally:
        for t in threads:
            if watchdog.is_alive(t):
                t.abandoned = True  # left behind: its thread ends whenever it returns, never parked


def _tear_down(
    world: World, suspended: Any, lease: patches.Lease, run_name: str, observers: list[RunObserver]
) -> tuple[BaseException | None, OSError | None]:
    """Give the caller its process back, close the world, tell the observers.

    A step that fails must not skip the others (a patch, the c10d routing or
    the caller's hold left behind would break every later run): the
    restore's error is returned, to be raised once everything is undone."""
    restore_error: BaseException | None = None
    if world.states is not None:
        try:
            world.states.restore_caller()
        except Exception as exc:
            restore_error = exc
    resume_process(suspended)
    lease.release()
    if identity.me.gate is None:  # (a nested run's caller is a rank: its own run's end does it)
        # A stop left pending in a thread simdist gave up on must not stall traced threads.
        identity.reset_stop_flag()
    # A group object can outlive its run (returned from the body, kept in a
    # global): calls on it must fail at once, not wait for ranks that are gone.
    world.scheduler.close(
        SimulationError(
            f"this process group belongs to {run_name}, which has already ended: a group "
            f"can only be used inside the run that created it"
        )
    )
    return restore_error, tell_ended(observers, world)
