"""Footprints: whether two views share a byte, exact at every size, against a
brute-force set of the bytes each view covers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist._sanitizer.footprint import footprint, overlaps


def _bytes(t: torch.Tensor) -> set[int]:
    size = t.element_size()
    base = t.data_ptr()
    out: set[int] = set()
    for index in torch.cartesian_prod(*(torch.arange(n) for n in t.shape)).reshape(-1, t.dim()).tolist():
        start = base + size * sum(i * s for i, s in zip(index, t.stride()))
        out.update(range(start, start + size))
    return out


@st.composite
def views(draw: st.DrawFn, storage: torch.Tensor) -> torch.Tensor:
    """A strided view into ``storage`` (any shape, strides and offset that fit)."""
    dims = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 4)) for _ in range(dims)]
    strides = [draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 8, 12, 16])) for _ in range(dims)]
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    offset = draw(st.integers(0, max(0, storage.numel() - span)))
    if span > storage.numel():
        shape, strides, offset = [1], [1], 0
    return storage.as_strided(shape, strides, offset)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.float64, torch.int16, torch.uint8]))
def test_overlaps_is_exact_on_strided_views(data: st.DataObject, dtype: torch.dtype) -> None:
    storage = torch.zeros(96, dtype=dtype)
    a, b = data.draw(views(storage)), data.draw(views(storage))
    # A second dtype over the same bytes: views of one buffer with two element sizes.
    if data.draw(st.booleans()) and dtype == torch.float32:
        b = data.draw(views(storage.view(torch.int16)))
    assert overlaps(footprint(a), footprint(b)) == bool(_bytes(a) & _bytes(b))


def test_a_view_that_repeats_elements_is_not_taken_for_a_dense_one() -> None:
    storage = torch.zeros(16)
    evens = storage.as_strided((3, 3), (2, 2))  # 9 elements over 9 addresses: only the even ones
    assert not overlaps(footprint(evens), footprint(storage[1:2]))
    assert overlaps(footprint(evens), footprint(storage[8:9]))


@pytest.mark.parametrize("rows", [1000, 3_000_000])
def test_two_columns_of_a_large_matrix_are_apart_at_any_size(rows: int) -> None:
    matrix = torch.zeros(rows, 2)
    first, second = footprint(matrix[:, 0]), footprint(matrix[:, 1])
    assert not overlaps(first, second)
    assert overlaps(first, footprint(matrix[rows // 2 :, 0]))
    assert overlaps(second, footprint(matrix[-1]))


def test_column_blocks_and_interleaved_rows_of_a_large_matrix() -> None:
    matrix = torch.zeros(1 << 20, 4)
    left, right = footprint(matrix[:, :2]), footprint(matrix[:, 2:])
    assert not overlaps(left, right)
    assert overlaps(left, footprint(matrix[::7, 1:3]))
    even, odd = footprint(matrix[::2]), footprint(matrix[1::2])
    assert not overlaps(even, odd)
    assert overlaps(even, footprint(matrix[4::6, 3]))
