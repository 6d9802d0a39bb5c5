"""Point to point: a group's send and recv, a matched send copied into its recv,
and ``monitored_barrier`` (gloo runs it over send and recv)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from time import perf_counter_ns
from typing import Any

import torch

from .. import _sanitizer, stacks
from .._core.matching import ANY_SOURCE, AnySourceRecv
from .._core.records import GroupInfo, P2POp
from .._core.scheduler import Scheduler
from .._isolation import profiler as _profiler
from ..errors import CollectiveMismatchError
from . import kernels as K
from .current import _check_caller
from .group import MixinBase
from .ops import T
from .profiled import record as record_profiled
from .shadow import show
from .timeouts import close_group, ms, transport_timeout, wait_timed
from .validation import one
from .work import SimWork
from .world_hooks import WorldHooks


class _AnySourceWork(SimWork):
    """An any-source recv's handle: ``_source_rank()`` is the sender's group rank."""

    def _source_rank(self) -> int:
        self.wait()
        op: AnySourceRecv = self._waitable  # type: ignore[assignment]  # an any-source recv's: never None
        return op.group.ranks.index(op.src)


def deliver(send: P2POp, recv: P2POp) -> None:
    """Copy a matched send into its recv (runs under the world lock)."""
    src, dst = send.tensor, recv.tensor
    if src.dtype != dst.dtype or src.numel() != dst.numel():
        raise CollectiveMismatchError(
            f"send/recv mismatch between rank {send.src} and rank {send.dst} (tag {send.tag}): "
            f"send {list(src.shape)} {src.dtype} at {send.site}, "
            f"recv {list(dst.shape)} {dst.dtype} at {recv.site}"
        )
    with torch.inference_mode():
        dst.copy_(src.view(dst.shape))


def _snapshot(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


class PointToPoint(MixinBase):
    """``SimProcessGroup``'s send and recv: posted to the scheduler, which
    matches each with the oldest opposite call of the same pair and tag."""

    _world: WorldHooks
    _scheduler: Scheduler
    _global_rank: int
    _info: GroupInfo
    timeout: float | None

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int = 0) -> SimWork:
        show(self, "send", tensors, dst, tag)
        t = self._own_tensor(tensors, "send")
        peer = self._peer(dst, "send", "dst")
        snapshot = _sanitizer.quietly(_snapshot, t)
        op = P2POp("send", self._info, self._global_rank, peer, tag, snapshot, stacks.call_site(2))
        return self._post(op, t, _sanitizer.synchronous_p2p(sys._getframe(1)))

    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int = 0) -> SimWork:
        show(self, "recv", tensors, src, tag)
        t = self._own_tensor(tensors, "recv")
        peer = self._peer(src, "recv", "src")
        op = P2POp("recv", self._info, peer, self._global_rank, tag, t.data, stacks.call_site(2))
        return self._post(op, t, _sanitizer.synchronous_p2p(sys._getframe(1)))

    def recv_anysource(self, tensors: Sequence[torch.Tensor], tag: int = 0) -> SimWork:
        """A recv from any other member: the match rule is ``AnySourceRecv``'s
        (the lowest-ranked sender already waiting, else the first to send)."""
        show(self, "recv_anysource", tensors, tag)
        t = self._own_tensor(tensors, "recv")
        op = AnySourceRecv(
            "recv", self._info, ANY_SOURCE, self._global_rank, tag, t.data, stacks.call_site(2)
        )
        synchronous = _sanitizer.synchronous_p2p(sys._getframe(1))
        return self._post(op, t, synchronous, "recv_anysource", _AnySourceWork)

    def _own_tensor(self, tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
        """The call's one dense tensor, from one of this rank's own threads."""
        t: torch.Tensor = one(tensors, op)
        K.require_dense_p2p(t, op)
        _check_caller(self._scheduler, self._global_rank, op)
        return t

    def _post(
        self, op: P2POp, t: torch.Tensor, synchronous: bool, name: str = "", kind: type[SimWork] = SimWork
    ) -> SimWork:
        """Post ``op`` and return its ``kind`` of Work; its profiler event is ``name`` (else the op's kind)."""
        started = perf_counter_ns() if _profiler.active else 0  # some rank profiles (profiled)
        self._world.before_p2p(op)
        _sanitizer.quietly(self._scheduler.post_p2p, op, deliver)
        work = kind(self._scheduler, self._global_rank, op, [t], synchronous)
        work.timeout = self.timeout
        if started:
            record_profiled(self, name or op.kind, {T: t}, started)
        return work

    def _peer(self, group_rank: int, op: str, arg: str) -> int:
        if not 0 <= group_rank < self.size():
            raise ValueError(
                f"{op}: {arg} group rank {group_rank} is outside the group of size {self.size()}"
            )
        if group_rank == self.rank():
            raise ValueError(f"{op}: {arg} is this rank itself ({self._global_rank})")
        return self._info.ranks[group_rank]

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """``monitored_barrier``, as gloo runs it: the non-zero ranks report to group
        rank 0 and wait for its answer; rank 0 names the ranks that never came.

        Every wait is timed (``timeouts``): a rank that can never reach the barrier is
        reported at once, with gloo's words ("[Rank 0]: Rank 2 failed to pass
        monitoredBarrier in 1000 ms"). A rank that arrives late, however late, passes.
        """
        works: list[SimWork] = []
        try:
            _barrier(self, timeout, wait_all_ranks, works)
        finally:
            # The barrier's own messages are the backend's, as gloo's are inside
            # its C++ call: none is the program's to wait for, whatever the outcome.
            for work in works:
                _sanitizer.waited(work, self._global_rank)


# The tag of the barrier's messages: one no program uses (torch passes
# non-negative tags), so they never match a program's own send or recv.
TAG = -0x6D62


def _seconds(pg: PointToPoint, timeout: Any) -> float:
    if timeout is None:
        return pg.timeout if pg.timeout is not None else 1800.0  # torch's default group timeout
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def _barrier(pg: PointToPoint, timeout: Any, wait_all_ranks: bool, works: list[SimWork]) -> None:
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
    pg: PointToPoint, me: int, seconds: float, started: float, works: list[SimWork]
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
