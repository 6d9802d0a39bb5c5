"""Per-rank seeded randomness, as training scripts write it, equals a real
gloo world bitwise: torch's generator (randn, dropout, randperm), Python's
``random`` and numpy's global state, with collectives between draws so that
ranks interleave."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.distributed as dist

import simdist

WORLD = 4


def seeded_body(ctx: simdist.RankContext) -> dict:
    torch.manual_seed(1234 + ctx.rank)
    random.seed(1234 + ctx.rank)
    np.random.seed(1234 + ctx.rank)
    out: dict[str, list] = {"randn": [], "dropout": [], "perm": [], "random": [], "numpy": []}
    for _ in range(3):
        out["randn"].append(torch.randn(5))
        out["dropout"].append(torch.nn.functional.dropout(torch.ones(16), p=0.5, training=True))
        t = torch.ones(2)
        dist.all_reduce(t)  # the token passes: peers draw in between
        out["perm"].append(torch.randperm(10))
        out["random"].append([random.random(), random.gauss(0.0, 1.0)])
        dist.barrier()
        out["numpy"].append(np.random.randn(3).tolist())
    return out


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        for x, y in zip(a[key], b[key], strict=True):
            if isinstance(x, torch.Tensor):
                assert torch.equal(x, y), key
            else:
                assert x == y, key


@pytest.mark.gloo
def test_seeded_draws_equal_a_gloo_world_bitwise() -> None:
    real = simdist.run_processes(seeded_body, world_size=WORLD, backend="gloo")
    for schedule in ("rank", "random"):
        sim = simdist.run(seeded_body, world_size=WORLD, schedule=schedule, schedule_seed=3)
        for rank in range(WORLD):
            assert_bitwise_equal(sim[rank], real[rank])
    assert not torch.equal(real[0]["randn"][0], real[1]["randn"][0]), "ranks draw different values"
