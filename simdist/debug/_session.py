"""One run's debugging state: who is in a debugger, the paused clock, break_at's count.

While any thread of the run sits at a debugger prompt the world is paused:
the watchdog's deadline moves on by the time spent there, ranks that reach
simdist wait at the door (in the default schedule they are frozen anyway: the
rank at the prompt holds the run token), and no peer is released, since the
rank at the prompt is, to the scheduler, still running.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
import weakref
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from ._options import Settings

# How often a paused world's watchdog, and a rank waiting at the door, look again.
_PAUSE_POLL_S = 0.1

_live: weakref.WeakSet[DebugSession] = weakref.WeakSet()
_live_lock = threading.Lock()
_names = itertools.count(1)


class DebugSession:
    """Attached to a world as ``world.debug`` for the whole run."""

    def __init__(self, world: Any, settings: Settings, body_name: str = "simdist-run") -> None:
        # Weakly: the world holds its session (world.debug), and a run leaves no cycle.
        self._world = weakref.ref(world)
        self.settings = settings
        self.body_name = body_name  # names a failure trace outside pytest
        self.name = f"run #{next(_names)}"
        self._cond = threading.Condition()
        self._open = 0  # debugger prompts open now
        self._since = 0.0
        self.prompts: dict[int, int] = {}  # thread ident -> the rank whose prompt it shows
        self.post_mortem_done = False
        self.break_seen = 0  # calls that matched break_at so far
        self.break_hit = False
        # Tracebacks of ranks that failed during the run (for `rank N` at a prompt).
        self.failed_tb: dict[int, TracebackType | None] = {}
        self.notes: dict[int, str] = {}  # what the state table says of a rank instead
        self.ended = False
        with _live_lock:
            _live.add(self)

    @property
    def world(self) -> Any:
        world = self._world()
        if world is None:
            raise RuntimeError(f"simdist debug: {self.name}'s world has ended")
        return world

    # -- the paused clock ------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._open > 0

    @contextlib.contextmanager
    def pause(self, rank: int) -> Iterator[None]:
        """The world stands still while the block (a debugger prompt) runs."""
        me = threading.get_ident()
        with self._cond:
            if self._open == 0:
                self._since = time.monotonic()
            self._open += 1
            outer = self.prompts.get(me)
            self.prompts[me] = rank
        try:
            yield
        finally:
            with self._cond:
                self._open -= 1
                if outer is None:
                    self.prompts.pop(me, None)
                else:
                    self.prompts[me] = outer
                if self._open == 0:
                    # The watchdog and a rank's helper grace read the deadline.
                    self.world.deadline += time.monotonic() - self._since
                    self._cond.notify_all()

    def time_left(self) -> float:
        """Seconds until the watchdog fires; while paused, only a poll interval."""
        if self.paused:
            return _PAUSE_POLL_S
        return float(self.world.deadline) - time.monotonic()

    def wait_at_door(self) -> None:
        """A thread reaching simdist while another sits at a prompt waits there
        (bounded polls: an aborted world lets it go on, to fail)."""
        if not self.paused or threading.get_ident() in self.prompts:
            return
        with self._cond:
            while self._open > 0 and self.world.scheduler.aborted is None:
                self._cond.wait(_PAUSE_POLL_S)

    # -- helpers for prompts ----------------------------------------------

    def prompt_for(self, rank: int) -> str:
        where = self.world.describe_rank(rank)
        label = where if where.startswith("rank ") else f"rank {rank}: {where}"
        return f"(Pdb {label}) "

    # -- traces of failing runs -------------------------------------------

    def write_failure_trace(self) -> str | None:
        folder = self.settings.trace_dir
        if folder is None:
            return None
        os.makedirs(folder, exist_ok=True)
        stem = self.settings.trace_name or f"{self.body_name}-{os.getpid()}"
        path = os.path.join(folder, re.sub(r"[^\w.-]+", "_", stem)[:120] + ".json")
        self.world.recorder.write_chrome_trace(path, self.world.describe_rank)
        if self.settings.on_trace is not None:
            self.settings.on_trace(path)
        return path

    def end(self) -> None:
        self.ended = True
        self.failed_tb.clear()  # frames (and their tensors) need not outlive the run
        with _live_lock:
            _live.discard(self)


def live_sessions() -> list[DebugSession]:
    with _live_lock:
        return sorted((s for s in _live if not s.ended), key=lambda s: s.name)


def session_of_thread() -> tuple[DebugSession | None, int]:
    """The run and rank of the calling thread (a rank or one of its helpers),
    else the run whose prompt this thread shows, else (None, -1)."""
    from .._backend.current import current_world

    try:
        world, rank = current_world()
    except Exception:
        world, rank = None, -1
    session = getattr(world, "debug", None)
    if isinstance(session, DebugSession):
        return session, rank
    me = threading.get_ident()
    for s in live_sessions():
        if me in s.prompts:
            return s, s.prompts[me]
    return None, -1
