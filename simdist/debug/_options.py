"""What a run is asked to do for a debugger: ``post_mortem``, ``break_at``, traces of failures.

Each can be given to ``simdist.run`` itself, or as a default for every run in
a scope (``debug.defaults(...)``): that is how ``pytest --pdb``,
``simdist replay --pdb`` and ``--simdist-trace-on-failure`` reach runs started
deep inside the code under test.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

# The names simdist's process group records for its calls (the flight
# recorder's and the traces' "op"): a typo in break_at must not silently
# never stop. Written out, not read from the ops table: this module is
# imported where torch must not be (the fuzz command line's bad-input path);
# tests/debug compares it with the table.
KNOWN_OPS = (
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_reduce_coalesced",
    "all_reduce_sparse",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "send",
)
_BREAK_KEYS = ("rank", "op", "nth", "seq", "group")

# Where a failing run writes its trace (also read from the environment, so
# that a fuzz campaign's worker processes inherit it).
TRACE_ENV = "SIMDIST_TRACE_ON_FAILURE"


@dataclass(frozen=True)
class BreakAt:
    """Stop ``rank`` just before its ``nth`` call matching ``op``/``seq``/``group``.

    ``nth`` counts from 1 among the rank's calls that match every given key;
    ``seq`` is the group's sequence number (collectives only); ``group`` is a
    group label such as ``"tp"`` or ``"world"``.
    """

    rank: int
    op: str | None = None
    nth: int = 1
    seq: int | None = None
    group: str | None = None

    def matches(self, rank: int, op: str, label: str, seq: int) -> bool:
        if rank != self.rank or (self.op is not None and op != self.op):
            return False
        if self.seq is not None and seq != self.seq:
            return False
        return self.group is None or self.group in label.split("/")

    def describe(self) -> str:
        what = [f"{k}={getattr(self, k)}" for k in ("op", "seq", "group") if getattr(self, k) is not None]
        call = ", ".join(what) if what else "any call"
        return f"rank {self.rank}'s call #{self.nth} matching {call}"


def parse_break_at(value: Any, world_size: int | None = None) -> BreakAt | None:
    """A ``BreakAt`` from a dict, a ``"rank=1,op=all_reduce,nth=3"`` string or a ``BreakAt``.

    Raises ``TypeError``/``ValueError`` naming the key, what was expected and what came.
    """
    if value is None or isinstance(value, BreakAt):
        spec = value
    else:
        if isinstance(value, str):
            value = _parse_text(value)
        if not isinstance(value, Mapping):
            raise TypeError(
                f"break_at must be a dict such as {{'rank': 1, 'op': 'all_reduce', 'nth': 3}} "
                f"or a string 'rank=1,op=all_reduce,nth=3', got {type(value).__name__} {value!r}"
            )
        unknown = sorted(str(k) for k in value if k not in _BREAK_KEYS)
        if unknown:
            raise ValueError(
                f"break_at: unknown key(s) {', '.join(unknown)}; expected {', '.join(_BREAK_KEYS)}"
            )
        if "rank" not in value:
            raise ValueError("break_at needs 'rank': the rank whose call to stop before")
        spec = BreakAt(**dict(value))
    if spec is None:
        return None
    _check(spec, world_size)
    return spec


def _parse_text(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        if not sep or not key:
            raise ValueError(f"break_at: expected KEY=VALUE items such as rank=1,seq=5; got {part!r}")
        key = key.strip()
        raw = raw.strip()
        out[key] = int(raw) if key in ("rank", "nth", "seq") and raw.lstrip("-").isdigit() else raw
    return out


def _check(spec: BreakAt, world_size: int | None) -> None:
    for key in ("rank", "nth", "seq"):
        v = getattr(spec, key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise TypeError(f"break_at: {key} must be an int, got {type(v).__name__} {v!r}")
    if spec.rank < 0 or (world_size is not None and spec.rank >= world_size):
        bound = "" if world_size is None else f" below the world size {world_size}"
        raise ValueError(f"break_at: rank must be a rank of the world (0 or more{bound}), got {spec.rank}")
    if spec.nth < 1:
        raise ValueError(f"break_at: nth counts calls from 1, got {spec.nth}")
    if spec.seq is not None and spec.seq < 0:
        raise ValueError(f"break_at: seq is a group's sequence number (0 or more), got {spec.seq}")
    if spec.op is not None and spec.op not in KNOWN_OPS:
        raise ValueError(
            f"break_at: op {spec.op!r} is not a call simdist records; expected one of {', '.join(KNOWN_OPS)}"
        )
    if spec.seq is not None and spec.op in ("send", "recv"):
        raise ValueError(
            "break_at: seq numbers collectives; point-to-point calls (send/recv) have none, use nth"
        )
    if spec.group is not None and (not isinstance(spec.group, str) or not spec.group):
        raise TypeError(f"break_at: group must be a group label such as 'tp' or 'world', got {spec.group!r}")


@dataclass(frozen=True)
class Settings:
    """The debugging a run does when the run itself does not say."""

    post_mortem: bool = False
    break_at: BreakAt | None = None
    trace_dir: str | None = None
    trace_name: str | None = None  # a file name stem for traces (e.g. the test's id)
    # A context manager around every debugger session (pytest's: suspend its
    # output capture so the prompt reaches the terminal).
    around_prompt: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    # Told the path of each failure trace written (pytest: to keep only failed tests').
    on_trace: Callable[[str], None] | None = None
    # Told "quit" or "continued" when a post-mortem ends, "quit" when a break_at stop is quit.
    on_post_mortem: Callable[[str], None] | None = None
    break_at_explicit: bool = False  # given to this run (warn when it never stops)
    # Shared by every run of one defaults() block: what has stopped already.
    # Hypothesis runs a failing example again to report it; the debugger
    # opens once per block (a test, a replayed case), not once per run.
    stopped: dict[str, bool] | None = None


_lock = threading.Lock()
_stack: list[Settings] = []
_NO_BLOCK = Settings()  # what a run gets outside every defaults() block, no trace folder set


def current() -> Settings:
    with _lock:
        if _stack:
            return _stack[-1]
    env = os.environ.get(TRACE_ENV) or None
    return _NO_BLOCK if env is None else Settings(trace_dir=env)


@contextlib.contextmanager
def defaults(**changes: Any) -> Iterator[Settings]:
    """Within the block, runs that do not say otherwise use these settings
    (``post_mortem=``, ``break_at=``, ``trace_dir=``, ``trace_name=``, ``around_prompt=``,
    ``on_trace=``)."""
    unknown = sorted(set(changes) - set(Settings.__dataclass_fields__))
    if unknown:
        raise TypeError(f"debug.defaults: unknown setting(s) {', '.join(unknown)}")
    if "break_at" in changes:
        changes["break_at"] = parse_break_at(changes["break_at"])
    _check_post_mortem(changes.get("post_mortem"))
    settings = replace(current(), stopped={}, **changes)
    with _lock:
        _stack.append(settings)
    try:
        yield settings
    finally:
        with _lock:
            # This block's own entry (not an equal one), if a test suite's
            # guard has not taken it out already (``restore_state``).
            mine = [i for i, s in enumerate(_stack) if s is settings]
            if mine:
                del _stack[mine[-1]]


def state() -> tuple[str | None, tuple[Settings, ...]]:
    """What decides the debugging defaults of a run started now: the
    environment's failure-trace folder and the open ``defaults()`` blocks
    (test suites compare it before and after each test)."""
    with _lock:
        return os.environ.get(TRACE_ENV), tuple(_stack)


def restore_state(saved: tuple[str | None, tuple[Settings, ...]]) -> None:
    """Put back what ``state()`` returned (a test that leaked a change)."""
    env, stack = saved
    with _lock:
        set_trace_env(env)
        _stack[:] = stack


def set_trace_env(folder: str | None) -> None:
    """Set (None: unset) the environment's failure-trace folder."""
    if folder is None:
        os.environ.pop(TRACE_ENV, None)
    else:
        os.environ[TRACE_ENV] = folder


