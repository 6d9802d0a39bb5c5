"""Compiled autograd keeps one active region per process (in C++): two
ranks' backwards under it, interleaved at a collective, are refused by torch
("within another compiled autograd call"). Processes of a real world each have
their own region. Pinned here as a known difference (docs/differences.md)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._dynamo import compiled_autograd

import simdist


def backward_under_compiled_autograd(ctx: simdist.RankContext) -> list[float]:
    w = torch.nn.Parameter(torch.ones(4))
    w.register_hook(lambda g: (dist.all_reduce(g), g)[1])
    loss = (w * 2).sum()
    with compiled_autograd._enable(torch.compile(backend="eager")):
        loss.backward()
    return w.grad.tolist() if w.grad is not None else []


def test_compiled_autograd_in_two_ranks_at_once_is_refused_by_torch() -> None:
    torch._dynamo.reset()
    with pytest.raises(simdist.RankError, match="within another compiled autograd call"):
        simdist.run(backward_under_compiled_autograd, world_size=2, timeout=120)
