"""pdb, rank-aware: the prompt names the rank, the world pauses, commands look at other ranks.

Every ``pdb.Pdb`` (``breakpoint()``, pytest's own, simdist's post-mortem)
that stops in a rank thread pauses that rank's world while its prompt is open
and learns five commands: ``ranks``, ``stacks [N]``, ``tail [N]``,
``rank N`` and ``dump``. simdist's own debugger (``RankPdb``) opens
post-mortems and ``break_at`` stops.
"""

from __future__ import annotations

import bdb
import contextlib
import pdb
import sys
import types
from types import FrameType, TracebackType
from typing import Any

from .._isolation import patches
from . import _report
from ._report import innermost_user_frame
from ._session import DebugSession, session_of_thread

# Frames a step from a break_at stop never stops in: simdist's and torch's plumbing.
_SKIP = ["simdist", "simdist.*", "torch", "torch.*", "threading", "contextlib"]

BANNER = (
    "  every other rank is frozen where it is; the world and its watchdog are paused while "
    "this prompt is open.\n"
    "  simdist commands: ranks (every rank's state), stacks [N], tail [N] (flight record), "
    "rank N (look into rank N's frames; rank alone: back), dump"
)
_COMMANDS = ("do_ranks", "do_stacks", "do_tail", "do_dump", "do_rank")


class _Commands:
    """pdb commands about the other ranks (bound to any Pdb that stops in a rank)."""

    _simdist_session: DebugSession
    _simdist_rank: int
    _simdist_home: tuple[Any, int, str] | None

    def do_ranks(self: Any, arg: str) -> None:
        """ranks: every rank's state (running, waiting in which call with group and seq, finished, failed)."""
        self.message("\n".join(_report.rank_states(self._simdist_session)))

    def do_stacks(self: Any, arg: str) -> None:
        """stacks [N]: every rank's (or rank N's) stack and its helpers', innermost last."""
        rank = _rank_arg(self, arg) if arg.strip() else None
        if arg.strip() and rank is None:
            return
        self.message(_report.stacks_text(self._simdist_session, None if rank is None else [rank]))

    def do_tail(self: Any, arg: str) -> None:
        """tail [N]: the last calls of every rank (or rank N) from the flight recorder."""
        rank = _rank_arg(self, arg) if arg.strip() else None
        if arg.strip() and rank is None:
            return
        self.message(_report.tail_text(self._simdist_session, rank))

    def do_dump(self: Any, arg: str) -> None:
        """dump: every live run's ranks and helpers with stacks (what SIGUSR1 prints)."""
        self.message(_report.dump_text())

    def do_rank(self: Any, arg: str) -> None:
        """rank [N]: show rank N's frames (where, up, down, p, ll then act on them);
        rank alone goes back to this prompt's own rank."""
        session = self._simdist_session
        if self._simdist_home is None:
            self._simdist_home = (self.stack, self.curindex, self.prompt)
        rank = _rank_arg(self, arg) if arg.strip() else self._simdist_rank
        if rank is None:
            return
        if rank == self._simdist_rank:
            _show(self, *self._simdist_home)
            return
        tb = session.failed_tb.get(rank)
        frame = _report.live_frame(session, rank)
        if innermost_user_frame(frame) is not None:
            stack, index = self.get_stack(frame, None)
        elif tb is not None:
            stack, index = self.get_stack(None, tb)
        else:
            self.error(
                f"rank {rank} has no frames of the program to show (it has not started its body, or has returned)"
            )
            return
        _show(self, stack, index, session.prompt_for(rank))


def _rank_arg(p: Any, arg: str) -> int | None:
    n = p._simdist_session.world.world_size
    try:
        rank = int(arg.strip())
    except ValueError:
        p.error(f"expected a rank number from 0 to {n - 1}, got {arg.strip()!r}")
        return None
    if not 0 <= rank < n:
        p.error(f"rank {rank} is not in this world (ranks 0 to {n - 1})")
        return None
    return rank


def _show(p: Any, stack: Any, index: int, prompt: str) -> None:
    p.stack, p.curindex = stack, index
    p.curframe = stack[index][0]
    p.curframe_locals = p.curframe.f_locals
    p.lineno = None
    p.prompt = prompt
    p.print_stack_entry(stack[index])


def _user_index(stack: list[tuple[FrameType, int]], index: int) -> int:
    """The innermost frame of the user's program at or above ``index``."""
    j = index
    while j > 0 and innermost_user_frame(stack[j][0]) is not stack[j][0]:
        j -= 1
    return j if innermost_user_frame(stack[j][0]) is stack[j][0] else index


