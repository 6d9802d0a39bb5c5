"""torch's profiler inside ranks: every rank profiles its own thread, all at
once (docs/torch-state.md, "The profiler").

Kineto's activity profiler is a process singleton: two sessions open at once
on two threads crash the interpreter (SIGSEGV) when either is closed. Taking
turns with the one session is no way out: closing a rank's session at a
run-token switch and reopening it at the next frees the records a
RecordFunction still open across the switch writes into when it ends
(measured: a segfault at exit). So a session a rank opens (on its thread or
a helper thread, during a run) runs on torch's thread-local profiler, the one
``torch.autograd.profiler_legacy`` drives, plus an asynchronous event per
backend call, named as gloo names it (``collective``); Kineto's own result
raises ``UnsupportedOperationError``. Sessions outside ranks stay Kineto's;
Kineto reached directly with a session of another thread open is refused in
the thread that tries, naming the holder. A session a thread leaves open is
closed at its end (``close_left_open``), never carried into a parked
thread's next run.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.autograd.profiler as autograd_profiler
from torch._C._profiler import ProfilerConfig, ProfilerState
from torch.autograd.profiler_legacy import _parse_legacy_records
from torch.autograd.profiler_util import EventList, FunctionEvent

from .._core.identity import me
from ..errors import UnsupportedOperationError
from . import patches

__all__ = ["RankProfile", "close_left_open", "collective", "holder"]

_originals: dict[str, Any] = {}
_lock = threading.Lock()
# The thread whose Kineto session is open (its ident and a description), or None.
_holder: tuple[int, str] | None = None


class _RankSession:
    """One rank thread's open session: when it began and the backend's calls it saw."""

    __slots__ = ("calls", "key", "start_ns")

    def __init__(self, start_ns: int, key: tuple[int, int] | None) -> None:
        self.start_ns = start_ns
        self.key = key  # (world, rank) when it is the rank's main thread's
        self.calls: list[tuple[str, list[list[int]], int, int]] = []


# Rank sessions open now, by thread; and by (world, rank) for a rank's main
# thread, where a call issued on another of the rank's threads is recorded.
_sessions: dict[int, _RankSession] = {}
_by_rank: dict[tuple[int, int], _RankSession] = {}
# Any rank session open: the backend's cheap check before it records a call.
active = False


def collective(title: str, inputs: Sequence[torch.Tensor], start_ns: int) -> None:
    """Record one backend call (``gloo:all_reduce``) that began at ``start_ns``
    (``time.perf_counter_ns``) in the session of the calling thread, else of
    its rank's main thread; nothing when neither profiles."""
    session = _sessions.get(threading.get_ident())
    if session is None:
        world = me.world
        if world is None:
            return
        session = _by_rank.get((id(world), me.rank))
        if session is None:
            return
    # gloo records a complex tensor as the real view it sends.
    shapes = [list(torch.view_as_real(t).shape if t.is_complex() else t.shape) for t in inputs]
    session.calls.append((title, shapes, start_ns, time.perf_counter_ns()))


class RankProfile:
    """What a rank's session ends with, in place of Kineto's ``_ProfilerResult``:
    the profile object's ``_parse_kineto_results`` (patched) takes its events."""

    def __init__(self, records: Any, session: _RankSession) -> None:
        self._records = records
        self._session = session
        self._events: list[FunctionEvent] | None = None

    def __bool__(self) -> bool:
        return True

    def function_events(self) -> list[FunctionEvent]:
        if self._events is None:
            events = _parse_legacy_records(self._records)
            thread = next((r.thread_id() for records in self._records for r in records), 0)
            next_id = max((e.id for e in events), default=0) + 1
            start = self._session.start_ns
            for i, (title, shapes, began, ended) in enumerate(self._session.calls):
                events.append(
                    FunctionEvent(
                        id=next_id + i,
                        name=title,
                        trace_name=title,
                        thread=thread,
                        start_us=max(0, began - start) / 1000,
                        end_us=max(0, ended - start) / 1000,
                        input_shapes=shapes,
                        is_async=True,  # gloo's end on its worker thread
                    )
                )
            self._events = events
        return list(self._events)

    def save(self, path: str) -> None:
        """``export_chrome_trace``: the same events, written by torch's own exporter,
        in the object form Kineto writes (``{"traceEvents": [...]}``, what trace
        tools read) rather than the exporter's bare list."""
        EventList(self.function_events()).export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)

    def _refuse(self, what: str) -> UnsupportedOperationError:
        return UnsupportedOperationError(
            f"{what} needs Kineto's result, which a profile taken inside a simdist rank does not "
            f"have: ranks profile on torch's thread-local profiler (Kineto keeps one session per "
            f"process). Its function events (events(), key_averages(), export_chrome_trace) are "
            f"there; for Kineto's own, profile the program in a real world (simdist.launch, torchrun)"
        )

    def events(self) -> Any:
        raise self._refuse("the profile's Kineto events (kineto_results.events())")

    def experimental_event_tree(self) -> Any:
        raise self._refuse("the profile's event tree (experimental_event_tree, the memory timeline)")

    def trace_activities(self) -> Any:
        raise self._refuse("the profile's trace activities (export with use_python_export=True)")

    def trace_start_ns(self) -> Any:
        raise self._refuse("the profile's trace start (trace_start_ns)")


# -- rank sessions: torch's profile methods, patched ---------------------------


