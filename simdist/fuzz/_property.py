"""What a fuzz property declares: how its case is written down and read back.

A property is an ordinary Hypothesis test. ``@replayable`` (placed under
``@given``) names the argument that carries the case and how to decode the
case's JSON form, so that the campaign can write a failing case as a small
human-readable file and ``simdist replay`` can run exactly that case again,
without Hypothesis.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

import hypothesis
from hypothesis.control import currently_in_test_context

__all__ = [
    "FuzzSpec",
    "InterruptInCase",
    "clear_failures",
    "cover",
    "encode_case",
    "in_flight_case",
    "last_failure",
    "replayable",
    "spec_of",
    "telling_interrupts_apart",
]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class FuzzSpec:
    """How a replayable property's case argument is decoded."""

    arg: str
    decode: Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class FailureRecord:
    case: dict[str, Any]
    error_type: str
    error: str


_lock = threading.Lock()
# Keyed by the property's "module.qualname". Hypothesis re-runs the shrunk
# example last before it raises, so the last failure recorded for a property
# is its minimal failing case.
_failures: dict[str, FailureRecord] = {}
# The case each property is running right now (by the same key): what a
# campaign reports when a case never finishes.
_in_flight: dict[str, Any] = {}


class InterruptInCase(Exception):
    """The code under test raised ``KeyboardInterrupt`` itself (no Ctrl-C
    came): a failure of the case like any other, so Hypothesis shrinks it
    (it lets a ``KeyboardInterrupt`` through unshrunk, as a stop)."""


# Whether a SIGINT arrived while ``telling_interrupts_apart`` was active; None
# when it is not (then every KeyboardInterrupt is taken for a Ctrl-C).
_sigint: list[bool] | None = None


@contextlib.contextmanager
def telling_interrupts_apart() -> Iterator[None]:
    """While active (in the main thread), a ``KeyboardInterrupt`` raised by
    a property's own code is that case's failure, told apart from one a
    SIGINT (Ctrl-C, the campaign's stop) raised, which still stops."""
    global _sigint
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    seen = [False]

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if previous == signal.SIG_IGN:
            return
        seen[0] = True
        if callable(previous):
            previous(signum, frame)  # Python's default raises KeyboardInterrupt
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    outer, _sigint = _sigint, seen
    try:
        yield
    finally:
        _sigint = outer
        signal.signal(signal.SIGINT, previous)


def _raised_by_the_case(exc: BaseException) -> bool:
    """A KeyboardInterrupt no SIGINT explains (only known while told apart)."""
    seen = _sigint
    return isinstance(exc, KeyboardInterrupt) and seen is not None and not seen[0]


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, Exception):
        return str(exc)
    # sys.exit(3) reads "3", KeyboardInterrupt() nothing: say what it was.
    return f"{exc!r} raised by the code under test"


def encode_case(case: Any) -> dict[str, Any]:
    """A case's JSON form: ``case.to_json()``, or the mapping itself."""
    if hasattr(case, "to_json"):
        data = case.to_json()
    elif isinstance(case, Mapping):
        data = dict(case)
    else:
        raise TypeError(
            f"a fuzz case must have a to_json() method or be a mapping, got {type(case).__name__}"
        )
    try:
        json.dumps(data)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the case's JSON form is not JSON-serialisable: {exc}") from exc
    return data


def _key(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def replayable(decode: Callable[[Mapping[str, Any]], Any], *, arg: str = "case") -> Callable[[F], F]:
    """Mark a property's case argument as replayable (goes under ``@given``).

    ``decode`` turns the JSON form written by ``case.to_json()`` back into the
    case. Every failing case is remembered, so the campaign can write the
    shrunk one to the regression corpus.
    """
    if not callable(decode):
        raise TypeError(f"decode must be callable, got {type(decode).__name__}")

    def wrap(fn: F) -> F:
        params = inspect.signature(fn).parameters
        if arg not in params:
            raise TypeError(
                f"{fn.__qualname__} has no parameter {arg!r} to carry the case; "
                f"its parameters are {list(params)}: pass arg=... to replayable()"
            )
        key = _key(fn)

        @functools.wraps(fn)
        def property_body(*args: Any, **kwargs: Any) -> Any:
            with _lock:
                _in_flight[key] = kwargs.get(arg)
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                user_interrupt = _raised_by_the_case(exc)
                if isinstance(exc, KeyboardInterrupt) and not user_interrupt:
                    raise  # Ctrl-C, or the campaign's stop: never a case's failure
                case = kwargs.get(arg)
                record = FailureRecord(encode_case(case), type(exc).__name__, _error_text(exc))
                with _lock:
                    _failures[key] = record
                if user_interrupt:
                    raise InterruptInCase(record.error) from exc
                raise
            finally:
                with _lock:
                    _in_flight.pop(key, None)

        property_body.__simdist_fuzz__ = FuzzSpec(arg=arg, decode=decode)  # type: ignore[attr-defined]  # simdist's mark on the user's function
        return property_body  # type: ignore[return-value]  # the wrapper keeps the decorated callable's type

    return wrap


def spec_of(test: Callable[..., Any]) -> FuzzSpec | None:
    """The ``FuzzSpec`` of a (possibly ``@given``-wrapped) property, or None."""
    inner = getattr(getattr(test, "hypothesis", None), "inner_test", test)
    return getattr(inner, "__simdist_fuzz__", None)


def last_failure(test: Callable[..., Any]) -> FailureRecord | None:
    inner = getattr(getattr(test, "hypothesis", None), "inner_test", test)
    with _lock:
        return _failures.get(_key(getattr(inner, "__wrapped__", inner)))


def in_flight_case(test: Callable[..., Any]) -> dict[str, Any] | None:
    """The JSON form of the case ``test`` is running now (None when none, or not encodable)."""
    inner = getattr(getattr(test, "hypothesis", None), "inner_test", test)
    with _lock:
        case = _in_flight.get(_key(getattr(inner, "__wrapped__", inner)))
    if case is None:
        return None
    try:
        return encode_case(case)
    except TypeError:
        return None


def clear_failures() -> None:
    with _lock:
        _failures.clear()


def cover(**features: object) -> None:
    """Record what this case covers, one Hypothesis event per feature.

    Each becomes ``hypothesis.event("name=value")``: visible in Hypothesis'
    statistics and counted by the campaign's coverage summary. Outside a
    Hypothesis test it does nothing.
    """
    # Outside a Hypothesis test (a property body called by hand) there is
    # nothing to record into; coverage is bookkeeping, never a failure.
    if not currently_in_test_context():
        return
    for name, value in features.items():
        hypothesis.event(f"{name}={value}")
