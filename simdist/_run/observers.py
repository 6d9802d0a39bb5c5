"""One interface for whatever watches runs: CommStats, explore, trace files.

An observer says whether it needs every record of the run (the flight
recorder keeps only the last few per rank otherwise) and is handed the World
when the run has ended, whatever its outcome. ``observe(obs)`` makes an
observer see every run started in the ``with`` block, in this thread (a
ContextVar: two threads running worlds at once never see each other's).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import comm_stats

if TYPE_CHECKING:
    from .options import RunOptions
    from .world import World


class RunObserver:
    """Base of run observers; override what you need."""

    keeps_all_records: bool = True

    def run_ended(self, world: World) -> None:
        """The run is over (its ranks have left); ``world.recorder`` holds its calls."""


_ACTIVE: contextvars.ContextVar[tuple[RunObserver, ...]] = contextvars.ContextVar(
    "simdist_run_observers", default=()
)


@contextlib.contextmanager
def observe(observer: RunObserver) -> Iterator[RunObserver]:
    """Let ``observer`` see every run started in this block (nested blocks all see)."""
    token = _ACTIVE.set((*_ACTIVE.get(), observer))
    try:
        yield observer
    finally:
        _ACTIVE.reset(token)


class _CountInto(RunObserver):
    """Feeds one ``with simdist.CommStats()`` block."""

    def __init__(self, stats: Any) -> None:
        self.stats = stats

    def run_ended(self, world: World) -> None:
        self.stats.add_records(world.recorder.all_records())


class TraceFile(RunObserver):
    """Writes the run's Chrome/Perfetto trace to ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path

    def run_ended(self, world: World) -> None:
        world.recorder.write_chrome_trace(self.path, world.describe_rank)


def observers_for(options: RunOptions) -> list[RunObserver]:
    """Every observer of a run about to start: active blocks, CommStats blocks, its trace."""
    found: list[RunObserver] = list(_ACTIVE.get())
    found += [_CountInto(stats) for stats in comm_stats.active()]
    if options.trace is not None:
        found.append(TraceFile(options.trace))
    return found


def tell_ended(observers: list[RunObserver], world: World) -> OSError | None:
    """Hand the ended run to each observer; an observer that cannot write its
    file never hides the run's own outcome: its error is returned (the first)."""
    error: OSError | None = None
    for observer in observers:
        try:
            observer.run_ended(world)
        except OSError as exc:
            error = error or exc
    return error
