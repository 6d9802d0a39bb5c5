"""Point to point: a group's send and recv, and a matched send copied into its recv."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from time import perf_counter_ns
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from .. import _sanitizer, stacks
from .._core.matching import ANY_SOURCE, AnySourceRecv
from .._core.records import GroupInfo, P2POp
from .._core.scheduler import Scheduler
from .._isolation import profiler as _profiler
from ..errors import CollectiveMismatchError
from . import kernels as K
from .current import _check_caller
from .payload import T
from .profiled import record as record_profiled
from .shadow import modes_active, show
from .validation import one
from .work import SimWork
from .world_hooks import WorldHooks

# Type-checked as the ProcessGroup it is mixed into; at run time a plain class
# (c10d's pybind base is SimProcessGroup's own, once).
if TYPE_CHECKING:
    _Group = dist.ProcessGroup
else:
    _Group = object


class _AnySourceWork(SimWork):
    """An any-source recv's handle: ``_source_rank()`` is the sender's group rank."""

    def __init__(
        self,
        scheduler: Scheduler,
        rank: int,
        op: AnySourceRecv,
        result: list[torch.Tensor],
        synchronous: bool = False,
    ) -> None:
        super().__init__(scheduler, rank, op, result, synchronous)
        self._op = op

    def _source_rank(self) -> int:
        self.wait()
        return self._op.group.ranks.index(self._op.src)


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


class PointToPoint(_Group):
    """``SimProcessGroup``'s send and recv: posted to the scheduler, which
    matches each with the oldest opposite call of the same pair and tag."""

    _world: WorldHooks
    _scheduler: Scheduler
    _global_rank: int
    _info: GroupInfo
    timeout: float | None

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int = 0) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "send", tensors, dst, tag)
        t = self._own_tensor(tensors, "send")
        peer = self._peer(dst, "send", "dst")
        snapshot = _sanitizer.quietly(_snapshot, t)
        op = P2POp("send", self._info, self._global_rank, peer, tag, snapshot, stacks.call_site(2))
        return self._post(op, t, _sanitizer.synchronous_p2p(sys._getframe(1)))

    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int = 0) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "recv", tensors, src, tag)
        t = self._own_tensor(tensors, "recv")
        peer = self._peer(src, "recv", "src")
        op = P2POp("recv", self._info, peer, self._global_rank, tag, t.data, stacks.call_site(2))
        return self._post(op, t, _sanitizer.synchronous_p2p(sys._getframe(1)))

    def recv_anysource(self, tensors: Sequence[torch.Tensor], tag: int = 0) -> SimWork:
        """A recv from any other member: the match rule is ``AnySourceRecv``'s
        (the lowest-ranked sender already waiting, else the first to send)."""
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "recv_anysource", tensors, tag)
        t = self._own_tensor(tensors, "recv")
        op = AnySourceRecv(
            "recv", self._info, ANY_SOURCE, self._global_rank, tag, t.data, stacks.call_site(2)
        )
        started = perf_counter_ns() if _profiler.active else 0  # some rank profiles (profiled)
        self._world.before_p2p(op)
        _sanitizer.quietly(self._scheduler.post_p2p, op, deliver)
        synchronous = _sanitizer.synchronous_p2p(sys._getframe(1))
        work = _AnySourceWork(self._scheduler, self._global_rank, op, [t], synchronous)
        work.timeout = self.timeout
        if started:
            record_profiled(self, "recv_anysource", {T: t}, started)
        return work

    def _own_tensor(self, tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
        """The call's one dense tensor, from one of this rank's own threads."""
        t: torch.Tensor = one(tensors, op)
        K.require_dense_p2p(t, op)
        _check_caller(self._scheduler, self._global_rank, op)
        return t

    def _post(self, op: P2POp, t: torch.Tensor, synchronous: bool) -> SimWork:
        started = perf_counter_ns() if _profiler.active else 0  # some rank profiles (profiled)
        self._world.before_p2p(op)
        _sanitizer.quietly(self._scheduler.post_p2p, op, deliver)
        work = SimWork(self._scheduler, self._global_rank, op, [t], synchronous)
        work.timeout = self.timeout
        if started:
            record_profiled(self, op.kind, {T: t}, started)
        return work

    def _peer(self, group_rank: int, op: str, arg: str) -> int:
        if not 0 <= group_rank < self.size():
            raise ValueError(
                f"{op}: {arg} group rank {group_rank} is outside the group of size {self.size()}"
            )
        if group_rank == self.rank():
            raise ValueError(f"{op}: {arg} is this rank itself ({self._global_rank})")
        return self._info.ranks[group_rank]
