"""One rank thread, from its start to its end: c10d set-up, the body, its helpers' end."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from .. import _sanitizer, stacks
from .._backend.process_group import BACKEND_NAME
from .._core import identity
from .._core.frames import current_frames
from .._cuda.mode import emulating
from .._isolation import c10d_state, helpers, logging_locks
from .._isolation.c10d_init import Prepared
from .._isolation.rank_state import release_process
from ..context import RankContext, build_groups
from ..debug import _hooks as debug_hooks
from ..errors import SimulationError
from . import watchdog
from .world import World

# A rank's own clean-up (stopping its helpers) ends this long before the
# watchdog's deadline, so the rank's outcome is reported, not a timeout.
_GRACE_MARGIN_S = 0.25

Inputs = list[tuple[tuple[Any, ...], dict[str, Any]]]


def rank_inputs(args: tuple[Any, ...], kwargs: dict[str, Any], n: int, share: bool) -> Inputs:
    """Each rank's own deep copy of the inputs (one memo per rank keeps aliasing
    between arguments), or the same objects for all with ``share``."""
    if share:
        return [(args, kwargs)] * n
    if not args and not kwargs:  # nothing to copy: each rank its own empty kwargs
        return [((), {}) for _ in range(n)]
    try:
        return [copy.deepcopy((args, kwargs)) for _ in range(n)]
    except Exception as exc:
        raise TypeError(
            f"args/kwargs cannot be copied for each rank ({type(exc).__name__}: {exc}); "
            f"pass share_args=True to give every rank the same objects (as no real "
            f"process could share them, make sure that is what the test means)"
        ) from exc


def _leave_rank() -> None:
    """A rank thread's last clean-up: logging's locks a stop leaked, its process hold, then its c10d names."""
    logging_locks.release_if_stopped()
    release_process()
    c10d_state.leave_rank_thread()


class RankThreads:
    """What every rank thread of one run shares, and the body each runs."""

    def __init__(
        self, world: World, fn: Callable[..., Any], inputs: Inputs, devices: list[torch.device], run_id: int
    ) -> None:
        n = world.world_size
        self.world = world
        self.fn = fn
        self.inputs = inputs
        self.run_id = run_id
        self.devices = devices
        self.results: list[Any] = [None] * n
        self.failures: dict[int, BaseException] = {}
        # Whether a rank has ended, by simdist's own bookkeeping: CPython marks a
        # thread as stopped when a join() on it is interrupted (Ctrl-C), so
        # is_alive() cannot be trusted to find the ranks still to take down.
        self.exited = [threading.Event() for _ in range(n)]
        # Bodies start once every rank thread has: a rank that computes from the
        # start must not slow the start of the others (with 32 busy ranks, starting
        # threads took many times the watchdog's timeout).
        self.go = threading.Event()
        timeout = timedelta(seconds=world.options.timeout)
        self.init = Prepared(BACKEND_NAME, n, world.store, timeout, world.world_rank_map)

    def main(self, rank: int) -> None:
        """A rank thread's whole life."""
        world = self.world
        # Threads the body starts are not daemons by default, as in a process
        # whose main thread starts them; the rank thread itself stays a daemon
        # for the interpreter (its flag was read when it started).
        threading.current_thread()._daemonic = False  # type: ignore[attr-defined]  # CPython's private flag behind Thread.daemon
        identity.bind(world, rank, c10d_state.new_rank_state(self.run_id, rank))
        world.scheduler.bind_thread(rank)
        try:
            if not world.scheduler.scheduled:
                # Scheduled, the run token is that wait: it is handed out once
                # every thread runs, and no rank wakes just to park again.
                self.go.wait()
            world.scheduler.acquire(rank)
            if world.scheduler.aborted is not None:  # interrupted before its body began
                # One error object raised by thousands of ranks: each raise
                # would add its frames to the shared traceback.
                raise world.scheduler.aborted.with_traceback(None)
            # Autograd would run CUDA backward on its device threads, which have
            # no rank; keep backward on the rank's own thread.
            emulation = emulating() if world.cuda_emulation is not None else contextlib.nullcontext()
            with torch.autograd.set_multithreading_enabled(False), emulation:
                self.results[rank] = self._body(rank)
                _sanitizer.body_returned(world, rank, self.results[rank])  # Works never waited
                end_helpers(world, rank)
            world.scheduler.rank_finished(rank)
        except BaseException as exc:
            self.failures[rank] = exc
            debug_hooks.rank_failed(world, rank, exc)  # debug hook: post-mortem, peers not yet released
            try:
                end_helpers(world, rank, failure=exc)
            finally:
                world.scheduler.rank_failed(rank, exc)
        finally:
            # No stop request can land in this clean-up (see _core.identity).
            _sanitizer.rank_left(world, rank)  # a pooled thread keeps no mode
            try:
                identity.leave(_leave_rank)
            finally:
                self.exited[rank].set()

    def _body(self, rank: int) -> Any:
        world, options = self.world, self.world.options
        self.init.init_rank(rank)
        ctx = RankContext(
            rank=rank,
            world_size=world.world_size,
            layout=options.layout,
            device=self.devices[rank],
            groups=build_groups(options.layout),
            attempt=options.attempt,
            seed=options.seed,
        )
        rank_args, rank_kwargs = self.inputs[rank]
        return self.fn(ctx, *rank_args, **rank_kwargs)


