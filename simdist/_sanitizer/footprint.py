"""Which bytes of memory a tensor covers, and whether two tensors share any.

Views and aliases are what matter (a bucket view of a flat gradient buffer, a
``.data`` alias, a slice), so tensors are compared by the memory they cover,
never by identity.
"""

from __future__ import annotations

import math

import torch


class Footprint:
    """A tensor's address range ``[lo, hi)``, and whether it covers all of it."""

    __slots__ = ("dense", "hi", "lo", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor  # torch has no negative strides: data_ptr() is the lowest address
        size = tensor.element_size()
        if tensor.numel() == 0 or tensor.device.type == "meta":
            self.lo = self.hi = 0
            self.dense = True
            return
        span = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
        self.lo = tensor.data_ptr()
        self.hi = self.lo + span * size
        self.dense = _covers_its_range(tensor)

    @property
    def empty(self) -> bool:
        return self.hi == self.lo


footprint = Footprint  # (the name the sanitizer's modules and tests use)


def _covers_its_range(tensor: torch.Tensor) -> bool:
    """Whether the elements tile the address range without a gap: strides, in
    increasing order, each the product of the extents below it (a contiguous
    tensor, any permutation of one). Expanded dimensions (stride 0) only
    repeat bytes. Anything else (``t[::2]``, a column of a matrix, an
    overlapping ``as_strided``) is compared element by element (``_exact``)."""
    if tensor.is_contiguous():
        return True
    expected = 1
    for stride, n in sorted((s, n) for n, s in zip(tensor.shape, tensor.stride()) if n > 1 and s != 0):
        if stride != expected:
            return False
        expected *= n
    return True


def overlaps(a: Footprint, b: Footprint) -> bool:
    """Whether ``a`` and ``b`` share at least one byte of memory."""
    if a.empty or b.empty or a.hi <= b.lo or b.hi <= a.lo:
        return False
    if a.tensor.device != b.tensor.device:
        return False
    if a.dense and b.dense:
        return True
    return _exact(a, b)


def _exact(a: Footprint, b: Footprint) -> bool:
    """Exact sharing of two address-overlapping footprints, at least one strided."""
    verdict = _on_one_lattice(a, b)
    if verdict is not None:
        return verdict
    if _residues_apart(a, b):
        return False
    return _starts_meet(a, b)


def _dims(fp: Footprint) -> list[tuple[int, int]]:
    """(stride in bytes, extent) of each dimension that reaches more than one
    address (an expanded dimension, stride 0, only repeats its bytes)."""
    size = fp.tensor.element_size()
    return [(s * size, n) for n, s in zip(fp.tensor.shape, fp.tensor.stride()) if n > 1 and s != 0]


def _on_one_lattice(a: Footprint, b: Footprint) -> bool | None:
    """Views of one strided layout (columns or blocks of a matrix, every k-th
    element): each address is a unique mixed-radix number over the layouts'
    common strides, and two boxes of digits meet iff they meet in every digit.
    None when the layouts do not nest that way."""
    size = a.tensor.element_size()
    if b.tensor.element_size() != size:
        return None
    dims_a: dict[int, int] = {}
    dims_b: dict[int, int] = {}
    for listed, target in ((_dims(a), dims_a), (_dims(b), dims_b)):
        for stride, n in listed:
            if stride in target:
                return None  # two dimensions with one stride: not a lattice
            target[stride] = n
    strides = sorted(set(dims_a) | set(dims_b), reverse=True)
    extents = [max(dims_a.get(s, 1), dims_b.get(s, 1)) for s in strides]
    # Nested: each digit's whole range fits below the next one up, and an
    # element fits below the smallest stride.
    for k in range(1, len(strides)):
        if strides[k] * extents[k] > strides[k - 1]:
            return None
    if strides and strides[-1] < size:
        return None
    base = min(a.lo, b.lo)
    boxes = []
    for fp, dims in ((a, dims_a), (b, dims_b)):
        rest = fp.lo - base
        digits = []
        for k, stride in enumerate(strides):
            digit, rest = divmod(rest, stride)
            high = digit + dims.get(stride, 1)
            if k > 0 and high * stride > strides[k - 1]:
                return None  # the box carries into the next digit
            digits.append((digit, high))
        if strides and rest + size > strides[-1]:
            return None  # an element straddles two digits
        boxes.append((digits, rest))
    (digits_a, rest_a), (digits_b, rest_b) = boxes
    if any(lo_b >= hi_a or lo_a >= hi_b for (lo_a, hi_a), (lo_b, hi_b) in zip(digits_a, digits_b)):
        return False
    return rest_a < rest_b + size and rest_b < rest_a + size


def _residues_apart(a: Footprint, b: Footprint) -> bool:
    """Every address of a tensor lies at its start plus a multiple of the gcd
    of its strides: bytes of ``a`` and ``b`` in different residue classes
    modulo the common gcd never meet (every other element of a buffer)."""
    g = 0
    for fp in (a, b):
        for stride, _ in _dims(fp):
            g = math.gcd(g, stride)
    if g == 0:
        return False
    ra, rb = a.lo % g, b.lo % g
    sa, sb = a.tensor.element_size(), b.tensor.element_size()
    if sa >= g or sb >= g:
        return False
    # Intervals [ra, ra + sa) and [rb, rb + sb) on a circle of length g.
    return (rb - ra) % g >= sa and (ra - rb) % g >= sb


def _starts(fp: Footprint) -> torch.Tensor:
    """The byte address of each element, relative to the tensor's first, sorted."""
    t = fp.tensor
    size = t.element_size()
    index = torch.zeros((), dtype=torch.int64).expand(t.shape).clone()
    for dim, (n, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[dim] = n
        index += (torch.arange(n, dtype=torch.int64) * stride).view(shape)
    return (index.flatten() * size).unique()


def _starts_meet(a: Footprint, b: Footprint) -> bool:
    """The general case: each element's bytes ``[start, start + size)``, compared
    exactly (sorted starts, a binary search per element of ``b``)."""
    sa, sb = a.tensor.element_size(), b.tensor.element_size()
    starts_a = _starts(a) + (a.lo - b.lo)
    starts_b = _starts(b)
    # An element of a at x meets one of b at y iff y - sa < x < y + sb.
    first = torch.searchsorted(starts_a, starts_b - sa + 1)
    last = torch.searchsorted(starts_a, starts_b + sb)
    return bool((last > first).any())
