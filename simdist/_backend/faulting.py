"""What a corrupt fault does to a rank's part of a call (its keys come from the ops table).

A corrupt fault damages what its rank contributes to the call; on a rank that
contributes nothing (a broadcast or scatter member other than the root) it
damages what that rank receives, once the call has completed. Each function
says whether it changed anything: a fault that changed nothing (an empty
tensor, the sign of an integer 0) has not fired.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedOperationError
from .ops import OPS

# Ops whose data flows from the root alone: the other members send nothing.
_FROM_ROOT = frozenset({"broadcast", "scatter"})


def contributes(op: str, group_rank: int, fingerprint: tuple[tuple[str, Any], ...]) -> bool:
    """Whether the member at ``group_rank`` sends data of its own in this call."""
    if op not in _FROM_ROOT:
        return True
    return dict(fingerprint).get("root") == group_rank


def corrupt_contribution(op: str, payload: dict[str, Any], mode: str) -> bool:
    """Damage what a rank contributes to a call, leaving the caller's input
    buffer intact unless the op overwrites it anyway."""
    spec = OPS[op]
    for key in spec.sent:
        if key not in payload:
            continue
        value = payload[key]
        tensors = list(value) if isinstance(value, (list, tuple)) else [value]
        if not spec.sent_is_output:
            tensors = [t.clone() for t in tensors]
            payload[key] = tensors if isinstance(value, (list, tuple)) else tensors[0]
        changed = [corrupt_(t, mode) for t in tensors]
        return any(changed)
    return False


def corrupt_received(op: str, payload: dict[str, Any], mode: str) -> bool:
    """Damage what a rank received from a completed call (its first output)."""
    spec = OPS[op]
    for key in sorted(spec.written | spec.updated):
        value = payload.get(key)
        if value is None:
            continue
        tensors = list(value) if isinstance(value, (list, tuple)) else [value]
        with torch.inference_mode(any(t.is_inference() for t in tensors)):
            changed = [corrupt_(t, mode) for t in tensors]
        return any(changed)
    return False


def corrupt_(t: torch.Tensor, mode: str) -> bool:
    """Damage the first element of ``t`` in place; False when that changed no bit."""
    if t.numel() == 0:
        return False
    before = t.as_strided((1,), (1,)).clone()
    # A one-element view of element [0, ..., 0] whatever the strides
    # (reshape would copy a non-contiguous tensor, and the damage would be lost).
    first = t.as_strided((1,), (1,))
    if mode in ("nan", "inf"):
        if not t.dtype.is_floating_point:
            raise UnsupportedOperationError(f"corrupt mode {mode!r} needs a floating tensor, got {t.dtype}")
        first.fill_(float("nan") if mode == "nan" else float("inf"))
    elif mode == "sign":
        if t.dtype == torch.bool:
            first.logical_not_()
        else:
            first.neg_()
    else:  # bitflip: the top exponent bit for floats, the lowest bit for integers
        if t.dtype == torch.bool:
            first.logical_not_()
        elif t.dtype.is_floating_point:
            bits = {
                torch.float64: torch.int64,
                torch.float32: torch.int32,
                torch.float16: torch.int16,
                torch.bfloat16: torch.int16,
            }[t.dtype]
            # Bit width-2 is the exponent's top bit: flipping it turns a normal
            # number into a huge or tiny one, like a real memory bit flip.
            first.view(bits).bitwise_xor_(1 << (torch.finfo(t.dtype).bits - 2))
        else:
            first.bitwise_xor_(1)
    after = t.as_strided((1,), (1,))
    if after.dtype.is_floating_point or after.dtype.is_complex:
        # Bit by bit: NaN never equals itself, and -0.0 equals 0.0.
        return bool(before.view(torch.uint8).ne(after.view(torch.uint8)).any())
    return bool(before.ne(after).any())