def end_helpers(world: World, rank: int, failure: BaseException | None = None) -> None:
    """A rank's end, as a process's: wait for its non-daemon helper threads
    (a wait in simdist, so deadlocks among them are found), stop daemon ones
    (a process's exit would kill them), and fail with what a helper raised.
    A rank that failed (``failure``) stops all its helpers. A helper that
    cannot be stopped is reported by name and stack: as the rank's failure,
    or as a note on the failure it already has. Once per rank: the failure
    this raises (a helper left running, a helper's error) is the rank's, and
    its failure path calls this again; the helpers are already dealt with."""
    if rank in world.helpers_ended:
        return
    scheduler = world.scheduler
    helpers.shut_down_pools(scheduler, rank, failed=failure is not None)
    if failure is None:
        waitable = scheduler.helpers.helpers_waitable(rank)
        if waitable is not None:
            scheduler.wait(rank, waitable)
    failed = list(world.helper_failures.get(rank, ()))  # before stopping any
    left = scheduler.helpers.live(rank)
    for helper in left:
        # An idle pool worker leaves by itself now that its pool is shut down.
        if helper.thread_id is not None and not helper.idle:
            scheduler.helpers.stop(helper, SimulationError())
    # Never past the run's watchdog: it would interrupt this clean-up and
    # report a timeout instead of what the rank did.
    grace = min(time.monotonic() + watchdog.GRACE_S, world.deadline - _GRACE_MARGIN_S)
    while left and time.monotonic() < grace:
        time.sleep(0.005)
        left = scheduler.helpers.live(rank)
    world.helpers_ended.add(rank)
    if left:
        helpers.forget_at_exit({h.thread_id for h in left if h.thread_id is not None})
        report = _unstoppable_helpers(rank, left, failure is None)
        if failure is None:
            raise SimulationError(report)
        if hasattr(failure, "add_note"):
            failure.add_note(report)
    if failed and failure is None:
        _name, exc = failed[0]
        raise exc


def _unstoppable_helpers(rank: int, left: list[Any], returned: bool) -> str:
    frames = current_frames()
    lines = [
        f"rank {rank}'s {'body returned' if returned else 'body failed'}, but "
        f"{len(left)} helper thread(s) it started could not be stopped (blocked in "
        f"native code, or catching the interrupt); they are left running as daemon "
        f"threads:"
    ]
    for helper in left:
        lines.append(f"  {helper.name}:")
        lines.extend("      " + s for s in stacks.user_stack(frames.get(helper.thread_id or -1)))
    return "\n".join(lines)
