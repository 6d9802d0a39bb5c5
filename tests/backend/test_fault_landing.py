"""A corrupt fault lands on data, or it has not fired (issue 28, points 5-6).

On a rank that contributes nothing to a call (a broadcast or scatter member
other than the root) a corrupt fault damages what that rank receives; the
rest of the call's effect on the rank is kept. A corrupt fault that changed
no bit (no data in the call, an empty tensor) has not fired: the run warns
with ``UnfiredFaultPlanWarning`` as for a plan that matched no call. The
reference values are built here with plain torch, never read from simdist.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import FaultPlan, UnfiredFaultPlanWarning
from simdist.policy import SCHEDULES

TIMEOUT = 60.0


def _unfired(record: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, UnfiredFaultPlanWarning)]


def _run(body, faults: FaultPlan, world_size: int = 3, schedule: str = "rank"):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        results = simdist.run(body, world_size=world_size, faults=faults, schedule=schedule, timeout=TIMEOUT)
    return results, _unfired(record)


def _broadcast_from_0(ctx: simdist.RankContext) -> list[float]:
    t = torch.arange(4, dtype=torch.float32) + 10.0 if ctx.rank == 0 else torch.zeros(4)
    dist.broadcast(t, src=0)
    return t.tolist()


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_corrupt_broadcast_on_a_non_root_damages_what_it_receives(schedule: str) -> None:
    results, unfired = _run(
        _broadcast_from_0, FaultPlan.corrupt(rank=1, op="broadcast", mode="sign"), 3, schedule
    )
    sent = (torch.arange(4, dtype=torch.float32) + 10.0).tolist()
    assert results[0] == sent and results[2] == sent
    assert results[1] == [-sent[0]] + sent[1:]  # the broadcast value, its first element damaged
    assert unfired == []


def test_a_corrupt_broadcast_on_the_root_damages_what_every_member_receives() -> None:
    results, unfired = _run(_broadcast_from_0, FaultPlan.corrupt(rank=0, op="broadcast", mode="nan"))
    for rank in (1, 2):
        assert math.isnan(results[rank][0]) and results[rank][1:] == [11.0, 12.0, 13.0]
    assert results[0] == [10.0, 11.0, 12.0, 13.0]  # the root's own buffer is its input
    assert unfired == []


def _scatter_from_0(ctx: simdist.RankContext) -> list[float]:
    out = torch.zeros(2)
    chunks = [torch.full((2,), float(r + 1)) for r in range(ctx.world_size)] if ctx.rank == 0 else None
    dist.scatter(out, chunks, src=0)
    return out.tolist()


def test_a_corrupt_scatter_on_a_non_source_damages_its_chunk_and_fires() -> None:
    results, unfired = _run(_scatter_from_0, FaultPlan.corrupt(rank=2, op="scatter", mode="sign"))
    assert results == [[1.0, 1.0], [2.0, 2.0], [-3.0, 3.0]]
    assert unfired == []


def _barrier_then_p2p(ctx: simdist.RankContext) -> None:
    dist.barrier()
    t = torch.ones(2)
    if ctx.rank == 0:
        dist.send(t, dst=1)
    elif ctx.rank == 1:
        dist.recv(t, src=0)


def test_a_corrupt_fault_that_can_only_meet_a_barrier_or_a_recv_is_unfired() -> None:
    _, unfired = _run(_barrier_then_p2p, FaultPlan.corrupt(rank=1), world_size=2)
    assert len(unfired) == 1


def test_a_corrupt_fault_on_an_empty_tensor_changed_nothing_and_is_unfired() -> None:
    def body(ctx: simdist.RankContext) -> None:
        dist.all_reduce(torch.zeros(0))

    _, unfired = _run(body, FaultPlan.corrupt(rank=1, op="all_reduce"), world_size=2)
    assert len(unfired) == 1


def test_a_corrupt_fault_with_any_op_skips_a_barrier_and_lands_on_the_next_data() -> None:
    def body(ctx: simdist.RankContext) -> list[float]:
        dist.barrier()
        t = torch.ones(2)
        dist.all_reduce(t)
        return t.tolist()

    results, unfired = _run(body, FaultPlan.corrupt(rank=1, mode="sign"), world_size=2)
    assert results == [[0.0, 2.0], [0.0, 2.0]]  # rank 1 sent -1 in place of 1
    assert unfired == []
