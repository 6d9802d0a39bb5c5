"""The pytest plugin's profiles and markers, and the hypothesis strategies."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.layout import Layout
from simdist.strategies import layouts, token_masks

pytest_plugins = ["pytester"]

_SUITE = """
import pytest

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.gpu
def test_gpu():
    pass

def test_plain(simdist_run):
    assert simdist_run(lambda ctx: ctx.rank, world_size=2) == [0, 1]
"""


def test_ci_profile_skips_slow(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(_SUITE)
    result = pytester.runpytest("--simdist-profile=ci")
    gpu_skipped = 0 if torch.cuda.is_available() else 1
    result.assert_outcomes(passed=2 - gpu_skipped, skipped=1 + gpu_skipped)


def test_nightly_profile_runs_slow(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(_SUITE)
    result = pytester.runpytest("--simdist-profile=nightly")
    gpu_skipped = 0 if torch.cuda.is_available() else 1
    result.assert_outcomes(passed=3 - gpu_skipped, skipped=gpu_skipped)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 16), st.integers(1, 5), st.data())
def test_layouts_respect_bounds(max_world: int, max_degree: int, data: st.DataObject) -> None:
    layout = data.draw(layouts(max_world_size=max_world, axes=("tp", "dp", "pp"), max_degree=max_degree))
    assert isinstance(layout, Layout)
    assert layout.world_size <= max_world
    assert max(layout.tp, layout.dp, layout.pp) <= max_degree
    assert layout.cp == 1


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.data())
def test_token_masks_shape_and_values(batch: int, seq: int, data: st.DataObject) -> None:
    mask = data.draw(token_masks(batch, seq))
    assert mask.shape == (batch, seq)
    assert set(mask.unique().tolist()) <= {0, 1}


def test_token_masks_without_empty_rows_never_draw_empty_rows() -> None:
    @settings(max_examples=40, deadline=None)
    @given(token_masks(3, 4, allow_empty_rows=False))
    def check(mask: torch.Tensor) -> None:
        assert bool((mask.sum(dim=1) > 0).all())

    check()


def test_strategies_reject_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown axis 'ep'"):
        layouts(axes=("tp", "ep"))
    with pytest.raises(ValueError, match="batch and seq_len"):
        token_masks(0, 3)
