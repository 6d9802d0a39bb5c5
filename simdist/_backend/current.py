"""Which run and rank the calling thread belongs to, as the backend asks it:
thin readers over the one rank identity (``_core.identity``)."""

from __future__ import annotations

import threading

from .._core import identity
from .._core.scheduler import Scheduler
from ..errors import SimulationError
from .world_hooks import WorldHooks

# The thread's rank identity: ``_current.world`` / ``_current.rank``.
_current = identity.me


def _refused(error: BaseException) -> BaseException:
    """Note a call simdist cannot model at world level, so that a body that
    catches the error (and falls back) still fails the run: its results would
    not be what a real backend gives."""
    world = _current.world
    if world is not None:
        world.scheduler.record(_current.rank, error)
    return error


def _check_caller(scheduler: Scheduler, rank: int, what: str) -> None:
    """A rank's group (or Work) used by a thread that is not that rank's: on
    a cluster no such thread exists, and taking its call as the rank's would
    join (or wait in) the rank's collectives behind its back. Refused; once
    the run is over the scheduler's own "already ended" error says more."""
    world = _current.world
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
    world = _current.world
    if world is None:
        raise SimulationError("the 'simdist' backend can only be initialised inside simdist.run(...)")
    return world, _current.rank
