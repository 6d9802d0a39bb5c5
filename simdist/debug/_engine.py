"""Everything the debugger reads from the engine, in one place.

The engine (scheduler, world, recorder) is being rebuilt; what debugging needs
from it is this small surface: each rank's state and thread, its helpers, what
it waits on, its coordinates and its flight record. Port this file, not the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import FrameType
from typing import Any

from .. import stacks
from .._core.frames import current_frames


@dataclass
class HelperView:
    name: str
    thread_id: int | None
    waiting: str | None  # what it waits on, or None when running


@dataclass
class RankView:
    rank: int
    where: str  # coordinates, e.g. "tp=1 cp=0 dp=0 pp=0"
    state: str  # running, runnable (scheduled, without the token), waiting, finished, failed
    waiting: str | None  # the call it waits in, with group and seq
    thread_id: int | None
    helpers: list[HelperView]


def rank_views(world: Any) -> list[RankView]:
    sched = world.scheduler
    # Scheduled, a running rank without the run token is runnable, not running.
    # Read without the scheduler's lock: a SIGUSR1 dump runs in the main
    # thread, which may hold it when the signal arrives (a report may be racy,
    # it must not deadlock).
    slots = sched._slots.ranks
    holder = getattr(sched._turns, "_holder", None)  # the run token's holder (scheduled mode only)
    queued = (
        {r for r, s in enumerate(slots) if s.state.value == "running" and r != holder}
        if sched.scheduled
        else set()
    )
    views = []
    for rank, slot in enumerate(slots):
        waiting = None
        if slot.waiting_on is not None and slot.state.value == "waiting":
            w = slot.waiting_on
            needed = list(w.needed_ranks())
            waiting = w.describe() + (f"; still missing rank(s) {needed}" if needed else "")
        helpers = [
            HelperView(h.name, h.thread_id, None if h.waiting_on is None else h.waiting_on.describe())
            for h in list(slot.helpers)
        ]
        state = "runnable" if rank in queued else slot.state.value
        if slot.interrupt is not None:
            state = f"interrupted: raises {type(slot.interrupt).__name__} when it runs again"
        views.append(RankView(rank, world.describe_rank(rank), state, waiting, slot.thread_id, helpers))
    return views


def frame_of(thread_id: int | None) -> FrameType | None:
    if thread_id is None:
        return None
    return current_frames().get(thread_id)


def innermost_user_frame(frame: FrameType | None) -> FrameType | None:
    """The nearest frame of the user's program at or above ``frame``."""
    while frame is not None:
        if stacks._is_user(os.path.abspath(frame.f_code.co_filename)):
            return frame
        frame = frame.f_back
    return None


def flight_tail(world: Any, ranks: list[int] | None, last: int) -> str:
    return str(world.recorder.tail(ranks, last=last))


def write_trace(world: Any, path: str) -> None:
    world.recorder.write_chrome_trace(path, world.describe_rank)


def user_stack(frame: FrameType | None) -> list[str]:
    return stacks.user_stack(frame, limit=40)


def consequence_of_peer(exc: BaseException, rank: int) -> int | None:
    """The failed rank ``exc`` passes on, or None when it is ``rank``'s own."""
    from .._core.records import consequence_origin

    return consequence_origin(exc, rank)


def recorded(world: Any) -> list[tuple[int, BaseException]]:
    """simdist errors raised inside ranks so far (deadlocks, mismatches), in order."""
    return list(world.scheduler.recorded)
