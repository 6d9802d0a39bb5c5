"""What a corrupt fault does to a rank's contribution (its keys come from the ops table)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedOperationError
from .ops import OPS


def corrupt_contribution(op: str, payload: dict[str, Any], mode: str) -> None:
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
        for t in tensors:
            corrupt_(t, mode)
        return


def corrupt_(t: torch.Tensor, mode: str) -> None:
    """Damage the first element of ``t`` in place."""
    if t.numel() == 0:
        return
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
