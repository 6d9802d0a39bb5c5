"""The exceptions simdist raises. Every one derives from ``SimulationError``."""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Sequence
from typing import Any, TypeVar

_E = TypeVar("_E", bound=BaseException)


class SimulationError(Exception):
    """Base class of every error simdist raises about a simulated world.

    Every one pickles and unpickles (a ``ProcessPoolExecutor`` sweep over
    ``simdist.run`` gets its errors back): the message, every attribute that
    pickles (a ``RankError``'s ``failures``, a run's ``results``), the rest as
    text (an exception by its type and message), and the cause chain, which
    pickle drops, as text in ``cause_text`` and as a note on the error.
    """

    cause_text: str | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        state = {key: _portable(value) for key, value in vars(self).items()}
        if self.__cause__ is not None and self.cause_text is None:
            state["cause_text"] = "".join(traceback.format_exception(self.__cause__)).rstrip()
        return (_rebuilt, (type(self), self.args), state)

    def __setstate__(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        vars(self).update(state)
        text = state.get("cause_text")
        if text and hasattr(self, "add_note") and not any(text in n for n in getattr(self, "__notes__", ())):
            self.add_note(f"caused, in the process that raised it, by:\n{text}")


def _rebuilt(cls: type[SimulationError], args: tuple[Any, ...]) -> SimulationError:
    """An instance of ``cls`` with ``args``, past a constructor that wants more."""
    error = cls.__new__(cls, *args)
    Exception.__init__(error, *args)
    return error


def _portable(value: Any) -> Any:
    """``value`` if it pickles; an exception as its type and message; a dict or
    list element by element; anything else as its repr."""
    try:
        pickle.dumps(value)
        return value
    except Exception:
        pass
    if isinstance(value, BaseException):
        return RuntimeError(f"{type(value).__name__}: {value}")
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_portable(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return repr(value)


class RankError(SimulationError):
    """One or more ranks raised; ``__cause__`` is the first failure.

    ``failures`` maps each rank that failed on its own to its exception;
    ``released`` lists ranks that did not fail themselves but were woken out of a
    wait because a peer had failed (they are not independent failures).
    """

    def __init__(
        self,
        message: str,
        failures: dict[int, BaseException],
        released: Sequence[int] = (),
    ) -> None:
        super().__init__(message)
        self.failures = dict(failures)
        self.released = tuple(released)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.failures))


class PeerFailedError(SimulationError):
    """Raised inside a rank that was waiting on (or entering) a collective after
    a peer failed: the world is going down, this rank is not the cause."""


class DeadlockError(SimulationError):
    """No pending call can ever complete; the message lists every rank's state."""


class CollectiveMismatchError(SimulationError):
    """Members of a group met at the same sequence number with different calls."""


class BufferOverlapError(SimulationError):
    """Members of one collective passed buffers that share memory (possible
    only between threads; never on a cluster)."""


class SimulationTimeout(SimulationError):
    """The run's watchdog expired while ranks were still running."""


class UnsupportedOperationError(SimulationError, NotImplementedError):
    """A collective, option or dtype simdist does not model."""


class AsyncRaceError(SimulationError):
    """A rank touched a buffer of its own asynchronous collective or P2P call
    before waiting for it (the collective sanitizer, ``check_async``); with
    ``strict_async``, also a Work its rank never waited. The message names
    the racing operation and line, the pending call and line, its group and
    sequence number, and what a real backend does there."""


class UnwaitedWorkWarning(UserWarning):
    """An asynchronous Work its rank never waited (the rank ended, or returned
    the Work's buffers); an ``AsyncRaceError`` with ``strict_async=True``."""


# -- errors delivered because of another rank ------------------------------------
#
# A rank woken out of a wait because a peer failed (released by the deadlock
# check, a communicator aborted elsewhere) gets an ordinary exception, marked
# with the rank whose failure it is: the outcome counts it as a consequence,
# not as a failure of its own, however the body wraps it.

_ORIGIN = "simdist_origin"


def mark_consequence(error: _E, origin: int) -> _E:
    """``error`` marked as a consequence of rank ``origin``'s failure; returns it."""
    setattr(error, _ORIGIN, origin)
    return error


def consequence_mark(error: BaseException) -> int | None:
    """The rank ``error`` was marked a consequence of (``mark_consequence``), or None."""
    origin = getattr(error, _ORIGIN, None)
    return origin if isinstance(origin, int) else None
