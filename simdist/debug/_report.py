"""Text about a live run: every rank's state, stacks, flight-record tail."""

from __future__ import annotations

import threading
from typing import Any

from .._core.frames import current_frames
from . import _engine
from ._session import DebugSession, live_sessions


class Text(str):
    """A report that shows as itself at a prompt (``p``, or a bare expression)."""

    def __repr__(self) -> str:
        return str(self)


def rank_states(session: DebugSession) -> list[str]:
    """One line per rank (and helper): running, waiting in which call, finished, failed."""
    lines = []
    prompts = set(session.prompts.values())
    for v in _engine.rank_views(session.world):
        state = v.state
        if v.rank in session.notes:
            state = session.notes[v.rank]
        elif v.rank in prompts:
            state = "at the debugger prompt"
        elif v.state == "waiting" and v.waiting is not None:
            state = f"waiting in {v.waiting}"
        elif v.state == "runnable":
            state = "runnable: ready to go on, waiting for its turn (one rank runs at a time)"
        elif v.state == "failed":
            failure = session.world.scheduler._slots[v.rank].failure
            state = f"failed: {failure}" if failure else "failed (released by a peer's failure)"
        lines.append(f"rank {v.rank} ({v.where}): {state}")
        for h in v.helpers:
            lines.append(
                f"    helper thread {h.name!r}: {'running' if h.waiting is None else 'waiting in ' + h.waiting}"
            )
    return lines


def stacks_text(session: DebugSession, ranks: list[int] | None = None, *, headline: str | None = None) -> str:
    """Every rank's (and helper's) user stack, innermost last, as the deadlock report shows them."""
    frames = current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    states = rank_states(session)
    lines = [headline or f"simdist {session.name}: every rank's stack (innermost last)"]
    for v in _engine.rank_views(session.world):
        if ranks is not None and v.rank not in ranks:
            continue
        lines.append("  " + _state_line(states, v.rank) + _thread_note(v.thread_id, names))
        lines.extend("      " + s for s in _engine.user_stack(frames.get(v.thread_id or -1)))
        for h in v.helpers:
            what = "running" if h.waiting is None else f"waiting in {h.waiting}"
            lines.append(f"    helper thread {h.name!r}: {what}" + _thread_note(h.thread_id, names))
            lines.extend("        " + s for s in _engine.user_stack(frames.get(h.thread_id or -1)))
    return "\n".join(lines)


def _state_line(states: list[str], rank: int) -> str:
    return next(line for line in states if line.startswith(f"rank {rank} "))


def _thread_note(ident: int | None, names: dict[Any, str]) -> str:
    if ident is None:
        return ""
    # faulthandler names threads by this hex id: lets its dump be matched to ranks.
    return f"  [thread {names.get(ident, '?')}, 0x{ident:016x}]"


def tail_text(session: DebugSession, rank: int | None = None, last: int = 8) -> str:
    return _engine.flight_tail(session.world, None if rank is None else [rank], last)


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
