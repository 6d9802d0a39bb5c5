"""Which bytes of memory a tensor covers, and whether two tensors share any.

Views and aliases are what matter (a bucket view of a flat gradient buffer, a
``.data`` alias, a slice), so tensors are compared by the memory they cover,
never by identity.
"""

from __future__ import annotations

import torch

# Above this many bytes an exact comparison of two strided, interleaved
# footprints is not attempted: their address ranges overlap, which is taken
# as sharing (the conservative answer for a race check).
_EXACT_LIMIT = 1 << 22


class Footprint:
    """A tensor's address range ``[lo, hi)``, and whether it covers all of it."""

    __slots__ = ("dense", "hi", "lo", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        size = tensor.element_size()
        if tensor.numel() == 0 or tensor.device.type == "meta":
            self.lo = self.hi = 0
            self.dense = True
            return
        span = 1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))
        self.lo = tensor.data_ptr()
        self.hi = self.lo + span * size
        # Every byte of the range is covered unless the strides skip elements
        # (t[::2], a column of a matrix); expanded dimensions only repeat bytes.
        self.dense = span <= tensor.numel()

    @property
    def empty(self) -> bool:
        return self.hi == self.lo


def footprint(tensor: torch.Tensor) -> Footprint:
    return Footprint(tensor)


def overlaps(a: Footprint, b: Footprint) -> bool:
    """Whether ``a`` and ``b`` share at least one byte of memory."""
    if a.empty or b.empty or a.hi <= b.lo or b.hi <= a.lo:
        return False
    if a.tensor.device != b.tensor.device:
        return False
    if a.dense and b.dense:
        return True
    return _exact(a, b)


def _bytes(fp: Footprint, lo: int, hi: int) -> torch.Tensor:
    """The byte addresses (relative to ``lo``) ``fp`` covers, clipped to ``[lo, hi)``."""
    t = fp.tensor
    size = t.element_size()
    index = torch.zeros((), dtype=torch.int64).expand(t.shape).clone()
    for dim, (n, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[dim] = n
        index += (torch.arange(n, dtype=torch.int64) * stride).view(shape)
    starts = index.flatten() * size + (fp.lo - lo)
    every = (starts.unsqueeze(1) + torch.arange(size, dtype=torch.int64)).flatten()
    return every[(every >= 0) & (every < hi - lo)]


def _exact(a: Footprint, b: Footprint) -> bool:
    lo, hi = max(a.lo, b.lo), min(a.hi, b.hi)
    if hi - lo > _EXACT_LIMIT:
        return True
    return bool(torch.isin(_bytes(a, lo, hi), _bytes(b, lo, hi)).any())
