"""FSDP2 ``fully_shard``, unmodified: a few AdamW steps equal the single-process run.

Every layer is its own FSDP unit (all-gather before forward and backward,
reduce-scatter of gradients), plus the root; parameters are DTensors sharded
on dim 0, so odd sizes exercise FSDP's padding.
"""

from __future__ import annotations

import pytest
import torch
from client_models import assert_close_dicts, batch, mlp, params
from torch.distributed.fsdp import fully_shard

import simdist

DIMS = (6, 10, 7, 3)  # 10 and 7 rows do not divide by 4: padded shards
ROWS = 4  # per rank
STEPS = 3


def train(model: torch.nn.Module, rows: slice, world: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    for step in range(STEPS):
        x, y = batch(step, ROWS * world, (DIMS[0], DIMS[-1]))
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        opt.step()
        opt.zero_grad()


def fsdp_body(ctx: simdist.RankContext, reshard: bool) -> dict:
    model = mlp(0, DIMS)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(model)
    train(model, slice(ctx.rank * ROWS, (ctx.rank + 1) * ROWS), ctx.world_size)
    return {n: p.full_tensor() for n, p in model.named_parameters()}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("reshard", [True, False])
def test_fully_shard_adamw_steps_equal_the_single_process_run(world: int, reshard: bool) -> None:
    reference = mlp(0, DIMS)
    train(reference, slice(None), world)
    want = params(reference)
    for got in simdist.run(fsdp_body, world_size=world, args=(reshard,)):
        assert_close_dicts(got, want, rtol=1e-10, atol=1e-12)
