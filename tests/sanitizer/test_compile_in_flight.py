"""torch.compile while a collective is in flight: the sanitizer's mode steps
aside while dynamo traces (a mode it cannot trace makes dynamo skip every
frame, so ``fullgraph=True`` failed with "found no compiled frames") and
checks the compiled code's ops when they run."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import simdist


def double(t: torch.Tensor) -> torch.Tensor:
    return t * 2 + 1


def compiles_beside_a_collective(ctx: simdist.RankContext) -> list[float]:
    x = torch.ones(4)
    y = torch.full((4,), float(ctx.rank))
    work = dist.all_reduce(x, async_op=True)
    compiled = torch.compile(double, fullgraph=True, backend="eager")
    out = compiled(y)  # y is not in flight
    work.wait()
    return (out + x).tolist()


def test_fullgraph_compile_runs_while_a_collective_is_in_flight() -> None:
    torch._dynamo.reset()
    results = simdist.run(compiles_beside_a_collective, world_size=2, timeout=120)
    for rank, got in enumerate(results):
        assert got == [rank * 2 + 1 + 2.0] * 4


def compiled_code_reads_in_flight(ctx: simdist.RankContext) -> None:
    x = torch.ones(4)
    work = dist.all_reduce(x, async_op=True)
    compiled = torch.compile(double, fullgraph=True, backend="eager")
    compiled(x)  # reads x while the all_reduce may still write it
    work.wait()


def test_a_race_inside_compiled_code_is_still_reported() -> None:
    torch._dynamo.reset()
    with pytest.raises(simdist.RankError, match="AsyncRaceError"):
        simdist.run(compiled_code_reads_in_flight, world_size=2, timeout=120)
