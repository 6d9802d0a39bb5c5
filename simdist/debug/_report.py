"""Text about live runs (every rank's state, stacks, flight-record tails) and
``dump()``, which prints it on demand and on SIGUSR1 without stopping anything.

What debugging reads of the engine (the scheduler's slots, the run token's
holder, the recorder) is read here.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, TextIO

from .. import stacks
from .._core.frames import current_frames
from ._session import DebugSession, live_sessions


class Text(str):
    """A report that shows as itself at a prompt (``p``, or a bare expression)."""

    def __repr__(self) -> str:
        return str(self)


# A rank's state line, its thread, and each helper's line and thread.
RankLines = tuple[str, int | None, list[tuple[str, int | None]]]


def _rank_lines(session: DebugSession) -> list[RankLines]:
    """Per rank: running, runnable, waiting in which call, finished, failed."""
    world = session.world
    sched = world.scheduler
    # Read without the scheduler's lock: a SIGUSR1 dump runs in the main
    # thread, which may hold it when the signal arrives (a report may be racy,
    # it must not deadlock).
    slots = sched._slots.ranks
    holder = getattr(sched._turns, "_holder", None)  # the run token's holder (scheduled mode only)
    prompts = set(session.prompts.values())
    out: list[RankLines] = []
    for rank, slot in enumerate(slots):
        state = slot.state.value
        if rank in session.notes:
            state = session.notes[rank]
        elif rank in prompts:
            state = "at the debugger prompt"
        elif slot.interrupt is not None:
            state = f"interrupted: raises {type(slot.interrupt).__name__} when it runs again"
        elif state == "waiting" and slot.waiting_on is not None:
            needed = list(slot.waiting_on.needed_ranks())
            state = f"waiting in {slot.waiting_on.describe()}" + (
                f"; still missing rank(s) {needed}" if needed else ""
            )
        elif state == "running" and sched.scheduled and rank != holder:
            # Scheduled, a running rank without the run token is runnable, not running.
            state = "runnable: ready to go on, waiting for its turn (one rank runs at a time)"
        elif state == "failed":
            state = f"failed: {slot.failure}" if slot.failure else "failed (released by a peer's failure)"
        helpers = [
            (
                f"    helper thread {h.name!r}: "
                + ("running" if h.waiting_on is None else "waiting in " + h.waiting_on.describe()),
                h.thread_id,
            )
            for h in list(slot.helpers)
        ]
        out.append((f"rank {rank} ({world.describe_rank(rank)}): {state}", slot.thread_id, helpers))
    return out


def live_frame(session: DebugSession, rank: int) -> FrameType | None:
    """The frame ``rank``'s thread runs or waits in now (None: no thread)."""
    thread_id = session.world.scheduler._slots.ranks[rank].thread_id
    return None if thread_id is None else current_frames().get(thread_id)


def innermost_user_frame(frame: FrameType | None) -> FrameType | None:
    """The nearest frame of the user's program at or above ``frame``."""
    while frame is not None:
        if stacks._is_user(os.path.abspath(frame.f_code.co_filename)):
            return frame
        frame = frame.f_back
    return None


def rank_states(session: DebugSession) -> list[str]:
    """One line per rank (and helper): running, waiting in which call, finished, failed."""
    lines = []
    for line, _, helpers in _rank_lines(session):
        lines.append(line)
        lines.extend(helper for helper, _ in helpers)
    return lines


def stacks_text(session: DebugSession, ranks: list[int] | None = None, *, headline: str | None = None) -> str:
    """Every rank's (and helper's) user stack, innermost last, as the deadlock report shows them."""
    frames = current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = [headline or f"simdist {session.name}: every rank's stack (innermost last)"]
    for rank, (line, thread_id, helpers) in enumerate(_rank_lines(session)):
        if ranks is not None and rank not in ranks:
            continue
        lines.append("  " + line + _thread_note(thread_id, names))
        lines.extend("      " + s for s in stacks.user_stack(frames.get(thread_id or -1), limit=40))
        for helper, helper_id in helpers:
            lines.append(helper + _thread_note(helper_id, names))
            lines.extend("        " + s for s in stacks.user_stack(frames.get(helper_id or -1), limit=40))
    return "\n".join(lines)


def _thread_note(ident: int | None, names: dict[Any, str]) -> str:
    if ident is None:
        return ""
    # faulthandler names threads by this hex id: lets its dump be matched to ranks.
    return f"  [thread {names.get(ident, '?')}, 0x{ident:016x}]"


def tail_text(session: DebugSession, rank: int | None = None, last: int = 8) -> str:
    return str(session.world.recorder.tail(None if rank is None else [rank], last=last))


def dump_text() -> str:
    """Every live run's ranks and helpers, with stacks and flight-record tails."""
    sessions = live_sessions()
    if not sessions:
        return "simdist: no run is in progress"
    parts = []
    for s in sessions:
        parts.append(stacks_text(s, headline=f"simdist {s.name}: stacks on demand (innermost last)"))
        parts.append(tail_text(s, last=4))
    return "\n".join(parts)


_stream_lock = threading.Lock()
_stream: TextIO | None = None  # where SIGUSR1 writes (pytest: the terminal, past its capture)


def set_stream(stream: TextIO | None) -> None:
    global _stream
    with _stream_lock:
        _stream = stream


def dump(file: TextIO | None = None) -> Text:
    """Print every live run's ranks and helpers (state, call with group and seq,
    stack with coordinates, flight-record tail) to ``file`` (default: stderr,
    or the terminal under pytest) and return the text. Safe from any thread,
    the stuck run goes on."""
    text = Text(dump_text())
    out = file or _stream or sys.stderr
    try:
        out.write(text + "\n")
        out.flush()
    except (OSError, ValueError):  # a closed stream: the text is still returned
        pass
    return text


def _on_signal(signum: int, frame: Any) -> None:
    dump()


def install_signal_handler(signum: int | None = None) -> None:
    """Print ``dump()`` on ``signum`` (default SIGUSR1); call from the main thread.

    simdist installs it at a run's start when nothing else handles SIGUSR1."""
    signal.signal(signal.SIGUSR1 if signum is None else signum, _on_signal)
