"""Which run and rank the calling thread belongs to (moved here as they were
in backend.py; the rank-identity rebuild replaces them with one identity)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..errors import SimulationError
from ..rendezvous import Scheduler

if TYPE_CHECKING:
    from .registration import WorldHooks

_current = threading.local()


def _refused(error: BaseException) -> BaseException:
    """Note a call simdist cannot model at world level, so that a body that
    catches the error (and falls back) still fails the run: its results would
    not be what a real backend gives."""
    world = getattr(_current, "world", None)
    if world is not None:
        world.scheduler.record(_current.rank, error)
    return error


def _check_caller(scheduler: Scheduler, rank: int, what: str) -> None:
    """A rank's group (or Work) used by a thread that is not that rank's: on
    a cluster no such thread exists, and taking its call as the rank's would
    join (or wait in) the rank's collectives behind its back. Refused; once
    the run is over the scheduler's own "already ended" error says more."""
    world = getattr(_current, "world", None)
    if world is not None and world.scheduler is scheduler and _current.rank == rank:
        return
    if scheduler.closed is not None:
        return
    if world is None:
        whose = "a thread outside the run"
    elif world.scheduler is scheduler:
        whose = f"a thread of rank {_current.rank}"
    else:
        whose = "a thread of another run"
    raise SimulationError(
        f"{what}: this process group belongs to rank {rank}, but {whose} "
        f"({threading.current_thread().name!r}) called it; only rank {rank}'s own threads "
        f"(its body and the helper threads it starts) can use its groups and Works"
    )


def current_world() -> tuple[WorldHooks, int]:
    world = getattr(_current, "world", None)
    if world is None:
        raise SimulationError("the 'simdist' backend can only be initialised inside simdist.run(...)")
    return world, _current.rank


def bind_current(world: WorldHooks | None, rank: int = -1) -> None:
    _current.world = world
    _current.rank = rank
