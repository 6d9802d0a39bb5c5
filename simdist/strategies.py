"""Hypothesis strategies for random layouts and token distributions.

Needs the ``hypothesis`` package (a test extra); simdist itself does not.
"""

from __future__ import annotations

from typing import Sequence

import torch
from hypothesis import strategies as st

from .layout import AXES, Layout


def layouts(
    *,
    max_world_size: int = 8,
    axes: Sequence[str] = ("tp", "dp", "pp"),
    max_degree: int = 4,
) -> st.SearchStrategy[Layout]:
    """Layouts whose degrees along ``axes`` multiply to at most ``max_world_size``
    (other axes stay 1); non-power-of-two degrees included."""
    for axis in axes:
        if axis not in AXES:
            raise ValueError(f"unknown axis {axis!r}; expected some of {AXES}")
    if max_world_size < 1 or max_degree < 1:
        raise ValueError(f"max_world_size and max_degree must be >= 1, got {max_world_size}, {max_degree}")

    @st.composite
    def build(draw: st.DrawFn) -> Layout:
        sizes: dict[str, int] = {}
        budget = max_world_size
        for axis in axes:
            top = min(max_degree, budget)
            size = draw(st.integers(1, top))
            sizes[axis] = size
            budget //= size
        return Layout(**sizes)

    return build()


def token_masks(
    batch: int, seq_len: int, *, allow_empty_rows: bool = True
) -> st.SearchStrategy[torch.Tensor]:
    """``[batch, seq_len]`` 0/1 masks with uneven counts: all-zero rows, rows
    whose only valid token is the first, and random ones."""
    if batch < 1 or seq_len < 1:
        raise ValueError(f"batch and seq_len must be >= 1, got {batch}, {seq_len}")
    row_kinds = ["random", "full", "first_only"] + (["empty"] if allow_empty_rows else [])

    @st.composite
    def build(draw: st.DrawFn) -> torch.Tensor:
        rows = []
        for _ in range(batch):
            kind = draw(st.sampled_from(row_kinds))
            if kind == "empty":
                rows.append([0] * seq_len)
            elif kind == "full":
                rows.append([1] * seq_len)
            elif kind == "first_only":
                rows.append([1] + [0] * (seq_len - 1))
            else:
                row = draw(st.lists(st.integers(0, 1), min_size=seq_len, max_size=seq_len))
                if not allow_empty_rows and not any(row):
                    row[draw(st.integers(0, seq_len - 1))] = 1
                rows.append(row)
        return torch.tensor(rows, dtype=torch.long)

    return build()
