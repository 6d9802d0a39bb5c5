"""Soft cross-entropy of draft logits ``hidden @ output_weight.T`` that are never materialised.

The draft head's logits exist only one token tile at a time, in forward and
again in backward, so neither the ``[T, V]`` logits nor their gradient is ever
held. Gradients flow to ``student_hidden`` and ``output_weight``. Under tensor
parallelism the vocabulary rows of ``output_weight`` are sharded; the hidden
state is replicated, so its gradient (a partial sum on each rank) is
all-reduced over the TP group in backward, so the TP ranks agree in forward
that they all need gradients, or none does (ValueError on every rank otherwise).

Numerics and non-finite handling are those of ``soft_cross_entropy``. The
logits of a tile are computed in the parameters' dtype (as a bf16 model head
would), then the softmax work in float32 (float64 for float64 inputs). The
weight gradient is accumulated over tiles in float32 and the hidden gradient
is reduced in float32 before the cast back.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from . import _validation as v
from .soft_ce import (
    TilePlan,
    Workspace,
    bin_counts,
    masked_numerators,
    tile_forward,
    token_scale,
    write_scaled_difference,
)
from .stats import DraftLossStats

_WHAT = "projected_soft_cross_entropy"


def projected_soft_cross_entropy(
    student_hidden: torch.Tensor,
    output_weight: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    tp_group: dist.ProcessGroup | None,
    token_chunk_size: int,
    bin_ids: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> DraftLossStats:
    """Binned soft cross-entropy of ``student_hidden @ output_weight.T`` against ``teacher_logits``.

    Args:
        student_hidden: ``[..., H]`` draft hidden states, identical on every TP rank.
        output_weight: ``[V_local, H]`` this rank's vocabulary rows of the draft head,
            same dtype and device as ``student_hidden``.
        teacher_logits: ``[..., V_local]``; treated as detached.
        mask, tp_group, token_chunk_size, bin_ids, weights: as in ``soft_cross_entropy``.
    """
    group_size = v.check_group(tp_group, _WHAT)

    def check() -> tuple[v.TokenInputs, v.Header]:
        return _check_arguments(
            student_hidden, output_weight, teacher_logits, mask, token_chunk_size, bin_ids, weights
        )

    tokens = v.validate_on_every_rank(tp_group, group_size, _WHAT, check)
    hidden_size = student_hidden.shape[-1]
    plan = TilePlan(tokens, tp_group, group_size, token_chunk_size)
    numerators = _ProjectedSoftCrossEntropy.apply(
        student_hidden.reshape(-1, hidden_size),
        output_weight,
        teacher_logits.detach().reshape(-1, teacher_logits.shape[-1]),
        plan,
    )
    return DraftLossStats(numerators, bin_counts(tokens), tokens.weights)


def _check_arguments(
    hidden: object,
    weight: object,
    teacher: object,
    mask: object,
    token_chunk_size: object,
    bin_ids: object,
    weights: object,
) -> tuple[v.TokenInputs, v.Header]:
    hidden = v.check_floating("student_hidden", hidden, _WHAT)
    weight = v.check_floating("output_weight", weight, _WHAT, min_dim=2)
    teacher = v.check_floating("teacher_logits", teacher, _WHAT)
    if weight.dim() != 2:
        raise ValueError(f"{_WHAT}: output_weight must be 2-D [V_local, H], got shape {tuple(weight.shape)}")
    if weight.dtype != hidden.dtype:
        raise TypeError(
            f"{_WHAT}: output_weight must have the dtype of student_hidden ({hidden.dtype}), got {weight.dtype}"
        )
    hidden_size = hidden.shape[-1]
    if weight.shape[1] != hidden_size:
        raise ValueError(
            f"{_WHAT}: output_weight must be [V_local, {hidden_size}] (H of student_hidden), "
            f"got shape {tuple(weight.shape)}"
        )
    if weight.shape[0] < 1:
        raise ValueError(f"{_WHAT}: the vocabulary shard (rows of output_weight) must be >= 1, got 0")
    leading = tuple(hidden.shape[:-1])
    expected_teacher = leading + (weight.shape[0],)
    if tuple(teacher.shape) != expected_teacher:
        raise ValueError(
            f"{_WHAT}: teacher_logits must have shape {expected_teacher} (hidden's leading dims, V_local), "
            f"got {tuple(teacher.shape)}"
        )
    v.check_same_device("output_weight", weight, hidden.device, "student_hidden", _WHAT)
    v.check_same_device("teacher_logits", teacher, hidden.device, "student_hidden", _WHAT)
    chunk = v.check_chunk_size(token_chunk_size, _WHAT)
    compute_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    tokens = v.check_token_inputs(
        _WHAT, leading, hidden.device, "student_hidden", mask, bin_ids, weights, compute_dtype
    )
    header: v.Header = (
        (v.FUNCTION_FIELD, 2),
        ("number of leading dims", len(leading)),
        ("leading shape (digest)", v.shape_digest(leading)),
        ("number of tokens", int(torch.Size(leading).numel())),
        ("student_hidden dtype", v.dtype_code(hidden.dtype)),
        ("teacher_logits dtype", v.dtype_code(teacher.dtype)),
        ("hidden size", hidden_size),
        ("token_chunk_size", chunk),
        # Backward all-reduces the hidden gradient over TP: if one rank's graph
        # has no backward, its peers would wait there for ever.
        (v.GRADIENTS_FIELD, int(torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad))),
    )
    return tokens, header + tokens.header


class _ProjectedSoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, teacher: torch.Tensor, plan: TilePlan
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        vocab = weight.shape[0]
        tokens = plan.tokens
        tiles = plan.tiles(num_tokens)
        cached = len(tiles) == 1
        workspace_rows = num_tokens if cached else plan.block_rows(vocab)
        workspace = Workspace(workspace_rows, vocab, tokens.compute_dtype, hidden.device)
        ce = torch.empty(num_tokens, dtype=tokens.compute_dtype, device=hidden.device)
        lse_s = torch.empty_like(ce)
        lse_z = torch.empty_like(ce)
        difference = None
        for rows in tiles:
            logits = hidden[rows] @ weight.t()
            result = tile_forward(logits, teacher[rows], plan, workspace, keep=cached)
            ce[rows], lse_s[rows], lse_z[rows] = result.ce, result.lse_student, result.lse_teacher
            difference = result.probability_difference
        ctx.plan = plan
        ctx.cached = cached
        if cached:
            ctx.save_for_backward(hidden, weight, difference)
        else:
            ctx.save_for_backward(hidden, weight, teacher, lse_s, lse_z)
        return masked_numerators(ce, tokens)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_numerators: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        plan: TilePlan = ctx.plan
        tokens = plan.tokens
        compute = tokens.compute_dtype
        scale = token_scale(tokens, grad_numerators)
        if ctx.cached:
            hidden, weight, difference = ctx.saved_tensors
        else:
            hidden, weight, teacher, lse_s, lse_z = ctx.saved_tensors
        num_tokens = hidden.shape[0]
        vocab = weight.shape[0]
        blocks = Workspace(plan.block_rows(vocab), vocab, compute, hidden.device)
        # The matmuls want a whole tile of the logits' gradient at once (per
        # block, the weight gradient would be re-read for every few rows).
        tile_gradient = Workspace(min(plan.chunk, num_tokens), vocab, compute, hidden.device)
        grad_hidden = torch.zeros(hidden.shape, dtype=compute, device=hidden.device)
        grad_weight = torch.zeros(weight.shape, dtype=compute, device=weight.device)
        for rows in plan.tiles(num_tokens):
            if ctx.cached:
                tile = difference * scale[rows, None]
            else:
                logits = hidden[rows] @ weight.t()
                tile = tile_gradient.get("gradient", rows.stop - rows.start)
                write_scaled_difference(
                    logits, teacher[rows], lse_s[rows], lse_z[rows], scale[rows], blocks, tile
                )
            # Masked tokens must not reach the matmuls (their gradient rows stay
            # 0): a NaN in their logits or hidden state times 0 is still NaN and
            # would spread to every row of the weight gradient.
            token_hidden = hidden[rows]
            kept = (tokens.mask[rows] != 0).nonzero().reshape(-1)
            if kept.numel() < tile.shape[0]:
                tile = tile.index_select(0, kept)
                token_hidden = token_hidden.index_select(0, kept)
                grad_hidden[rows].index_copy_(0, kept, (tile.to(weight.dtype) @ weight).to(compute))
            else:
                grad_hidden[rows] = tile.to(weight.dtype) @ weight
            grad_weight.addmm_(tile.t(), token_hidden.to(compute))
        # The hidden state is replicated over TP; each rank holds the part of
        # its gradient that flows through its vocabulary rows.
        plan.all_reduce(grad_hidden, dist.ReduceOp.SUM)
        return grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype), None, None
