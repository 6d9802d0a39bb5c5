"""Point-to-point delivery: a matched send copied into its recv."""

from __future__ import annotations

import torch

from .._core.records import P2POp
from ..errors import CollectiveMismatchError


def deliver(send: P2POp, recv: P2POp) -> None:
    """Copy a matched send into its recv (runs under the world lock)."""
    src, dst = send.tensor, recv.tensor
    if src.dtype != dst.dtype or src.numel() != dst.numel():
        raise CollectiveMismatchError(
            f"send/recv mismatch between rank {send.src} and rank {send.dst} (tag {send.tag}): "
            f"send {list(src.shape)} {src.dtype} at {send.site}, "
            f"recv {list(dst.shape)} {dst.dtype} at {recv.site}"
        )
    with torch.inference_mode():
        dst.copy_(src.view(dst.shape))
