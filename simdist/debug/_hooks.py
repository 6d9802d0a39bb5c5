"""The calls the engine makes into the debugger (each marked ``# debug hook:`` there).

Each is cheap when no debugging was asked for: a run without ``post_mortem``,
``break_at`` or a failure-trace folder pays an attribute read per call.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # CPython's C half of signal
import bdb
import signal
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from .._core.records import consequence_origin
from . import _pdb, _report
from ._options import Settings, resolve
from ._session import DebugSession

options = resolve  # run's debugging arguments over the defaults, checked before any rank starts


def keep_trace(settings: Settings) -> bool:
    """Whether the recorder must keep every call (a failing run's trace is written)."""
    return settings.trace_dir is not None


def attach(world: Any, settings: Settings, fn: Callable[..., Any]) -> DebugSession:
    _install_signal_handler()
    session = DebugSession(world, settings, getattr(fn, "__qualname__", "simdist-run"))
    world.debug = session
    return session


_USR1 = getattr(signal, "SIGUSR1", None)
# signal.getsignal wraps the C call to turn an int into its enum member
# (~4 us, at every run); compared with SIG_DFL, the int answers the same.
_getsignal: Any = getattr(_signal, "getsignal", signal.getsignal)


def _install_signal_handler() -> None:
    # Only from the main thread (the only one that may set handlers), and
    # never over a handler someone else set.
    if _USR1 is not None and threading.current_thread() is threading.main_thread():
        if _getsignal(_USR1) in (signal.SIG_DFL, None):
            _report.install_signal_handler()


def time_left(world: Any, deadline: float) -> float:
    """Seconds to the watchdog's deadline; a paused world answers a poll interval."""
    session = getattr(world, "debug", None)
    if session is None:
        return deadline - time.monotonic()
    return session.time_left()


def before_call(world: Any, rank: int, op: str, group: Any, seq: int) -> None:
    """A rank is about to join a call: wait while another rank's prompt is
    open; stop here when this is the call ``break_at`` names."""
    session: DebugSession | None = getattr(world, "debug", None)
    if session is None:
        return
    if session.paused:
        session.wait_at_door()
    spec = session.settings.break_at
    if spec is None or session.break_hit or not spec.matches(rank, op, group.label, seq):
        return
    session.break_seen += 1
    if session.break_seen < spec.nth:
        return
    session.break_hit = True
    if _stopped_before(session.settings, "break_at"):
        return
    seq_text = "" if seq < 0 else f" seq {seq}"
    _pdb.break_here(session, rank, f"{spec.describe()}: {op} on {group.describe()}{seq_text}")


def rank_failed(world: Any, rank: int, exc: BaseException) -> None:
    """A rank's body raised and its peers are not released yet: the post-mortem, if asked for."""
    session: DebugSession | None = getattr(world, "debug", None)
    if session is None:
        return
    session.failed_tb[rank] = exc.__traceback__
    session.wait_at_door()
    settings = session.settings
    if not settings.post_mortem or world.scheduler.aborted is not None or not _debuggable(exc, rank):
        return
    with session._cond:
        if session.post_mortem_done or _stopped_before(settings, "post_mortem"):
            return
        session.post_mortem_done = True
    verdict = _pdb.post_mortem(session, rank, exc, _first_of_report(world, rank, exc))
    if settings.on_post_mortem is not None:
        settings.on_post_mortem(verdict)


def _stopped_before(settings: Settings, what: str) -> bool:
    """Whether an earlier run of the same defaults() block already stopped for ``what``."""
    if settings.stopped is None:
        return False
    if settings.stopped.get(what):
        return True
    settings.stopped[what] = True
    return False


def _debuggable(exc: BaseException, rank: int) -> bool:
    """A failure of the rank's own (not a peer's passed on, not a quit or an outcome)."""
    if isinstance(exc, (bdb.BdbQuit, KeyboardInterrupt, SystemExit)):
        return False
    if type(exc).__module__ == "_pytest.outcomes":  # pytest.skip/xfail/exit/fail's own
        return type(exc).__name__ == "Failed"
    return consequence_origin(exc, rank) is None


def _first_of_report(world: Any, rank: int, exc: BaseException) -> int:
    """For an error simdist reports world-wide (a deadlock, a mismatch), the
    lowest rank it was recorded for: the first rank of the report."""
    ranks = [r for r, e in list(world.scheduler.recorded) if type(e) is type(exc) and e.args == exc.args]
    return min(ranks) if ranks else rank


def outcome(world: Any, decide: Callable[[], list[Any]]) -> list[Any]:
    """Decide the run's outcome; a failing run writes its trace when asked to."""
    session: DebugSession | None = getattr(world, "debug", None)
    try:
        return decide()
    except BaseException as exc:
        path = None
        if session is not None and session.settings.trace_dir is not None:
            try:
                path = session.write_failure_trace()
            except OSError as err:  # never hide the run's own outcome behind it
                warnings.warn(f"simdist: the failure trace could not be written: {err}", stacklevel=2)
        if path is not None and hasattr(exc, "add_note"):
            exc.add_note(f"simdist: Perfetto trace of this failing run: {path}")
        raise
    finally:
        if session is not None:
            _warn_unreached(session)
            session.end()


def _warn_unreached(session: DebugSession) -> None:
    spec = session.settings.break_at
    if spec is not None and not session.break_hit and session.settings.break_at_explicit:
        warnings.warn(
            f"break_at never stopped: {spec.describe()} was not reached (rank {spec.rank} made "
            f"{session.break_seen} matching call(s))",
            stacklevel=4,
        )
