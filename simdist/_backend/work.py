"""Work handles: what a collective or P2P call returns to the rank."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from .. import _sanitizer
from .._core import identity
from .._core.records import Waitable
from .._core.scheduler import Scheduler
from .._cuda import collectives as cuda_collectives
from .current import _check_caller
from .timeouts import seconds_of, wait_with_timeout


class SimWork(dist.Work):
    """A handle on a pending call; ``wait()`` blocks in the scheduler, bounded
    by deadlock detection and the run's watchdog."""

    def __init__(
        self,
        scheduler: Scheduler,
        rank: int,
        waitable: Waitable | None,
        result: list[torch.Tensor] | None = None,
        synchronous: bool = False,
    ) -> None:
        super().__init__()
        self._scheduler = scheduler
        self._rank = rank
        self._waitable = waitable
        self._result = result or []
        self._issued = time.monotonic()  # where gloo's transport timeout starts
        # In flight until waited, unless c10d waits for it at once (synchronous).
        self._in_flight = _sanitizer.issued(self, rank, waitable, synchronous)
        # CUDA's stream rules, where the calling rank's run emulates CUDA devices
        world = identity.me.world
        self._streams = world is not None and getattr(world, "cuda_emulation", None) is not None
        if self._streams:
            cuda_collectives.issued(self, rank, waitable)

    # The group's (or barrier's) explicit timeout in seconds, if any (see timeouts).
    timeout: float | None = None
    # A barrier's: the Works its rank had in flight on the group when it was
    # issued; the barrier's completion is theirs (gloo's barrier waits for them).
    completes: tuple[SimWork, ...] = ()

    def _complete_earlier(self) -> None:
        for work in self.completes:
            if work._in_flight:
                work._in_flight = False
                _sanitizer.waited(work, work._rank)
        self.completes = ()

    def wait(self, timeout: Any = None) -> bool:
        if self._waitable is not None:
            _check_caller(self._scheduler, self._rank, "Work.wait")
            explicit = seconds_of(timeout)
            seconds = explicit or self.timeout
            try:
                if seconds is None:
                    self._scheduler.wait(self._rank, self._waitable)
                else:
                    wait_with_timeout(
                        self._scheduler,
                        self._rank,
                        self._waitable,
                        seconds,
                        explicit is not None,
                        self._issued,
                    )
            finally:
                if self._in_flight:
                    self._in_flight = False
                    _sanitizer.waited(self, self._rank)
                if self.completes:
                    self._complete_earlier()
                if self._streams:
                    cuda_collectives.waited(self, self._rank)
        return True

    def is_completed(self) -> bool:
        if self._waitable is None:
            return True
        if self._waitable.done:
            if self._in_flight:  # seeing it done is a wait
                self._in_flight = False
                _sanitizer.waited(self, self._rank)
            if self.completes:
                self._complete_earlier()
            if self._streams:  # the host has seen it finish
                cuda_collectives.waited(self, self._rank, by_host=True)
            return True
        return False

    def is_success(self) -> bool:
        return self.is_completed() and (self._waitable is None or self._waitable.error is None)

    def exception(self) -> Any:
        return None if self._waitable is None else self._waitable.error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        self.wait()
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(self._result)
        return fut


class _AllOf(Waitable):
    def __init__(self, works: list[dist.Work]) -> None:
        self.works = works

    @property
    def done(self) -> bool:  # type: ignore[override]  # computed from the parts, over Waitable's plain attribute
        return all(w.is_completed() for w in self.works)

    @property
    def error(self) -> BaseException | None:  # type: ignore[override]  # computed from the parts, over Waitable's plain attribute
        for w in self.works:
            if w.exception() is not None:
                return w.exception()
        return None


class _Sequence(SimWork):
    """Several calls issued as one (the coalesced forms): waits for each in turn."""

    def __init__(
        self, scheduler: Scheduler, rank: int, works: list[dist.Work], result: list[torch.Tensor]
    ) -> None:
        super().__init__(scheduler, rank, _AllOf(works), result)
        self._works = works

    def wait(self, timeout: Any = None) -> bool:
        for w in self._works:
            w.wait()
        return True


all_of = _Sequence  # all_of(scheduler, rank, works, result)
