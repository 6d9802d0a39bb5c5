"""torch.distributed.pipelining, unmodified: every schedule's losses and
gradients equal one process running the whole model on the whole batch.

GPipe and 1F1B (one stage a rank), interleaved 1F1B and interleaved zero
bubble (two stages a rank, round robin), ZBV zero bubble (two stages a rank in
a V: rank 0 holds the first and the last). Point-to-point traffic goes through
simdist's send/recv with NCCL's matching rules.
"""

from __future__ import annotations

import pytest
import torch
from client_models import assert_close_dicts, batch, grads, mlp
from torch.distributed import pipelining as pp

import simdist

WORLD = 2
MICRO = 4
ROWS = 8  # the whole batch; 2 rows a microbatch
DIMS = (5, 8, 8, 8, 3)  # four Linear layers: one per stage


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, target)


def whole() -> torch.nn.Sequential:
    return mlp(7, DIMS)


SCHEDULES = {
    # name: (schedule class, stages a rank holds, for rank r of WORLD)
    "GPipe": (pp.ScheduleGPipe, lambda r: [r]),
    "1F1B": (pp.Schedule1F1B, lambda r: [r]),
    "Interleaved1F1B": (pp.ScheduleInterleaved1F1B, lambda r: [r, r + WORLD]),
    "InterleavedZeroBubble": (pp.ScheduleInterleavedZeroBubble, lambda r: [r, r + WORLD]),
    "ZBVZeroBubble": (pp.ScheduleZBVZeroBubble, lambda r: [r, 2 * WORLD - 1 - r]),
}


def split(model: torch.nn.Sequential, n_stages: int) -> list[torch.nn.Sequential]:
    """Cut after every other Tanh (two stages) or after every Tanh (four)."""
    every = 4 // n_stages
    stages, current, tanhs = [], [], 0
    for layer in model:
        current.append(layer)
        if isinstance(layer, torch.nn.Tanh):
            tanhs += 1
            if tanhs % every == 0:
                stages.append(torch.nn.Sequential(*current))
                current = []
    stages.append(torch.nn.Sequential(*current))
    assert len(stages) == n_stages
    return stages


def pipeline_body(ctx: simdist.RankContext, name: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    cls, my_stages = SCHEDULES[name]
    indices = my_stages(ctx.rank)
    n_stages = WORLD * len(indices)
    parts = split(whole(), n_stages)
    stages = [pp.PipelineStage(parts[i], i, n_stages, torch.device("cpu")) for i in indices]
    schedule = cls(stages if len(stages) > 1 else stages[0], n_microbatches=MICRO, loss_fn=loss_fn)
    x, y = batch(3, ROWS, (DIMS[0], DIMS[-1]))
    losses: list[torch.Tensor] = []
    holds_first = 0 in indices
    holds_last = n_stages - 1 in indices
    schedule.step(*((x,) if holds_first else ()), target=y if holds_last else None, losses=losses)
    named = {}
    for i in indices:
        for n, g in grads(parts[i]).items():
            named[f"stage{i}.{n}"] = g
    return [float(l.detach()) for l in losses], named


def reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    model = whole()
    x, y = batch(3, ROWS, (DIMS[0], DIMS[-1]))
    losses = [float(loss_fn(model(xm), ym).detach()) for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO))]
    loss_fn(model(x), y).backward()  # mean of equal microbatch means: the same gradients
    return losses, grads(model)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_pipeline_schedule_equals_the_whole_model(name: str) -> None:
    want_losses, want_grads = reference()
    per_rank = simdist.run(pipeline_body, world_size=WORLD, args=(name,))
    losses = [l for rank_losses, _ in per_rank for l in rank_losses]  # the last stage's rank only
    assert len(losses) == MICRO
    assert losses == pytest.approx(want_losses, rel=1e-12)
    got: dict[str, torch.Tensor] = {}
    for _, named in per_rank:
        got.update(named)
    n_stages = WORLD * len(SCHEDULES[name][1](0))
    # Map each stage's parameters back to the whole model's names.
    offset, mapped = 0, {}
    for i, part in enumerate(split(whole(), n_stages)):
        for local_name, _ in part.named_parameters():
            layer, kind = local_name.split(".")
            mapped[f"{int(layer) + offset}.{kind}"] = got[f"stage{i}.{local_name}"]
        offset += len(part)
    assert_close_dicts(mapped, want_grads, rtol=1e-12, atol=1e-14)
