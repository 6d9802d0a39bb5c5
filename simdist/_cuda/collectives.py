"""Collectives and P2P calls in CUDA's stream ordering rules (``ordering``).

NCCL runs a call on a communicator stream that first waits for the current
stream's work; ``Work.wait()`` makes the stream current at the wait wait for
it, and a Work seen completed (``is_completed()``) has finished for the host.
``SimWork`` reports its call and its waits here; only runs that emulate CUDA
with the sanitizer on record anything.
"""

from __future__ import annotations

from typing import Any

from .. import stacks
from .._core.records import P2POp, PendingCollective
from .._sanitizer.inflight import OUT, InFlight, _buffers_of
from . import device_api, streams
from .ordering import RankOrder, storage_key
from .tensor import EmulatedCudaTensor


def _order(rank: int) -> RankOrder | None:
    found = device_api.emulation()
    return None if found is None else found[0].order(rank)


def issued(work: Any, rank: int, waitable: Any) -> None:
    order = _order(rank)
    if order is None or not isinstance(waitable, (PendingCollective, P2POp)):
        return
    entry = InFlight(work, rank, waitable)
    buffers = [
        (key, role == OUT)
        for tensor, role in _buffers_of(entry)
        if isinstance(tensor, EmulatedCudaTensor) and (key := storage_key(tensor))
    ]
    if not buffers:
        return
    current = streams.current_stream()
    what = f"{entry.describe()} at {stacks.call_site(2, outside_dispatch=True)}"
    group = str(waitable.group.describe())
    order.collective_issued(id(work), group, current.clock, buffers, what, streams.namer(order, current))


def waited(work: Any, rank: int, by_host: bool = False) -> None:
    order = _order(rank)
    if order is None or not order.collectives:
        return
    order.collective_waited(id(work), None if by_host else streams.current_stream().clock)
