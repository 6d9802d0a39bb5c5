"""Joining rank threads, and stopping them: the watchdog's deadline, Ctrl-C.

A thread running Python is stopped by an asynchronous exception
(``PyThreadState_SetAsyncExc``); one blocked inside C code cannot be, and is
named with its stack and left behind as a daemon.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from typing import TYPE_CHECKING

from .. import stacks
from ..errors import SimulationError, SimulationTimeout

if TYPE_CHECKING:
    from .world import World

# After the watchdog interrupts stuck ranks, how long to wait for them to
# unwind (also the grace a rank's helpers get at its end; read at call time,
# so tests may shorten it).
GRACE_S = 5.0


def raise_in(thread_id: int, error: type[BaseException]) -> None:
    """Raise ``error`` in the thread ``thread_id`` at its next Python bytecode."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(error))


def join_all(threads: list[threading.Thread], world: World, deadline: float, timeout: float) -> str | None:
    """Join every rank thread; at the watchdog's ``deadline`` (``timeout``
    seconds after ``run`` was called) interrupt the stuck ones.

    Returns the watchdog report when it fired, else None.
    """
    for t in threads:
        join(t, max(0.0, deadline - time.monotonic()))
    alive = [t for t in threads if is_alive(t)]
    if not alive:
        return None
    frames = sys._current_frames()
    # Scheduled, a rank that never got the run token back did not hang: the
    # rank holding it did (or a rank the holder waits on outside simdist).
    queued = world.scheduler.queued_ranks()
    # Stop the ranks first, describe them after (from the frames taken at the
    # deadline): formatting stacks while dozens of busy ranks fight for the
    # GIL took many times the timeout itself.
    signal(
        alive,
        world,
        SimulationTimeout(f"watchdog: the run was still going {timeout:g} s after run() was called"),
    )
    running = [t for t in alive if int(t.name.rsplit("-", 1)[1]) not in queued]
    lines = [f"watchdog: {len(running)} rank(s) still running after {timeout:g} s"]
    stalled = sorted(r for r in queued if is_alive(threads[r]))
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
    still = wait_for(alive)
    if still:
        report += "\n" + stuck_report(still, "the watchdog fired")
    return report


def stuck_report(still: list[threading.Thread], why: str) -> str:
    """Name the threads nothing could stop, with where they are stuck."""
    frames = sys._current_frames()
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


def interrupt(
    threads: list[threading.Thread], world: World, error: SimulationError
) -> list[threading.Thread]:
    """Abort the world, raise ``error``'s type in running ranks, join them.

    Returns the threads that did not stop within the grace period.
    """
    signal(threads, world, error)
    return wait_for(threads)


def signal(threads: list[threading.Thread], world: World, error: SimulationError) -> None:
    world.scheduler.abort(error)
    idents = [t.ident for t in threads if is_alive(t) and t.ident is not None]
    # Helper threads too: a rank waits for its helpers before it ends.
    for rank in range(world.world_size):
        idents += [
            h.thread_id for h in world.scheduler.live_helpers(rank) if h.thread_id and not h.idle
        ]  # idle pool workers leave at their rank's end
    for ident in idents:
        # Interrupts Python-level loops; a thread blocked inside C code stays
        # stuck, and is reported by the caller.
        raise_in(ident, type(error))


def wait_for(threads: list[threading.Thread]) -> list[threading.Thread]:
    grace = time.monotonic() + GRACE_S
    for t in threads:
        join(t, max(0.0, grace - time.monotonic()))
    return [t for t in threads if is_alive(t)]


def is_alive(t: threading.Thread) -> bool:
    done = getattr(t, "simdist_exited", None)
    return t.is_alive() if done is None or not t.ident else not done.is_set()


def join(t: threading.Thread, timeout: float) -> None:
    done = getattr(t, "simdist_exited", None)
    if not t.ident:
        return  # never started (the OS refused a thread, or interrupted while starting)
    if done is None:
        t.join(timeout)
    elif done.wait(timeout):
        t.join(1.0)  # it has left simdist; let the thread itself end