def _check_post_mortem(post_mortem: Any) -> None:
    if post_mortem is not None and not isinstance(post_mortem, bool):
        raise TypeError(f"post_mortem must be True or False, got {post_mortem!r}")


def check_debug_options(post_mortem: Any, break_at: Any, world_size: int) -> None:
    """``run``'s ``post_mortem=`` and ``break_at=``, refused with a clear error when wrong."""
    _check_post_mortem(post_mortem)
    parse_break_at(break_at, world_size)


def resolve(post_mortem: bool | None, break_at: Any, world_size: int) -> Settings:
    """A run's own arguments over the defaults; validated before any rank starts."""
    _check_post_mortem(post_mortem)
    base = current()
    spec = parse_break_at(break_at, world_size) if break_at is not None else base.break_at
    if spec is not None and spec.rank >= world_size:
        # A default break_at (a replay's) for a smaller world than this run's
        # other runs: it names no rank here, so it cannot stop here.
        spec = None
    pm = base.post_mortem if post_mortem is None else post_mortem
    if pm == base.post_mortem and spec is base.break_at and base.break_at_explicit is (break_at is not None):
        return base  # (a frozen value: nothing of it to change; most runs, which ask for no debugging)
    return replace(base, post_mortem=pm, break_at=spec, break_at_explicit=break_at is not None)
