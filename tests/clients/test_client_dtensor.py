"""DTensor tensor parallelism, unmodified: ``init_device_mesh("cpu", ...)``,
``parallelize_module`` with SequenceParallel, ColwiseParallel and
RowwiseParallel, and a vocabulary-parallel cross-entropy under
``loss_parallel()`` entered by every rank, against one float64 process.

``loss_parallel()`` edits DTensor's process-wide op-handler table; simdist
keeps that table rank-local by default (tests/clients/test_rank_local_defaults.py
shows what happens without it).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

import simdist

B, S, D, H, V = 2, 8, 6, 8, 12  # batch, sequence, model, hidden, vocabulary: S, H, V divide by 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.norm = nn.LayerNorm(D, dtype=torch.float64)
        self.w1 = nn.Linear(D, H, dtype=torch.float64)
        self.w2 = nn.Linear(H, D, dtype=torch.float64)
        self.head = nn.Linear(D, V, bias=False, dtype=torch.float64)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return self.head(h + self.w2(torch.tanh(self.w1(h))))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(9)
    return torch.randn(B, S, D, generator=gen, dtype=torch.float64), torch.randint(V, (B, S), generator=gen)


PLAN = {
    "norm": SequenceParallel(use_local_output=True),  # sequence-sharded activations in and out
    "w1": ColwiseParallel(input_layouts=Shard(1)),  # all-gathers the sequence
    "w2": RowwiseParallel(output_layouts=Shard(1)),  # reduce-scatters back to the sequence
    "head": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),  # vocab-sharded logits
}


def tp_body(ctx: simdist.RankContext) -> tuple[float, dict[str, torch.Tensor]]:
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    model = parallelize_module(Block(), mesh, PLAN)
    x, target = data()
    chunk = S // ctx.world_size
    # The residual stream is sequence-parallel: each rank feeds its own positions.
    mine = x[:, ctx.rank * chunk : (ctx.rank + 1) * chunk]
    logits = model(mine)
    with loss_parallel():
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        loss.backward()
    return loss.full_tensor().item(), {n: p.grad.full_tensor() for n, p in model.named_parameters()}


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_block_with_loss_parallel_equals_one_process(world: int) -> None:
    model = Block()
    x, target = data()
    want = F.cross_entropy(model(x).flatten(0, 1), target.flatten())
    want.backward()
    for loss, got in simdist.run(tp_body, world_size=world):
        assert loss == pytest.approx(want.item(), rel=1e-12)
        for n, p in model.named_parameters():
            torch.testing.assert_close(got[n], p.grad, rtol=1e-10, atol=1e-12, msg=lambda m, n=n: f"{n}: {m}")
