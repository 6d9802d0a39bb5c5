"""The user's own training code: one tensor- and data-parallel linear layer.

Each TP rank holds a slice of the weight's output rows (column parallelism),
each DP rank a slice of the batch. The loss is the mean squared error over the
global batch; the weight gradient is summed over DP ranks.

``MYMODEL_BUG=1`` plants a classic bug: the loss is averaged over the rank's
own batch instead of the global one, so with more than one DP rank every
gradient comes out ``dp`` times too large (and the loss too).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def planted_bug() -> bool:
    return os.environ.get("MYMODEL_BUG") == "1"


def parallel_step(
    x: torch.Tensor,
    weight_rows: torch.Tensor,
    target_columns: torch.Tensor,
    *,
    global_batch: int,
    tp_group: dist.ProcessGroup,
    dp_group: dist.ProcessGroup,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of one step: (the global loss, this rank's weight-row gradient).

    ``x`` is this DP rank's batch slice, ``weight_rows`` this TP rank's rows of
    the weight, ``target_columns`` the matching columns of the target.
    """
    weight = weight_rows.detach().requires_grad_(True)
    out = x @ weight.T  # this rank's output columns
    denominator = x.shape[0] if planted_bug() else global_batch
    partial = ((out - target_columns) ** 2).sum() / denominator
    partial.backward()
    loss = partial.detach().clone()
    dist.all_reduce(loss, group=tp_group)  # every output column
    dist.all_reduce(loss, group=dp_group)  # every batch slice
    grad = weight.grad
    assert grad is not None
    dist.all_reduce(grad, group=dp_group)  # the gradient of the global loss
    return loss, grad
