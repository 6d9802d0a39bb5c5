"""The pipeline schedule of one microbatch: forward through the stages, backward back through them.

Activations travel to the next stage and their gradients back by send/recv
over the PP group; the last stage computes the losses and starts backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ..stats import DraftLossStats
from .batch import CotrainBatch
from .groups import ParallelGroups
from .model import StageModel
from .probe import Probe, reach

LossOf = Callable[[torch.Tensor, DraftLossStats], torch.Tensor]


def forward_backward(
    model: StageModel,
    groups: ParallelGroups,
    batch: CotrainBatch,
    loss_of: LossOf,
    probe: Probe | None,
    point: str,
) -> tuple[torch.Tensor, DraftLossStats] | None:
    """One pipelined forward and backward of ``batch``; (policy sum, draft stats) on the last stage."""
    reach(probe, f"{point}:forward")
    shape, dtype = model.hidden_shape(batch.tokens), model.config.dtype
    h_in: torch.Tensor | None = None
    if model.is_first:
        hidden = model.embed(batch.tokens)
    else:
        h_in = torch.empty(shape, dtype=dtype)
        dist.recv(h_in, src=_peer(model, groups, -1), group=groups.pp)
        h_in.requires_grad_(True)
        hidden = h_in
    for i in model.layers:
        hidden = model.layer(i, hidden, groups.tp)
    sums = None
    if model.is_last:
        policy_sum, stats = model.losses(batch, hidden, groups)
        loss = loss_of(policy_sum, stats)
        reach(probe, f"{point}:backward")
        loss.backward()
        sums = (policy_sum, stats)
    else:
        dist.send(hidden.detach().contiguous(), dst=_peer(model, groups, +1), group=groups.pp)
        grad_out = torch.empty(shape, dtype=dtype)
        dist.recv(grad_out, src=_peer(model, groups, +1), group=groups.pp)
        reach(probe, f"{point}:backward")
        if hidden.requires_grad:
            torch.autograd.backward(hidden, grad_out)
    if h_in is not None:
        grad_in = h_in.grad if h_in.grad is not None else torch.zeros(shape, dtype=dtype)
        dist.send(grad_in.contiguous(), dst=_peer(model, groups, -1), group=groups.pp)
    return sums


def _peer(model: StageModel, groups: ParallelGroups, offset: int) -> int:
    """The global rank of the stage ``offset`` away from this one."""
    assert groups.pp is not None, "a pipeline peer exists only with more than one stage"
    return dist.get_global_rank(groups.pp, model.stage + offset)
