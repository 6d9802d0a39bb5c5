"""``monitored_barrier``, as gloo runs it: the non-zero ranks report to group
rank 0 and wait for its answer; rank 0 names the ranks that never came.

Every wait is timed (``timeouts``): a rank that can never reach the barrier is
reported at once, with gloo's words ("[Rank 0]: Rank 2 failed to pass
monitoredBarrier in 1000 ms"). A rank that arrives late, however late, passes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch

from .. import _sanitizer
from .._core.scheduler import Scheduler
from .timeouts import close_group, ms, transport_timeout, wait_timed
from .work import SimWork


class SimProcessGroup(Protocol):
    """What the barrier needs of the group (the process group imports this module)."""

    timeout: float | None
    _scheduler: Scheduler
    _global_rank: int

    def rank(self) -> int: ...
    def size(self) -> int: ...
    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int = 0) -> SimWork: ...
    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int = 0) -> SimWork: ...


# The tag of the barrier's messages: one no program uses (torch passes
# non-negative tags), so they never match a program's own send or recv.
TAG = -0x6D62


def _seconds(pg: SimProcessGroup, timeout: Any) -> float:
    if timeout is None:
        return pg.timeout if pg.timeout is not None else 1800.0  # torch's default group timeout
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def monitored_barrier(pg: SimProcessGroup, timeout: Any, wait_all_ranks: bool) -> None:
    works: list[SimWork] = []
    try:
        _barrier(pg, timeout, wait_all_ranks, works)
    finally:
        # The barrier's own messages are the backend's, as gloo's are inside
        # its C++ call: none is the program's to wait for, whatever the outcome.
        for work in works:
            _sanitizer.waited(work, pg._global_rank)


def _barrier(pg: SimProcessGroup, timeout: Any, wait_all_ranks: bool, works: list[SimWork]) -> None:
    seconds = _seconds(pg, timeout)
    started = time.monotonic()  # one deadline for every wait, as gloo's
    me, n = pg.rank(), pg.size()
    if n == 1:
        return
    if me != 0:
        _report_to_rank_0(pg, me, seconds, started, works)
        return
    token = torch.zeros(1)
    recvs = [(r, pg.recv([torch.zeros(1)], r, TAG)) for r in range(1, n)]
    works.extend(work for _, work in recvs)
    failed: list[int] = []
    for r, work in recvs:
        if seconds <= 0:
            # gloo checks the time left before each wait: none is left at all.
            error = RuntimeError(
                f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in 0 ms\n Original exception: \n"
                f"Rank 0 timed out in monitoredBarrier after 0 ms.\n"
                f"No ranks successfully processed in monitoredBarrier."
            )
            close_group(pg._scheduler, pg._global_rank, work._waitable, "monitored_barrier")  # type: ignore[arg-type]  # posted: never None
            raise error
        timed_out = transport_timeout(seconds)
        try:
            wait_timed(pg._scheduler, pg._global_rank, work._waitable, seconds, timed_out, started)  # type: ignore[arg-type]  # posted: never None
        except RuntimeError as exc:
            if exc is not timed_out:
                raise
            if not wait_all_ranks:
                close_group(pg._scheduler, pg._global_rank, work._waitable, "monitored_barrier")  # type: ignore[arg-type]  # posted: never None
                raise RuntimeError(
                    f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {ms(seconds)} ms\n"
                    f" Original exception: \n{exc}"
                ) from exc
            failed.append(r)
    if failed:
        close_group(pg._scheduler, pg._global_rank, recvs[0][1]._waitable, "monitored_barrier")  # type: ignore[arg-type]  # posted: never None
        ranks = ", ".join(map(str, failed))
        raise RuntimeError(f"[Rank 0]: Ranks {ranks} failed to pass monitoredBarrier in {ms(seconds)} ms")
    for r in range(1, n):
        works.append(pg.send([token], r, TAG))
        works[-1].wait()


def _report_to_rank_0(
    pg: SimProcessGroup, me: int, seconds: float, started: float, works: list[SimWork]
) -> None:
    try:
        # gloo wraps whatever its send and recv raise, posting included (rank 0
        # may have timed out and closed the group before this rank arrived).
        works.extend((pg.send([torch.zeros(1)], 0, TAG), pg.recv([torch.zeros(1)], 0, TAG)))
        for work in works:
            error = transport_timeout(seconds, work._waitable.kind)  # type: ignore[union-attr]  # posted: never None
            wait_timed(pg._scheduler, pg._global_rank, work._waitable, seconds, error, started)  # type: ignore[arg-type]  # posted: never None
    except RuntimeError as exc:
        raise RuntimeError(
            f"Rank {me} successfully reached monitoredBarrier, but received errors while waiting for "
            f"send/recv from rank 0. Please check rank 0 logs for faulty rank.\n Original exception: \n{exc}"
        ) from exc
