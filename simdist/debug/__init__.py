"""Debugging a failing rank: post-mortem in its frame, a paused world, break_at, stacks on demand.

From a debugger prompt in a rank (or any thread, while a run is live)::

    simdist.debug.ranks()        every rank's state: running, waiting in which call, finished, failed
    simdist.debug.stacks(1)      rank 1's stack (all ranks' without an argument), helpers included
    simdist.debug.tail(1)        rank 1's last calls (flight recorder)
    simdist.debug.locals_of(1)   the locals of rank 1's innermost frame of the program
    simdist.debug.frame(1)       that frame itself
    simdist.debug.dump()         everything above for every live run (also on SIGUSR1)

At simdist's prompts the same is one command away: ``ranks``, ``stacks [N]``,
``tail [N]``, ``rank N`` (then ``where``/``up``/``down``/``p`` act on rank
N's frames) and ``dump``.

``simdist.run(..., post_mortem=True)`` and ``break_at={"rank": 1, "op":
"all_reduce", "nth": 3}`` ask for a stop; ``debug.defaults(...)`` asks for it for
every run in a block (``pytest --pdb`` and ``simdist replay --pdb`` use it).
"""

from __future__ import annotations

import traceback
from types import FrameType
from typing import Any

from . import _report
from ._options import KNOWN_OPS, BreakAt, Settings, defaults, parse_break_at
from ._report import Text, dump, innermost_user_frame, install_signal_handler
from ._session import DebugSession, live_sessions, session_of_thread

__all__ = [
    "KNOWN_OPS",
    "BreakAt",
    "Settings",
    "defaults",
    "dump",
    "frame",
    "install_signal_handler",
    "locals_of",
    "parse_break_at",
    "ranks",
    "stacks",
    "tail",
]


def _sessions() -> list[DebugSession]:
    session, _ = session_of_thread()
    if session is not None:
        return [session]
    return live_sessions()


def _one(what: str) -> DebugSession:
    sessions = _sessions()
    if not sessions:
        raise RuntimeError(f"simdist.debug.{what}: no run is in progress")
    if len(sessions) > 1:
        names = ", ".join(s.name for s in sessions)
        raise RuntimeError(
            f"simdist.debug.{what}: {len(sessions)} runs are in progress ({names}); call it from a rank "
            f"of the one you mean (its debugger prompt)"
        )
    return sessions[0]


def _check_rank(session: DebugSession, rank: Any) -> int:
    n = session.world.world_size
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
        raise ValueError(f"rank must be a rank of this world (0 to {n - 1}), got {rank!r}")
    return rank


def ranks() -> Text:
    """Every rank's state in the current run (every live run's from outside one)."""
    sessions = _sessions()
    if not sessions:
        return Text("simdist: no run is in progress")
    parts = []
    for s in sessions:
        parts.append(f"simdist {s.name}:")
        parts.extend("  " + line for line in _report.rank_states(s))
    return Text("\n".join(parts))


def stacks(rank: int | None = None) -> Text:
    """Every rank's (or ``rank``'s) user stack with its helpers', innermost last."""
    session = _one("stacks")
    only = None if rank is None else [_check_rank(session, rank)]
    return Text(_report.stacks_text(session, only))


def tail(rank: int | None = None, last: int = 8) -> Text:
    """The last ``last`` calls of every rank (or ``rank``) from the flight recorder."""
    session = _one("tail")
    return Text(_report.tail_text(session, None if rank is None else _check_rank(session, rank), last))


def frame(rank: int) -> FrameType:
    """``rank``'s innermost frame of the program: where it runs or waits now,
    or where it failed."""
    session = _one("frame")
    _check_rank(session, rank)
    found = innermost_user_frame(_report.live_frame(session, rank))
    if found is None and rank in session.failed_tb:
        frames = [f for f, _ in traceback.walk_tb(session.failed_tb[rank])]
        found = next((f for f in reversed(frames) if innermost_user_frame(f) is f), None)
    if found is None:
        raise RuntimeError(f"rank {rank} has no frame of the program (not started, or returned)")
    return found


def locals_of(rank: int) -> dict[str, Any]:
    """A copy of the locals of ``rank``'s innermost frame of the program."""
    return dict(frame(rank).f_locals)
