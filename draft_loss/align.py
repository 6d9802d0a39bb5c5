"""Eagle-style alignment of the teacher to the draft model's positions.

Draft position t reads the policy hidden state at t and the embedding of token
t+1, and learns the policy's distribution at t+1. So the teacher logits and the
token mask move left by one along the sequence; the vacated last slot is
zeroed (zero logits, zero mask), hence the draft token count is
``token_mask[:, 1:].sum()``, the policy's own shifted-token count.

The sequence dimension is dim 1. Under context parallelism pass ``cp_group``
and this rank's load-balanced shard (``context_parallel.shard_sequence``): the
result is the unsharded alignment, sliced to this rank, the chunk boundaries'
rows coming from the neighbouring CP ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _validation as v
from .context_parallel import shift_left

_WHAT = "align_for_draft"


def align_for_draft(
    teacher_logits: torch.Tensor, token_mask: torch.Tensor, *, cp_group: dist.ProcessGroup | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(teacher, mask)`` shifted left by one position along dim 1.

    Args:
        teacher_logits: ``[batch, seq, V_local]`` policy logits (detached in the result).
        token_mask: ``[batch, seq]`` bool, integer or float mask.
        cp_group: the context-parallel group the sequence is sharded over, or
            None. Every CP rank must call with the same shapes and dtypes.

    Returns new tensors of the inputs' dtypes: ``teacher[:, t] = teacher_logits[:, t + 1]``
    and ``mask[:, t] = token_mask[:, t + 1]`` for ``t < seq - 1``; zeros at ``t = seq - 1``
    (t counts positions of the unsharded, padded sequence under CP).
    """
    teacher = v.check_floating("teacher_logits", teacher_logits, _WHAT)
    if not isinstance(token_mask, torch.Tensor):
        raise TypeError(f"{_WHAT}: token_mask must be a torch.Tensor, got {type(token_mask).__name__}")
    if token_mask.is_complex():
        raise TypeError(
            f"{_WHAT}: token_mask must be bool, integer or real floating, got dtype {token_mask.dtype}"
        )
    if teacher.dim() != 3:
        raise ValueError(
            f"{_WHAT}: teacher_logits must be [batch, seq, V_local], got shape {tuple(teacher.shape)}"
        )
    if tuple(token_mask.shape) != tuple(teacher.shape[:2]):
        raise ValueError(
            f"{_WHAT}: token_mask must be [batch, seq] = {tuple(teacher.shape[:2])}, got {tuple(token_mask.shape)}"
        )
    v.check_same_device("token_mask", token_mask, teacher.device, "teacher_logits", _WHAT)
    shifted_teacher, shifted_mask = shift_left(teacher.detach(), token_mask.detach(), cp_group=cp_group)
    return shifted_teacher, shifted_mask
