"""Joining rank threads, and stopping them: the watchdog's deadline, Ctrl-C.

A thread running Python is stopped by an asynchronous exception
(``PyThreadState_SetAsyncExc``); one blocked inside C code cannot be, and is
named with its stack and left behind as a daemon.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from .. import stacks
from .._core import identity
from .._core.frames import current_frames
from .._core.pool import Seat
from ..debug import _hooks as debug_hooks
from ..errors import SimulationError, SimulationTimeout

if TYPE_CHECKING:
    from .world import World

# After the watchdog interrupts stuck ranks, how long to wait for them to
# unwind (also the grace a rank's helpers get at its end; read at call time,
# so tests may shorten it).
GRACE_S = 5.0


def raise_in(thread_id: int, error: type[BaseException], world: World | None = None) -> None:
    """Raise ``error`` in the thread ``thread_id`` at its next Python bytecode
    (with ``world``: only while the thread serves that run)."""
    identity.interrupt(thread_id, error, world)  # gated: never in a thread's clean-up


def join_all(threads: list[Seat], world: World, deadline: float, timeout: float) -> str | None:
    """Join every rank thread (``threads[r]`` runs rank r); at the watchdog's
    ``deadline`` (``timeout`` seconds after ``run`` was called) interrupt the
    stuck ones. Returns the watchdog report when it fired, else None."""
    for t in threads:
        join(t, max(0.0, debug_hooks.time_left(world, deadline)))  # debug hook: paused clock
        while is_alive(t) and debug_hooks.time_left(world, deadline) > 0:  # debug hook: paused clock
            join(t, debug_hooks.time_left(world, deadline))
    alive_ranks = [r for r, t in enumerate(threads) if is_alive(t)]
    alive = [threads[r] for r in alive_ranks]
    if not alive:
        return None
    frames = current_frames()
    # Scheduled, a rank that never got the run token back did not hang: the
    # rank holding it did (or a rank the holder waits on outside simdist).
    # What each rank waits in and its helpers, as of the deadline too: a rank
    # inside a call is reported waiting in it, never as running.
    queued, waits, helper_lines = world.scheduler.watchdog_view(frames)
    # Stop the ranks first, describe them after (from the frames taken at the
    # deadline): formatting stacks while dozens of busy ranks fight for the
    # GIL took many times the timeout itself.
    signal(
        alive,
        world,
        SimulationTimeout(f"watchdog: the run was still going {timeout:g} s after run() was called"),
    )
    listed = [r for r in alive_ranks if r not in queued]
    running = [r for r in listed if r not in waits]
    lines = [f"watchdog: {len(running)} rank(s) still running after {timeout:g} s"]
    stalled = sorted(r for r in queued if is_alive(threads[r]))
    if stalled:
        lines.append(
            f"  rank(s) {stalled} were ready to run, but never got the run token back "
            f"(one rank runs at a time, until it blocks in simdist or returns)"
        )
    for rank in listed:
        wait = f" {waits[rank]}" if rank in waits else ""
        lines.append(f"  rank {rank} ({world.describe_rank(rank)}):{wait}")
        lines.extend("      " + s for s in stacks.user_stack(frames.get(threads[rank].ident or -1)))
        lines.extend(helper_lines.get(rank, ()))
    report = "\n".join(lines)
    still = wait_for(alive)
    if still:
        report += "\n" + stuck_report(still, "the watchdog fired")
    return report


def stuck_report(still: list[Seat], why: str) -> str:
    """Name the threads nothing could stop, with where they are stuck."""
    frames = current_frames()
    lines = [
        f"  after {why}, {len(still)} thread(s) could not be interrupted within {GRACE_S:g} s "
        f"(blocked in native code such as a lock or Event wait, or catching the interrupt); "
        f"they are left running as daemon threads. Their groups are closed and "
        f"their c10d names are their own, so they cannot disturb the caller or "
        f"a later run, but they keep their memory and CPU until they return:"
    ]
    for t in still:
        lines.append(f"    {t.name}:")
        lines.extend("        " + s for s in stacks.user_stack(frames.get(t.ident or -1)))
    return "\n".join(lines)


def interrupt(threads: list[Seat], world: World, error: SimulationError) -> list[Seat]:
    """Abort the world, raise ``error``'s type in running ranks, join them.

    Returns the threads that did not stop within the grace period.
    """
    signal(threads, world, error)
    return wait_for(threads)


def signal(threads: list[Seat], world: World, error: SimulationError) -> None:
    world.scheduler.abort(error)
    idents = [t.ident for t in threads if is_alive(t) and t.ident is not None]
    # Helper threads too: a rank waits for its helpers before it ends.
    idents += [
        h.thread_id for h in world.scheduler.helpers.live_everywhere() if h.thread_id and not h.idle
    ]  # idle pool workers leave at their rank's end
    for ident in idents:
        # Interrupts Python-level loops; a thread blocked inside C code stays
        # stuck, and is reported by the caller.
        raise_in(ident, type(error), world)


def wait_for(threads: list[Seat]) -> list[Seat]:
    grace = time.monotonic() + GRACE_S
    for t in threads:
        join(t, max(0.0, grace - time.monotonic()))
    return [t for t in threads if is_alive(t)]


def is_alive(t: Seat) -> bool:
    """Whether the rank has not left simdist yet (its thread's own liveness
    cannot be trusted: see ``RankThreads.exited``)."""
    assert t.simdist_exited is not None
    return bool(t.ident) and not t.simdist_exited.is_set()


def join(t: Seat, timeout: float) -> None:
    if not t.ident:
        return  # never started (the OS refused a thread, or interrupted while starting)
    assert t.simdist_exited is not None
    if _wait_event(t.simdist_exited, timeout):
        t.join(1.0)  # it has left simdist; let the thread park or end


# A nested run's caller waits for its ranks in slices this long (see _wait_event).
_SLICE_S = 0.05


def _wait_event(done: threading.Event, timeout: float) -> bool:
    """``done.wait(timeout)``; in a rank (a nested run's caller) in slices, so
    that a stop request of the rank's own run (its Ctrl-C, its watchdog)
    lands within one and the nested run is taken down with it: a wait
    blocked in C never sees one."""
    if identity.me.world is None:
        return done.wait(timeout)
    end = time.monotonic() + timeout
    while not done.wait(min(_SLICE_S, max(0.0, end - time.monotonic()))):
        if time.monotonic() >= end:
            return False
    return True
