"""simdist.tolerance: bounds from the summed terms' magnitudes and from a shadow run,
checked against float64 (never against values the code under test computed)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from draft_loss.cotrain.model import embedding_lookup
from simdist.tolerance import ToleranceError, check_close, magnitude_bound, unit_roundoff


def _cancellation_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """p_s - p_t for one token whose two probabilities are nearly equal."""
    s = torch.tensor([0.3, 0.1, -0.2], dtype=torch.float64)
    z = s + torch.tensor([1e-4, 0.0, 0.0], dtype=torch.float64)
    exact = torch.softmax(s, -1) - torch.softmax(z, -1)
    in32 = torch.softmax(s.float(), -1) - torch.softmax(z.float(), -1)
    magnitudes = torch.softmax(s, -1) + torch.softmax(z, -1)
    return exact, in32, magnitudes, s


def test_plain_rtol_fails_on_correct_float32_where_the_magnitude_bound_holds() -> None:
    exact, in32, magnitudes, _ = _cancellation_case()
    # Correct float32 maths, yet its error is far past 1e-4 of the cancelled result.
    assert not torch.allclose(in32.double(), exact, rtol=1e-4, atol=0)
    score = check_close(in32, exact, dtype=torch.float32, magnitudes=magnitudes, terms=8)
    assert 0.0 <= score <= 1.0


def test_a_real_error_is_caught_and_named() -> None:
    exact, in32, magnitudes, _ = _cancellation_case()
    wrong = in32.clone()
    wrong[0] += 1e-3  # far more than float32 rounding of terms of size ~0.7
    with pytest.raises(ToleranceError, match=r"gradient: error .*x its bound at flat index 0"):
        check_close(wrong, exact, dtype=torch.float32, magnitudes=magnitudes, terms=8, what="gradient")


def test_a_shadow_widens_the_bound_to_what_the_dtype_costs_on_one_process() -> None:
    exact = torch.tensor([1.0], dtype=torch.float64)
    shadow = torch.tensor([1.01], dtype=torch.float64)  # one process in the working dtype: off by 1e-2
    assert check_close(torch.tensor([1.015]), exact, dtype=torch.float32, shadow=shadow) <= 1.0
    with pytest.raises(ToleranceError):
        check_close(torch.tensor([1.03]), exact, dtype=torch.float32, shadow=shadow)  # past 2x the shadow


def test_non_finite_values_must_match_the_reference() -> None:
    exact = torch.tensor([float("-inf"), 1.0], dtype=torch.float64)
    assert check_close(torch.tensor([float("-inf"), 1.0]), exact, dtype=torch.float32, shadow=exact) == 0.0
    with pytest.raises(ToleranceError, match="non-finite"):
        check_close(torch.tensor([float("nan"), 1.0]), exact, dtype=torch.float32, shadow=exact)


def test_bad_arguments_say_what_was_expected() -> None:
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="give magnitudes="):
        check_close(x, x, dtype=torch.float32)
    with pytest.raises(ValueError, match="terms must be an int >= 1, got 0"):
        magnitude_bound(x, dtype=torch.float32, terms=0)
    with pytest.raises(ValueError, match=r"shape \(2,\) against reference \(3,\)"):
        check_close(x, torch.zeros(3), dtype=torch.float32, shadow=x)
    with pytest.raises(ValueError, match=r"floating torch\.dtype"):
        unit_roundoff(torch.int64)
    assert unit_roundoff(torch.float32) == 2.0**-24 and unit_roundoff(torch.bfloat16) == 2.0**-8


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=200))
def test_the_magnitude_bound_holds_for_float32_sums(values: list[float]) -> None:
    exact = torch.tensor(values, dtype=torch.float64).sum().reshape(1)
    summed = torch.tensor(values, dtype=torch.float32).sum().reshape(1)
    # The float32 inputs are rounded too: one more term's worth of error.
    magnitudes = torch.tensor(values, dtype=torch.float64).abs().sum().reshape(1)
    check_close(summed, exact, dtype=torch.float32, magnitudes=magnitudes, terms=len(values) + 1, factor=1.0)


def test_a_bfloat16_embedding_gradient_is_summed_in_float32() -> None:
    """The root of fixtures/regressions/test_split_equals_monolithic-02d186c25f.json: the
    gather's backward summed hundreds of token gradients in bfloat16 (13% lost; fails
    with a plain weight[ids])."""
    torch.manual_seed(0)
    weight = torch.randn(2, 4, dtype=torch.bfloat16, requires_grad=True)
    ids = torch.randint(0, 2, (768,))
    upstream = torch.randn(768, 4).to(torch.bfloat16)
    out = embedding_lookup(weight, ids)
    assert torch.equal(out, weight.detach()[ids])  # the forward is unchanged, bitwise
    out.backward(upstream)
    assert weight.grad is not None
    exact = torch.zeros(2, 4, dtype=torch.float64).index_add_(0, ids, upstream.double())
    # One bfloat16 rounding of the float32 sum: 2**-8 relative, plus float32's own.
    check_close(weight.grad, exact, dtype=torch.bfloat16, magnitudes=exact.abs(), terms=1)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 512))
def test_a_float32_sum_rounded_once_to_bfloat16_is_within_its_stored_in_bound(seed: int, n: int) -> None:
    """Computed in float32, stored in bfloat16 (mixed precision's commonest pattern):
    every such result passes, judged against float64 maths of the same terms."""
    gen = torch.Generator().manual_seed(seed)
    terms = torch.randn(64, n, dtype=torch.float64, generator=gen) * 10 ** torch.randint(
        -3, 4, (64, 1), generator=gen
    )
    exact = terms.sum(-1)
    stored = terms.float().sum(-1).to(torch.bfloat16)
    magnitudes = terms.abs().sum(-1)
    score = check_close(
        stored, exact, dtype=torch.float32, magnitudes=magnitudes, terms=n, stored_in=torch.bfloat16
    )
    assert 0.0 <= score <= 1.0


def test_the_stored_in_bound_catches_a_second_rounding_and_alone_bounds_one() -> None:
    exact = torch.tensor([1.0 + 2**-8 + 2**-10, 3.0 + 3 * 2**-9], dtype=torch.float64)
    once = exact.to(torch.bfloat16)
    assert check_close(once, exact, dtype=torch.float64, stored_in=torch.bfloat16, factor=1.0) <= 1.0
    # Moved by 4 units of bfloat16 roundoff before the rounding: more than one rounding costs.
    off = (exact + 4 * 2**-8 * exact.abs()).to(torch.bfloat16)
    with pytest.raises(ToleranceError, match=r"stored in torch\.bfloat16"):
        check_close(off, exact, dtype=torch.float64, stored_in=torch.bfloat16, factor=1.0)
    with pytest.raises(ValueError, match=r"floating torch\.dtype"):
        check_close(once, exact, dtype=torch.float32, stored_in=torch.int8)
    with pytest.raises(ValueError, match="stored_in="):
        check_close(once, exact, dtype=torch.float32)
