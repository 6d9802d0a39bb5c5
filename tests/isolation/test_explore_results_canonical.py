"""``simdist.explore`` compares any result canonically (issue 28, point 12):
deterministic programs returning numpy arrays, a dataclass holding a tensor,
an exception, or a sparse tensor are no divergence; a real difference in
any of them still is. The programs here are deterministic by construction,
so any divergence reported for them is wrong."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import simdist

TIMEOUT = 60.0


@dataclass
class Holder:
    weights: torch.Tensor
    step: int


def _reduced(ctx: simdist.RankContext) -> torch.Tensor:
    t = torch.ones(3)
    dist.all_reduce(t)
    return t


RESULTS = {
    "numpy": lambda t: t.numpy().copy(),
    "numpy-object": lambda t: np.array([t.numpy().copy(), "x"], dtype=object),
    "dataclass": lambda t: Holder(t, 1),
    "exception": lambda t: ValueError("bad value", t.tolist()),
    "sparse-coo": lambda t: t.to_sparse(),
    "sparse-csr": lambda t: t.reshape(1, 3).to_sparse_csr(),
}


@pytest.mark.parametrize("kind", list(RESULTS))
def test_a_deterministic_program_is_no_divergence_whatever_it_returns(kind: str) -> None:
    make = RESULTS[kind]

    def body(ctx: simdist.RankContext) -> Any:
        return make(_reduced(ctx))

    found = simdist.explore(body, world_size=3, schedules=3, timeout=TIMEOUT)
    assert not found.found, str(found)


@pytest.mark.parametrize("kind", ["numpy", "dataclass", "exception", "sparse-coo"])
def test_results_that_differ_between_schedules_are_still_a_divergence(kind: str) -> None:
    make = RESULTS[kind]

    def body(ctx: simdist.RankContext, box: list[float]) -> Any:
        box[0] = float(ctx.rank)  # the last rank to write wins: a race between schedules
        dist.barrier()
        return make(torch.ones(3) * box[0])

    found = simdist.explore(body, world_size=3, schedules=12, timeout=TIMEOUT, args=([0.0],), share_args=True)
    assert found.found