class _Current:
    """``sys.stdin``/``sys.stdout`` as they are when used."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(getattr(sys, self._name), attr)


class RankPdb(_Commands, pdb.Pdb):
    """simdist's debugger for one rank: starts in the user's frame, not in simdist's."""

    def __init__(self, session: DebugSession, rank: int, owner: int | None = None) -> None:
        # The streams of the moment the prompt shows, not of construction:
        # pytest swaps them when it suspends and resumes its capture.
        streams: Any = (_Current("stdin"), _Current("stdout"))
        super().__init__(stdin=streams[0], stdout=streams[1], skip=_SKIP, nosigint=True, readrc=False)
        self.banner: str | None = None  # printed when the prompt first opens
        self._simdist_session = session
        self._simdist_rank = rank  # whose frames the prompt shows
        self._simdist_owner = rank if owner is None else owner  # whose thread runs it
        self._simdist_home = None
        self.prompt = session.prompt_for(rank)

    def get_stack(self, f: FrameType | None, t: TracebackType | None) -> tuple[Any, int]:
        stack, index = super().get_stack(f, t)
        return stack, _user_index(stack, index)

    @property
    def stepping(self) -> bool:
        """Whether the prompt ended asking for a stop (step, next, return,
        until): continue sets bdb's "never stop" line number, -1; quit sets
        ``quitting``."""
        return not self.quitting and self.stoplineno != -1

    def trace_from(self, frame: FrameType) -> None:
        """Keep stepping after a live stop (as ``set_trace`` would), keeping
        the stop the last command asked for (next, step, return, until)."""
        stop = (self.stopframe, self.returnframe, self.stoplineno)
        f: FrameType | None = sys._getframe().f_back
        while f is not None:
            f.f_trace = self.trace_dispatch
            self.botframe = f
            f = f.f_back
        self.stopframe, self.returnframe, self.stoplineno = stop
        sys.settrace(self.trace_dispatch)


# -- every Pdb that stops in a rank ---------------------------------------

_original: dict[str, Any] = {}  # pdb.Pdb.interaction without the patch


def _interaction(self: pdb.Pdb, frame: FrameType | None, tb: TracebackType | None) -> Any:
    session: DebugSession | None = getattr(self, "_simdist_session", None)
    rank = getattr(self, "_simdist_rank", -1)
    owner = getattr(self, "_simdist_owner", rank)
    adopted = False
    if session is None:
        session, rank = session_of_thread()
        if session is None or rank < 0 or session.ended:
            return _original["interaction"](self, frame, tb)
        adopted, owner = True, rank
        _adopt(self, session, rank)
        self.message(f"simdist: {session.prompt_for(rank).strip('() ')} stopped here.\n{BANNER}")
    self._simdist_home = None  # type: ignore[attr-defined]  # simdist's state on the user's Pdb object
    prompt = self.prompt
    self.prompt = session.prompt_for(rank)
    # pytest's own Pdb suspends its capture itself; simdist's asks the run's settings.
    ours = isinstance(self, RankPdb)
    try:
        factory = session.settings.around_prompt if ours else None
        with factory() if factory is not None else contextlib.nullcontext(), session.pause(owner):
            banner = getattr(self, "banner", None)
            if ours and banner is not None:
                self.message(banner)
                self.banner = None  # type: ignore[attr-defined]  # a Pdb subclass's banner (pdb++ and friends), cleared once shown
            return _original["interaction"](self, frame, tb)
    finally:
        self.prompt = prompt
        if adopted:
            _unadopt(self)


def _adopt(p: pdb.Pdb, session: DebugSession, rank: int) -> None:
    p._simdist_session = session  # type: ignore[attr-defined]  # simdist's state on the user's Pdb object
    p._simdist_rank = rank  # type: ignore[attr-defined]  # simdist's state on the user's Pdb object
    for name in _COMMANDS:
        setattr(p, name, types.MethodType(getattr(_Commands, name), p))


def _unadopt(p: pdb.Pdb) -> None:
    for name in ("_simdist_session", "_simdist_rank", *_COMMANDS):
        p.__dict__.pop(name, None)


# Every Pdb that stops in a rank thread is rank-aware while runs are in
# progress: outside rank threads the replacement calls the original and
# changes nothing (kept in _original after removal: a prompt opened just
# before still calls it).
patches.register_swap("debugger", _original, [(pdb.Pdb, "interaction", _interaction)])


# -- simdist's own stops ---------------------------------------------------


def post_mortem(session: DebugSession, rank: int, exc: BaseException, shown: int) -> str:
    """The debugger in the failing rank's frame (or, for a deadlock or
    mismatch found elsewhere, in ``shown``'s frame that made the call).
    Returns "quit" or "continued"."""
    frame = None
    if shown != rank:
        frame = innermost_user_frame(_report.live_frame(session, shown))
        if frame is None:
            shown = rank
    p = RankPdb(session, shown, owner=rank)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    who = session.world.describe_rank(rank)
    head = f"simdist post-mortem: rank {rank} ({who}) failed: {type(exc).__name__}: {first}"
    if shown != rank:
        head += (
            f"\n  showing rank {shown} ({session.world.describe_rank(shown)}), the first rank of the "
            f"report, in the frame that made the call"
        )
    p.banner = f"{head}\n{BANNER}\n  c or q ends the run as the failure it is"
    session.notes[rank] = f"failed with {type(exc).__name__}: {first} (its post-mortem prompt is open)"
    p.reset()
    p.interaction(frame, None if frame is not None else exc.__traceback__)
    return "quit" if p.quitting else "continued"


def break_here(session: DebugSession, rank: int, what: str) -> None:
    """Stop ``rank`` just before the call ``what``, in the user's frame that makes it."""
    frame = innermost_user_frame(sys._getframe(2))
    p = RankPdb(session, rank)
    p.banner = (
        f"simdist break_at: rank {rank} ({session.world.describe_rank(rank)}) stops just before "
        f"{what}\n{BANNER}\n  c lets the call go on; n steps over it; q ends the run"
    )
    p.reset()
    p.interaction(frame, None)
    if p.quitting:
        if session.settings.on_post_mortem is not None:
            session.settings.on_post_mortem("quit")
        raise bdb.BdbQuit
    if p.stepping and frame is not None:
        p.trace_from(frame)
