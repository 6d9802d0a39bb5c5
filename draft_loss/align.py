"""Eagle-style alignment of the teacher to the draft model's positions.

Draft position t reads the policy hidden state at t and the embedding of token
t+1, and learns the policy's distribution at t+1. So the teacher logits and the
token mask move left by one along the sequence; the vacated last slot is
zeroed (zero logits, zero mask), hence the draft token count is
``token_mask[:, 1:].sum()``, the policy's own shifted-token count.

The sequence dimension is dim 1 and must be whole on this rank: with context
parallelism the shift would cross shard boundaries, which this function does
not model.
"""

from __future__ import annotations

import torch

from . import _validation as v

_WHAT = "align_for_draft"


def align_for_draft(teacher_logits: torch.Tensor, token_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(teacher, mask)`` shifted left by one position along dim 1.

    Args:
        teacher_logits: ``[batch, seq, V_local]`` policy logits (detached in the result).
        token_mask: ``[batch, seq]`` bool, integer or float mask.

    Returns new tensors of the inputs' dtypes: ``teacher[:, t] = teacher_logits[:, t + 1]``
    and ``mask[:, t] = token_mask[:, t + 1]`` for ``t < seq - 1``; zeros at ``t = seq - 1``.
    """
    teacher = v.check_floating("teacher_logits", teacher_logits, _WHAT)
    if not isinstance(token_mask, torch.Tensor):
        raise TypeError(f"{_WHAT}: token_mask must be a torch.Tensor, got {type(token_mask).__name__}")
    if token_mask.is_complex():
        raise TypeError(f"{_WHAT}: token_mask must be bool, integer or real floating, got dtype {token_mask.dtype}")
    if teacher.dim() != 3:
        raise ValueError(f"{_WHAT}: teacher_logits must be [batch, seq, V_local], got shape {tuple(teacher.shape)}")
    if tuple(token_mask.shape) != tuple(teacher.shape[:2]):
        raise ValueError(
            f"{_WHAT}: token_mask must be [batch, seq] = {tuple(teacher.shape[:2])}, got {tuple(token_mask.shape)}"
        )
    v.check_same_device("token_mask", token_mask, teacher.device, "teacher_logits", _WHAT)
    return _shift_left(teacher.detach()), _shift_left(token_mask.detach())


def _shift_left(values: torch.Tensor) -> torch.Tensor:
    shifted = torch.zeros_like(values)
    shifted[:, :-1] = values[:, 1:]
    return shifted
