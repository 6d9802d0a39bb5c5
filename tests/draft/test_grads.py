"""Parameter tags, main-grad scaling, per-group grad norms over TP/PP, clipping.

Norms under simdist are checked against numpy norms of the full (unsharded)
gradients, which the test builds before handing each rank its shard.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import simdist
from draft_loss.grads import (
    GradientOrderError,
    accumulate_main_grads,
    clip_by_group_norms,
    group_grad_norms,
    is_tensor_parallel,
    parameter_group,
    scale_gradients,
    tag_parameter,
    zero_main_grads,
)
from simdist import Layout


def tagged(values, group="policy", tensor_parallel=False, dtype=torch.float32) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.zeros(len(values), dtype=dtype))
    tag_parameter(p, group, tensor_parallel=tensor_parallel)
    zero_main_grads([p])
    p.main_grad.copy_(torch.tensor(values, dtype=torch.float32))
    return p


# ------------------------------------------------------------------- tagging


def test_tags_are_read_back():
    p = tag_parameter(torch.nn.Parameter(torch.zeros(2)), "draft", tensor_parallel=True)
    assert parameter_group(p) == "draft" and is_tensor_parallel(p) is True


@pytest.mark.parametrize(
    "group, tp, error, match",
    [
        ("teacher", False, ValueError, "group must be one of"),
        ("draft", 1, TypeError, "tensor_parallel must be a bool"),
    ],
)
def test_tag_parameter_rejects_bad_tags(group, tp, error, match):
    with pytest.raises(error, match=match):
        tag_parameter(torch.nn.Parameter(torch.zeros(2)), group, tensor_parallel=tp)


def test_untagged_parameter_is_an_error_not_a_default():
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="has no group tag"):
        parameter_group(p)
    with pytest.raises(ValueError, match="has no group tag"):
        is_tensor_parallel(p)


# ------------------------------------------------------------ main gradients


def test_accumulate_adds_bf16_grads_in_fp32_and_clears_grad():
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    tag_parameter(p, "policy", tensor_parallel=False)
    zero_main_grads([p])
    for values in ([1.0, 2.0, 1 / 3], [256.0, 0.5, 1 / 3]):
        p.grad = torch.tensor(values, dtype=torch.bfloat16)
        accumulate_main_grads([p])
        assert p.grad is None
    expected = np.array([1.0, 2.0, 1 / 3], dtype=np.float32).astype(np.float64) + np.array(
        [256.0, 0.5, 1 / 3], dtype=np.float32
    ).astype(np.float64)
    assert p.main_grad.dtype == torch.float32
    # bf16 rounds 1/3 to 0.333984375 before it is added.
    np.testing.assert_allclose(p.main_grad.numpy(), [257.0, 2.5, 2 * 0.333984375], rtol=1e-7)
    assert not np.allclose(p.main_grad.numpy(), expected, rtol=1e-6)


def test_scale_divides_by_the_count_and_records_it():
    p = tagged([2.0, -4.0, 6.0])
    scale_gradients([p], torch.tensor(4.0))
    np.testing.assert_allclose(p.main_grad.numpy(), [0.5, -1.0, 1.5])
    with pytest.raises(GradientOrderError, match="scaling twice"):
        scale_gradients([p], 4.0)
    with pytest.raises(GradientOrderError, match="already normalised"):
        accumulate_main_grads([p])


def test_scale_by_zero_count_gives_zero_but_keeps_non_finite_visible():
    finite = tagged([2.0, -4.0])
    broken = tagged([float("nan"), 1.0])
    scale_gradients([finite, broken], 0)
    assert torch.equal(finite.main_grad, torch.zeros(2))
    assert math.isnan(float(broken.main_grad[0]))


@pytest.mark.parametrize(
    "count, error, match",
    [
        (-1.0, ValueError, ">= 0"),
        (float("inf"), ValueError, "finite"),
        (torch.ones(2), ValueError, "scalar"),
        ("3", TypeError, "number"),
    ],
)
def test_scale_rejects_bad_counts(count, error, match):
    with pytest.raises(error, match=match):
        scale_gradients([tagged([1.0])], count)


def test_scale_without_main_grad_raises():
    p = tag_parameter(torch.nn.Parameter(torch.zeros(2)), "policy", tensor_parallel=False)
    with pytest.raises(GradientOrderError, match="no main_grad; call zero_main_grads"):
        scale_gradients([p], 1.0)


# ------------------------------------------------------------------ clipping


def test_clip_by_group_norms_matches_numpy():
    policy = tagged([3.0, 4.0], "policy")
    draft = tagged([0.3, 0.4], "draft")
    norms = {
        "policy": torch.tensor(5.0, dtype=torch.float64),
        "draft": torch.tensor(0.5, dtype=torch.float64),
    }
    coefficients = clip_by_group_norms([policy, draft], norms, {"policy": 1.0, "draft": 1.0}, eps=0.0)
    assert coefficients == {"policy": pytest.approx(0.2), "draft": 1.0}
    np.testing.assert_allclose(policy.main_grad.numpy(), [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(draft.main_grad.numpy(), [0.3, 0.4], rtol=1e-7)


def test_clip_leaves_non_finite_groups_untouched():
    policy = tagged([float("inf"), 1.0], "policy")
    coefficients = clip_by_group_norms(
        [policy], {"policy": torch.tensor(float("inf")), "draft": torch.tensor(0.0)}, {"policy": 1.0}
    )
    assert coefficients["policy"] == 1.0
    assert float(policy.main_grad[1]) == 1.0


@pytest.mark.parametrize(
    "max_norms, match", [({"policy": 0.0}, "must be > 0"), ({"teacher": 1.0}, "unknown group")]
)
def test_clip_rejects_bad_max_norms(max_norms, match):
    with pytest.raises(ValueError, match=match):
        clip_by_group_norms(
            [tagged([1.0])], {"policy": torch.tensor(1.0), "draft": torch.tensor(0.0)}, max_norms
        )


# ---------------------------------------------------------------- grad norms


def test_group_norms_without_parallelism_match_numpy():
    a = tagged([3.0, 4.0], "policy", tensor_parallel=True)
    b = tagged([12.0], "policy")
    c = tagged([1.0, 2.0, 2.0], "draft")
    norms = group_grad_norms([a, b, c], tp_group=None, pp_group=None)
    assert float(norms["policy"]) == pytest.approx(13.0, rel=1e-15)
    assert float(norms["draft"]) == pytest.approx(3.0, rel=1e-15)


# Full gradients of a two-stage model: stage 0 has only policy parameters,
# stage 1 has policy and draft ones. "sharded" ones are split over TP ranks.
FULL = {
    0: [("policy", True, np.arange(1.0, 9.0)), ("policy", False, np.array([0.5, -1.5, 2.0]))],
    1: [
        ("policy", True, np.linspace(-3.0, 3.0, 8)),
        ("draft", True, np.array([1.0, -2.0, 3.0, -4.0, 5.0, -6.0, 7.0, -8.0])),
        ("draft", False, np.array([0.25, 0.75])),
    ],
}


def _expected_norms(stages) -> dict[str, float]:
    squares = {"policy": 0.0, "draft": 0.0}
    for stage in stages:
        for group, _, full in FULL[stage]:
            squares[group] += float(
                np.sum(full.astype(np.float32).astype(np.float64) ** 2)
            )  # main grads are fp32
    return {g: math.sqrt(s) for g, s in squares.items()}


def _norms_body(ctx, poison_stage: int | None):
    tp_rank, tp_size = ctx.coords.tp, ctx.layout.tp
    stage = ctx.coords.pp if ctx.layout.pp > 1 else None
    stages = [stage] if stage is not None else [0, 1]
    params = []
    for s in stages:
        for group, sharded, full in FULL[s]:
            local = np.array_split(full, tp_size)[tp_rank] if sharded else full
            p = tagged(local.tolist(), group, tensor_parallel=sharded)
            if poison_stage is not None and s == poison_stage:
                p.main_grad[0] = float("nan")
            params.append(p)
    norms = group_grad_norms(
        params,
        tp_group=ctx.groups.tp if ctx.layout.tp > 1 else None,
        pp_group=ctx.groups.pp if ctx.layout.pp > 1 else None,
    )
    return {k: float(v) for k, v in norms.items()}


@pytest.mark.parametrize(
    "layout",
    [Layout(tp=2, pp=2), Layout(tp=3, pp=2, dp=2), Layout(tp=1, pp=2), Layout(tp=4)],
    ids=str,
)
def test_group_norms_over_tp_and_pp_match_the_full_gradients(layout):
    results = simdist.run(_norms_body, layout=layout, args=(None,))
    expected = _expected_norms([0, 1])
    for norms in results:
        assert norms == results[0], "every rank must report the same norms, bit for bit"
    for group in ("policy", "draft"):
        assert results[0][group] == pytest.approx(expected[group], rel=1e-12)


def test_non_finite_norms_are_reported_on_every_rank():
    results = simdist.run(_norms_body, layout=Layout(tp=2, pp=2), args=(0,))
    for norms in results:
        assert math.isnan(norms["policy"])
        # The draft group's gradients are finite: its norm is unaffected.
        assert norms["draft"] == pytest.approx(_expected_norms([0, 1])["draft"], rel=1e-12)
