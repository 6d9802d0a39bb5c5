"""Megatron-style tensor-parallel building blocks for the reference co-training model.

``copy_to_tp`` and ``reduce_from_tp`` are the conjugate pair around a
column-parallel / row-parallel layer: a replicated activation entering a
sharded layer needs its gradient summed over TP ranks, and partial outputs of a
row-parallel layer need their values summed. ``vocab_parallel_cross_entropy``
is the policy's hard-label loss with the vocabulary sharded over TP.
``tp_group=None`` means no tensor parallelism: every op is then local.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable


def _all_reduce(
    tensor: torch.Tensor, group: dist.ProcessGroup | None, op: Any = dist.ReduceOp.SUM
) -> torch.Tensor:
    if group is not None:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


class _CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad.contiguous().clone(), ctx.group), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        return _all_reduce(x.contiguous().clone(), group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Identity forward; gradient summed over the TP group (replicated input of a sharded layer)."""
    return _CopyToTensorParallel.apply(x, group) if group is not None else x


def reduce_from_tp(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum over the TP group forward; identity gradient (output of a row-parallel layer)."""
    return _ReduceFromTensorParallel.apply(x, group) if group is not None else x


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        vocab_start: int,
        group: dist.ProcessGroup | None,
    ) -> torch.Tensor:
        x = logits.float()
        row_max = _all_reduce(x.max(dim=-1).values, group, dist.ReduceOp.MAX)
        shifted = x - row_max.unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = _all_reduce(exp.sum(dim=-1), group)
        local = labels - vocab_start
        owned = (local >= 0) & (local < x.shape[-1])
        local = torch.where(owned, local, torch.zeros_like(local))
        target = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1)
        # Exactly one rank owns each label; the others add 0.
        target = _all_reduce(torch.where(owned, target, torch.zeros_like(target)), group)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local, owned)
        ctx.logits_dtype = logits.dtype
        return sum_exp.log() - target

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, local, owned = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local.unsqueeze(-1), -owned.to(grad.dtype).unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad.to(ctx.logits_dtype), None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, vocab_start: int, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Per-token ``-log softmax(logits)[label]`` in float32, vocabulary sharded over ``group``.

    ``logits`` is ``[..., V_local]`` holding vocabulary rows
    ``[vocab_start, vocab_start + V_local)``; ``labels`` is ``[...]`` of global ids.
    """
    return _VocabParallelCrossEntropy.apply(logits, labels, vocab_start, group)
