"""torch's profiler keeps one session per process: one thread at a time may profile.

``torch.autograd.profiler.profile`` and ``torch.profiler.profile`` run on
Kineto, whose activity profiler is a process singleton: a second session
prepared or enabled on another thread while one is open corrupts it, and
the interpreter crashes (SIGSEGV) when either is closed. A real world runs
each rank in its own process, so every rank may profile at once; simdist's
ranks are threads of one process, and under the default schedule a rank
that profiles a collective is still inside its session when the next rank
enters its own.

Making each rank's session its own would need a Kineto per thread (the
RecordFunction callbacks are per thread; the session they report to is
not), so simdist refuses instead of crashing: while runs are in progress,
opening a session on a thread while another thread's is open raises
``UnsupportedOperationError`` in the thread that tries, naming the holder.
Sessions one after another, on any threads (rank 0 profiles, then rank 1),
work. The caller's own session, open when a run starts, counts as open.

A rank that ends with its session still open (``prof.__enter__()`` without
``__exit__``) would leave it to its parked thread's next run and keep the
process's one session taken: ``close_left_open`` closes it, on the thread
that opened it; helper threads call it as they end, and the rank-thread
reset of ``_core/pool`` is where a rank's main thread should call it.
"""

from __future__ import annotations

import threading
from typing import Any

import torch.autograd.profiler as autograd_profiler

from .._core.identity import me
from ..errors import UnsupportedOperationError
from . import patches

__all__ = ["close_left_open", "holder"]

_PATCHED = ("_prepare_profiler", "_enable_profiler", "_disable_profiler")
_originals: dict[str, Any] = {}
_lock = threading.Lock()
# The thread whose session is open (its ident and a description), or None.
_holder: tuple[int, str] | None = None


def _describe() -> str:
    world, rank = me.world, me.rank
    thread = threading.current_thread().name
    if world is None:
        return f"thread {thread!r} (not a rank)"
    helper = "" if me.helper is None else f", helper thread {thread!r}"
    return f"rank {rank}{helper}"


def holder() -> str | None:
    """Who holds the process's profiling session now (None: nobody), for reports and tests."""
    with _lock:
        return None if _holder is None else _holder[1]


def _claim() -> None:
    global _holder
    ident = threading.get_ident()
    with _lock:
        if _holder is None:
            _holder = (ident, _describe())
            return
        if _holder[0] == ident:
            return
        held_by = _holder[1]
    raise UnsupportedOperationError(
        f"{_describe()} opened a torch profiler session while {held_by} still has one open: "
        f"torch's profiler (Kineto) keeps one session per process, and two at once crash the "
        f"interpreter. In a real world each rank is a process; under simdist profile one rank "
        f"at a time (for example only rank 0, or one rank after another), or run the program "
        f"in a real world (simdist.launch, torchrun)"
    )


def _release() -> None:
    global _holder
    with _lock:
        if _holder is not None and _holder[0] == threading.get_ident():
            _holder = None


def _prepare_profiler(*args: Any, **kwargs: Any) -> Any:
    _claim()
    try:
        return _originals["_prepare_profiler"](*args, **kwargs)
    except BaseException:
        _release()
        raise


def _enable_profiler(*args: Any, **kwargs: Any) -> Any:
    _claim()
    try:
        return _originals["_enable_profiler"](*args, **kwargs)
    except BaseException:
        _release()
        raise


def _disable_profiler(*args: Any, **kwargs: Any) -> Any:
    try:
        return _originals["_disable_profiler"](*args, **kwargs)
    finally:
        _release()


def close_left_open() -> bool:
    """Close the calling thread's profiling session if it is still open
    (a rank or helper thread at its end); True if there was one. The events
    are dropped: nobody is left to read them."""
    import torch.autograd

    if not torch.autograd._profiler_enabled():
        return False
    try:
        (_originals.get("_disable_profiler") or torch.autograd._disable_profiler)()
    finally:
        _release()
    return True


def install() -> None:
    global _holder
    _originals.update({name: getattr(autograd_profiler, name) for name in _PATCHED})
    for name in _PATCHED:
        setattr(autograd_profiler, name, globals()[name])
    import torch.autograd

    # The first run's caller may be inside a session of its own (a profiler
    # around simdist.run): its thread holds the process's session.
    with _lock:
        if _holder is None and torch.autograd._profiler_enabled():
            _holder = (threading.get_ident(), f"the caller's thread {threading.current_thread().name!r}")


def uninstall() -> None:
    global _holder
    for name in _PATCHED:
        setattr(autograd_profiler, name, _originals[name])
    with _lock:
        # Outside runs nothing is tracked: the next run looks afresh.
        _holder = None


patches.register("profiler", install, uninstall, [(autograd_profiler, name) for name in _PATCHED])
