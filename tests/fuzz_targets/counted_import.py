"""A target that writes one line to ``$IMPORT_LOG`` each time it is imported, and
multiplies a large matrix in every case (an intra-op parallel region when the
worker has more than one thread); a second, cheap property gives every worker at
least two rounds however short the budget (each property gets one)."""

import os

import torch
from hypothesis import given
from hypothesis import strategies as st

if os.environ.get("IMPORT_LOG"):
    with open(os.environ["IMPORT_LOG"], "a", encoding="utf-8") as log:
        log.write(f"{os.getpid()}\n")


@given(st.integers(0, 1000))
def test_a_large_matmul_is_finite(seed):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(1000, 1000, generator=generator)
    assert torch.isfinite(a @ a).all()


@given(st.lists(st.integers(-5, 5), max_size=8))
def test_a_sum_is_within_its_bounds(xs):
    assert -5 * len(xs) <= sum(xs) <= 5 * len(xs)