def _prepare_trace(self: Any) -> None:
    if me.world is None:
        return _originals["_prepare_trace"](self)
    self.entered = True  # the thread-local profiler has nothing to prepare


def _start_trace(self: Any) -> None:
    world = me.world
    if world is None:
        return _originals["_start_trace"](self)
    global active
    self.entered = True
    autograd_profiler._run_on_profiler_start()
    cuda = self.use_device == "cuda" and torch.cuda.is_available()
    config = ProfilerConfig(
        ProfilerState.CUDA if cuda else ProfilerState.CPU,
        self.record_shapes,
        self.profile_memory,
        self.with_stack,
        self.with_flops,
        self.with_modules,
        self.experimental_config,
    )
    torch.autograd._enable_profiler_legacy(config)  # torch's own error if one is open here
    start = time.perf_counter_ns()
    self.profiling_start_time_ns = start
    key = (id(world), me.rank) if me.helper is None else None
    session = _RankSession(start, key)
    with _lock:
        _sessions[threading.get_ident()] = session
        if key is not None:
            _by_rank[key] = session
        active = True


def _add_metadata_json(key: str, value: str) -> None:
    # torch.profiler.profile adds its metadata to Kineto's trace, which a rank's
    # session has none of (torch warns "Profiler is not initialized" per key);
    # the profile object keeps its own copy.
    if threading.get_ident() not in _sessions:
        _originals["_add_metadata_json"](key, value)


def _parse_kineto_results(self: Any, result: Any, timeout_s: float | None = None) -> Any:
    if isinstance(result, RankProfile):
        return result.function_events()
    return _originals["_parse_kineto_results"](self, result, timeout_s=timeout_s)


def _end_rank_session() -> _RankSession | None:
    """The calling thread's rank session, taken out of the tables (None: it has none)."""
    global active
    ident = threading.get_ident()
    with _lock:
        session = _sessions.pop(ident, None)
        if session is not None and session.key is not None and _by_rank.get(session.key) is session:
            del _by_rank[session.key]
        active = bool(_sessions)
    return session


# -- Kineto itself: one session per process ------------------------------------


def _describe() -> str:
    world, rank = me.world, me.rank
    thread = threading.current_thread().name
    if world is None:
        return f"thread {thread!r} (not a rank)"
    helper = "" if me.helper is None else f", helper thread {thread!r}"
    return f"rank {rank}{helper}"


def holder() -> str | None:
    """Who holds the process's Kineto session now (None: nobody), for reports and tests."""
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
        f"{_describe()} opened a Kineto profiler session while {held_by} still has one open: "
        f"torch's profiler (Kineto) keeps one session per process, and two at once crash the "
        f"interpreter. Inside ranks, torch.autograd.profiler.profile and torch.profiler.profile "
        f"profile each rank on its own; torch.autograd's _prepare_profiler and _enable_profiler, "
        f"called directly, are Kineto's, so call them from one thread at a time"
    )


def _release() -> None:
    global _holder
    with _lock:
        if _holder is not None and _holder[0] == threading.get_ident():
            _holder = None


def _claiming(name: str) -> Any:
    """torch's ``name`` (Kineto's session opening), for one thread at a time."""

    def claim_then_call(*args: Any, **kwargs: Any) -> Any:
        _claim()
        try:
            return _originals[name](*args, **kwargs)
        except BaseException:
            _release()
            raise

    return claim_then_call


def _disable_profiler(*args: Any, **kwargs: Any) -> Any:
    session = _end_rank_session()
    if session is not None:
        return RankProfile(torch.autograd._disable_profiler_legacy(), session)
    try:
        return _originals["_disable_profiler"](*args, **kwargs)
    finally:
        _release()


def close_left_open() -> bool:
    """Close the calling thread's profiling session if it is still open
    (a rank or helper thread at its end); True if there was one. The events
    are dropped: nobody is left to read them."""
    if _end_rank_session() is not None:
        torch.autograd._disable_profiler_legacy()
        return True
    if not torch.autograd._profiler_enabled():
        return False
    try:
        (_originals.get("_disable_profiler") or torch.autograd._disable_profiler)()
    finally:
        _release()
    return True


_REPLACEMENTS = (
    (autograd_profiler, "_prepare_profiler", _claiming("_prepare_profiler")),
    (autograd_profiler, "_enable_profiler", _claiming("_enable_profiler")),
    (autograd_profiler, "_disable_profiler", _disable_profiler),
    (autograd_profiler.profile, "_prepare_trace", _prepare_trace),
    (autograd_profiler.profile, "_start_trace", _start_trace),
    (autograd_profiler.profile, "_parse_kineto_results", _parse_kineto_results),
    (torch.autograd, "_add_metadata_json", _add_metadata_json),
)


def install() -> None:
    global _holder
    patches.swap_in(_originals, _REPLACEMENTS)
    # The first run's caller may be inside a session of its own (a profiler
    # around simdist.run): its thread holds the process's Kineto session.
    with _lock:
        if _holder is None and torch.autograd._profiler_enabled():
            _holder = (threading.get_ident(), f"the caller's thread {threading.current_thread().name!r}")


def uninstall() -> None:
    global _holder
    patches.swap_out(_originals, _REPLACEMENTS)
    with _lock:
        # Outside runs nothing is tracked: the next run looks afresh.
        _holder = None


patches.register(
    "profiler", install, uninstall, [(owner, attribute) for owner, attribute, _ in _REPLACEMENTS]
)
