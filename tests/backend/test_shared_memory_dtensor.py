"""Module-level tensors under DTensor: members sharing memory with identical values proceed.

Rank threads share module globals, so DTensor's ``distribute_tensor(X, ...)``
over a module-level ``X`` broadcasts into the same memory from every rank, with
the values every rank already holds: a cluster computes the same, so simdist
must too. Each test is written as a DTensor test of a cluster would be, over
module-level tensors, and compared with plain float64 maths in one process.
Sharing that can change the outcome stays a ``BufferOverlapError``
(tests/test_adversarial_buffers.py, and the last tests here).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import simdist
from simdist import Layout

TIMEOUT = 120.0
_gen = torch.Generator().manual_seed(11)
X = torch.randn(8, 6, generator=_gen, dtype=torch.float64)  # shared by every rank thread
W = torch.randn(6, 4, generator=_gen, dtype=torch.float64)
SCRATCH = torch.zeros(4)


def replicate_and_shard(ctx: simdist.RankContext) -> list[list[float]]:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rep = distribute_tensor(X, mesh, [Replicate(), Replicate()])
    sharded = distribute_tensor(X, mesh, [Replicate(), Shard(0)])
    return [rep.to_local().flatten().tolist(), sharded.full_tensor().flatten().tolist()]


def test_distribute_tensor_over_a_module_level_tensor() -> None:
    want = X.flatten().tolist()
    before = X.clone()
    for rep, full in simdist.run(replicate_and_shard, layout=Layout(tp=2, dp=2), timeout=TIMEOUT):
        assert rep == want and full == want
    assert torch.equal(X, before)


def redistribute_body(ctx: simdist.RankContext) -> list[float]:
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    d = distribute_tensor(X, mesh, [Shard(0)])
    d = d.redistribute(mesh, [Shard(1)]).redistribute(mesh, [Replicate()])
    return d.to_local().flatten().tolist()


def test_redistribute_of_a_module_level_tensor() -> None:
    assert simdist.run(redistribute_body, world_size=4, timeout=TIMEOUT) == [X.flatten().tolist()] * 4


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(6, 4, bias=False, dtype=torch.float64)
        self.down = nn.Linear(4, 6, bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.up.weight.copy_(W.t())
            self.down.weight.copy_(W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def matmul_and_backward(ctx: simdist.RankContext) -> tuple[list[float], list[float], list[float]]:
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    model = parallelize_module(Pair(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x = X.clone().requires_grad_(True)
    y = model(x)
    y.sum().backward()
    up_grad = model.up.weight.grad.full_tensor()
    # A module-level weight as a replicated DTensor matmul, gathered with full_tensor().
    w = distribute_tensor(W, mesh, [Replicate()])
    xs = distribute_tensor(X, mesh, [Shard(0)])
    prod = (xs @ w).full_tensor()
    return y.flatten().tolist(), up_grad.flatten().tolist(), prod.flatten().tolist()


def test_colwise_rowwise_matmul_full_tensor_and_backward_over_module_level_tensors() -> None:
    ref = Pair()
    x = X.clone().requires_grad_(True)
    y = ref(x)
    y.sum().backward()
    want = (y.flatten().tolist(), ref.up.weight.grad.flatten().tolist(), (X @ W).flatten().tolist())
    for got in simdist.run(matmul_and_backward, world_size=2, timeout=TIMEOUT):
        for a, b in zip(got, want):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-12, atol=1e-12)


# --- sharing that can change the outcome still fails --------------------------------


def different_values_into_shared_output(ctx: simdist.RankContext) -> None:
    # Each rank receives other rows into the one module-level output tensor.
    dist.all_to_all_single(SCRATCH, torch.arange(4.0) + 10 * ctx.rank)


def divergent_sources(ctx: simdist.RankContext) -> None:
    # The root broadcasts a module-level tensor into a private one, while
    # another rank receives into the module-level tensor: it changes the
    # memory the root reads.
    if ctx.rank == 0:
        dist.broadcast(SCRATCH, 0)
    else:
        own = torch.full((4,), 7.0)
        dist.broadcast(own, 0)
        dist.all_gather_into_tensor(SCRATCH, torch.full((2,), 5.0))
        return
    dist.all_gather_into_tensor(torch.zeros(4), SCRATCH.narrow(0, 0, 2))


def gathered_into_module_tensor(ctx: simdist.RankContext) -> None:
    dist.all_gather_into_tensor(SCRATCH, torch.full((2,), float(ctx.rank)))  # the same output for all


def test_members_writing_different_values_into_shared_memory_are_refused() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(different_values_into_shared_output, world_size=2, timeout=TIMEOUT)
    cause = info.value.__cause__
    assert isinstance(cause, simdist.BufferOverlapError)
    assert str(cause).startswith("all_to_all_single on world [0, 1] seq 0: rank 0's output 'out'")
    assert "share memory" in str(cause)


def test_an_output_over_another_members_input_is_refused_even_with_equal_values() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(divergent_sources, world_size=2, timeout=TIMEOUT)
    cause = info.value.__cause__
    assert isinstance(cause, simdist.BufferOverlapError)
    assert "all_gather_into_tensor on world [0, 1] seq 1" in str(cause)


def test_every_member_gathering_into_one_module_tensor_proceeds() -> None:
    SCRATCH.zero_()
    simdist.run(gathered_into_module_tensor, world_size=2, timeout=TIMEOUT)
    assert SCRATCH.tolist() == [0.0, 0.0, 1.0, 1.0]
