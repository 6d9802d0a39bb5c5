"""DraftStepState: every lifecycle rule, zero-count guard and abort path.

Expected values come from float64 numpy sums of the inputs, never from the
state itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from draft_loss.grads import GradientOrderError, scale_gradients, tag_parameter, zero_main_grads
from draft_loss.stats import DraftLossStats
from draft_loss.step_state import DraftStepState, StepOrderError, StepPhase

WEIGHTS = [1.0, 0.5, 2.0]


def make_stats(numerators, counts, weights=WEIGHTS) -> DraftLossStats:
    return DraftLossStats(
        torch.tensor(numerators, dtype=torch.float32),
        torch.tensor(counts, dtype=torch.float32),
        torch.tensor(weights, dtype=torch.float32),
    )


def make_params(*groups: str) -> list[torch.nn.Parameter]:
    params = []
    for i, group in enumerate(groups):
        p = torch.nn.Parameter(torch.zeros(3))
        tag_parameter(p, group, tensor_parallel=bool(i % 2))
        params.append(p)
    zero_main_grads(params)
    return params


def fill_grads(params, values) -> None:
    for p, v in zip(params, values):
        p.main_grad.copy_(torch.tensor(v, dtype=torch.float32))


def reduced_state(counts=(2.0, 1.0, 0.0), numerators=(3.0, 1.5, 0.0)) -> DraftStepState:
    """A state in phase REDUCED whose global payload is exactly ``counts``/``numerators``."""
    state = DraftStepState()
    state.begin_step()
    state.accumulate(make_stats([0.0] * 3, [0.0] * 3))
    state.record_global_counts(torch.tensor([*counts, *numerators], dtype=torch.float64))
    return state


# ------------------------------------------------------------------ happy path


def test_full_step_sums_microbatches_and_normalises_by_global_counts():
    state = DraftStepState()
    assert state.phase is StepPhase.IDLE and not state.active
    state.begin_step()
    mb = [([1.0, 2.0, 0.5], [2.0, 3.0, 1.0]), ([0.25, 0.0, 4.0], [1.0, 0.0, 2.0])]
    for num, cnt in mb:
        state.accumulate(make_stats(num, cnt))
    assert state.num_microbatches == 2 and state.num_bins == 3
    local = state.contribute_counts()
    expected_counts = np.sum([m[1] for m in mb], axis=0, dtype=np.float64)
    expected_nums = np.sum([m[0] for m in mb], axis=0, dtype=np.float64)
    assert local.dtype == torch.float64
    np.testing.assert_array_equal(local.numpy(), np.concatenate([expected_counts, expected_nums]))

    # Pretend a second DP rank contributed other sums: the state must use the reduced ones.
    other = np.array([4.0, 0.0, 1.0, 2.0, 0.0, 3.0])
    state.record_global_counts(local + torch.from_numpy(other))
    g_counts = expected_counts + other[:3]
    g_nums = expected_nums + other[3:]
    w = np.array(WEIGHTS)
    metrics = state.metrics()
    assert metrics.weighted_count == pytest.approx(float(w @ g_counts), rel=1e-15)
    assert metrics.loss == pytest.approx(float(w @ g_nums) / float(w @ g_counts), rel=1e-12)
    assert metrics.token_count == pytest.approx(g_counts.sum())
    np.testing.assert_array_equal(metrics.counts.numpy(), g_counts)

    policy, draft = make_params("policy", "draft")
    fill_grads([policy, draft], [[1.0, -2.0, 3.0], [6.0, -3.0, 0.5]])
    policy_count = 7.0
    scale_gradients([policy, draft], policy_count)
    factor = state.correct_main_grads([policy, draft])
    assert state.phase is StepPhase.CORRECTED
    d = float(w @ g_counts)
    assert factor == pytest.approx(policy_count / d, rel=1e-15)
    np.testing.assert_allclose(draft.main_grad.numpy(), np.array([6.0, -3.0, 0.5]) / d, rtol=1e-6)
    np.testing.assert_allclose(policy.main_grad.numpy(), np.array([1.0, -2.0, 3.0]) / policy_count, rtol=1e-6)
    state.finish()
    assert state.phase is StepPhase.IDLE and state.num_microbatches == 0 and state.num_bins is None


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.floats(0, 50, width=32), min_size=2, max_size=2),
            st.lists(st.integers(0, 9), min_size=2, max_size=2),
        ),
        min_size=1,
        max_size=5,
    ),
    st.lists(st.floats(0, 4, width=32), min_size=2, max_size=2),
)
def test_payload_and_metrics_match_float64_sums(microbatches, weights):
    state = DraftStepState()
    state.begin_step()
    for num, cnt in microbatches:
        state.accumulate(make_stats(num, [float(c) for c in cnt], weights))
    payload = state.contribute_counts()
    counts = np.sum([np.float64(np.float32(c)) for _, c in microbatches], axis=0)
    nums = np.sum([np.array(n, dtype=np.float32).astype(np.float64) for n, _ in microbatches], axis=0)
    np.testing.assert_allclose(payload.numpy(), np.concatenate([counts, nums]), rtol=1e-12)
    state.record_global_counts(payload)
    w = np.array(weights, dtype=np.float32).astype(np.float64)
    denominator = float(w @ counts)
    expected = float(w @ nums) / denominator if denominator > 0 else 0.0
    loss = state.metrics().loss
    assert math.isfinite(loss)
    assert loss == pytest.approx(expected, rel=1e-12, abs=1e-300)


# ----------------------------------------------------------- order violations


def test_begin_twice_raises():
    state = DraftStepState()
    state.begin_step()
    with pytest.raises(StepOrderError, match="already in progress"):
        state.begin_step()


@pytest.mark.parametrize("phase", ["idle", "reduced", "corrected", "finished"])
def test_accumulate_outside_accumulating_raises(phase):
    state = DraftStepState()
    if phase != "idle":
        state = reduced_state()
    if phase in ("corrected", "finished"):
        params = make_params("draft")
        scale_gradients(params, 1.0)
        state.correct_main_grads(params)
    if phase == "finished":
        state.finish()
    with pytest.raises(StepOrderError, match="begin_step" if phase in ("idle", "finished") else "phase"):
        state.accumulate(make_stats([1.0] * 3, [1.0] * 3))


def test_accumulate_rejects_stats_with_autograd_history():
    state = DraftStepState()
    state.begin_step()
    logits = torch.ones(3, requires_grad=True)
    stats = DraftLossStats(logits * 2, torch.ones(3), torch.ones(3))
    with pytest.raises(ValueError, match=r"numerators still carries autograd history; pass stats.detach\(\)"):
        state.accumulate(stats)
    state.accumulate(stats.detach())  # the detached payload is accepted
    assert state.num_microbatches == 1


def test_accumulate_rejects_bin_count_drift():
    state = DraftStepState()
    state.begin_step()
    state.accumulate(make_stats([1.0] * 3, [1.0] * 3))
    with pytest.raises(ValueError, match="3 bins, microbatch 1 has 2"):
        state.accumulate(make_stats([1.0] * 2, [1.0] * 2, [1.0, 1.0]))


def test_accumulate_rejects_weight_drift():
    state = DraftStepState()
    state.begin_step()
    state.accumulate(make_stats([1.0] * 3, [1.0] * 3))
    with pytest.raises(ValueError, match="bin weights changed within a step"):
        state.accumulate(make_stats([1.0] * 3, [1.0] * 3, [1.0, 0.5, 2.5]))


def test_accumulate_rejects_non_stats():
    state = DraftStepState()
    state.begin_step()
    with pytest.raises(TypeError, match="expected a DraftLossStats"):
        state.accumulate((torch.ones(3), torch.ones(3), torch.ones(3)))  # type: ignore[arg-type]


def test_inactive_state_contributes_an_empty_payload_and_corrects_nothing():
    state = DraftStepState()
    payload = state.contribute_counts()
    assert payload.shape == (0,)
    state.record_global_counts(payload)  # a no-op, the state stays inactive
    assert state.phase is StepPhase.IDLE
    params = make_params("policy", "draft")
    assert state.correct_main_grads(params) is None
    with pytest.raises(StepOrderError, match="inactive"):
        state.record_global_counts(torch.zeros(4, dtype=torch.float64))


def test_inactive_state_refuses_draft_gradients_it_cannot_correct():
    state = DraftStepState()
    params = make_params("policy", "draft")
    fill_grads(params, [[0.0] * 3, [1.0, 0.0, 0.0]])
    with pytest.raises(StepOrderError, match="no draft step was begun"):
        state.correct_main_grads(params)


def test_contribute_without_any_microbatch_raises():
    state = DraftStepState()
    state.begin_step()
    with pytest.raises(StepOrderError, match="no microbatch was accumulated"):
        state.contribute_counts()


@pytest.mark.parametrize("bad", [torch.zeros(5, dtype=torch.float64), torch.zeros(2, 3), [0.0] * 6])
def test_record_rejects_a_payload_of_the_wrong_layout(bad):
    state = DraftStepState()
    state.begin_step()
    state.accumulate(make_stats([1.0] * 3, [1.0] * 3))
    with pytest.raises(ValueError, match="1-D tensor of 6 values"):
        state.record_global_counts(bad)


def test_record_rejects_negative_global_counts():
    state = DraftStepState()
    state.begin_step()
    state.accumulate(make_stats([1.0] * 3, [1.0] * 3))
    with pytest.raises(ValueError, match="finite and non-negative"):
        state.record_global_counts(torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64))


def test_record_twice_raises():
    state = reduced_state()
    with pytest.raises(StepOrderError, match="already recorded"):
        state.record_global_counts(torch.zeros(6, dtype=torch.float64))


def test_metrics_before_global_counts_raises():
    state = DraftStepState()
    state.begin_step()
    state.accumulate(make_stats([1.0] * 3, [1.0] * 3))
    with pytest.raises(StepOrderError, match="record_global_counts first"):
        state.metrics()


def test_correct_before_global_counts_raises():
    state = DraftStepState()
    state.begin_step()
    state.accumulate(make_stats([1.0] * 3, [1.0] * 3))
    params = make_params("draft")
    scale_gradients(params, 2.0)
    with pytest.raises(StepOrderError, match="not recorded yet"):
        state.correct_main_grads(params)


def test_correct_before_scaling_raises():
    state = reduced_state()
    params = make_params("policy", "draft")
    with pytest.raises(GradientOrderError, match="call scale_gradients before correcting"):
        state.correct_main_grads(params)
    assert state.phase is StepPhase.REDUCED  # nothing was half-corrected


def test_correct_twice_raises():
    state = reduced_state()
    params = make_params("draft")
    scale_gradients(params, 2.0)
    state.correct_main_grads(params)
    with pytest.raises(StepOrderError, match="already corrected"):
        state.correct_main_grads(params)


def test_active_state_without_draft_parameters_raises():
    state = reduced_state()
    params = make_params("policy", "policy")
    scale_gradients(params, 2.0)
    with pytest.raises(ValueError, match="found no draft-tagged parameter among 2"):
        state.correct_main_grads(params)


def test_finish_twice_raises():
    state = reduced_state()
    params = make_params("draft")
    scale_gradients(params, 1.0)
    state.correct_main_grads(params)
    state.finish()
    with pytest.raises(StepOrderError, match="finish called twice"):
        state.finish()


def test_finish_before_correction_raises():
    state = reduced_state()
    with pytest.raises(StepOrderError, match="not corrected"):
        state.finish()


# ------------------------------------------------------------- zero counts


def test_zero_draft_count_gives_zero_scale_and_finite_metrics():
    state = reduced_state(counts=(0.0, 0.0, 0.0), numerators=(0.0, 0.0, 0.0))
    metrics = state.metrics()
    assert metrics.loss == 0.0 and metrics.weighted_count == 0.0
    params = make_params("policy", "draft")
    fill_grads(params, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    scale_gradients(params, 3.0)
    assert state.correct_main_grads(params) == 0.0
    assert torch.equal(params[1].main_grad, torch.zeros(3))
    np.testing.assert_allclose(params[0].main_grad.numpy(), [1 / 3, 2 / 3, 1.0], rtol=1e-6)


def test_zero_weighted_count_with_tokens_in_zero_weight_bins():
    # Tokens exist, but only in a bin of weight 0: the weighted count is 0.
    state = DraftStepState()
    state.begin_step()
    state.accumulate(make_stats([5.0, 0.0], [3.0, 0.0], [0.0, 1.0]))
    state.record_global_counts(state.contribute_counts())
    metrics = state.metrics()
    assert metrics.loss == 0.0 and metrics.token_count == 3.0


def test_zero_policy_count_zeroes_draft_gradients():
    state = reduced_state()
    params = make_params("policy", "draft")
    fill_grads(params, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    scale_gradients(params, 0.0)
    assert state.correct_main_grads(params) == 0.0
    for p in params:
        assert torch.equal(p.main_grad, torch.zeros(3))
        assert math.isfinite(float(p.main_grad.sum()))


# -------------------------------------------------------------------- abort


def _drive_to(state: DraftStepState, phase: str) -> None:
    if phase == "idle":
        return
    state.begin_step()
    if phase == "begun":
        return
    state.accumulate(make_stats([9.0, 9.0, 9.0], [5.0, 5.0, 5.0]))
    if phase == "accumulating":
        return
    state.record_global_counts(state.contribute_counts() * 3)
    if phase == "reduced":
        return
    params = make_params("draft")
    scale_gradients(params, 1.0)
    state.correct_main_grads(params)


@pytest.mark.parametrize("phase", ["idle", "begun", "accumulating", "reduced", "corrected"])
def test_abort_returns_to_fresh_from_any_phase(phase):
    state = DraftStepState()
    _drive_to(state, phase)
    state.abort()
    assert state.phase is StepPhase.IDLE and state.num_microbatches == 0 and state.num_bins is None
    assert state.contribute_counts().numel() == 0
    # A full step after the abort sees none of the aborted step's sums.
    state.begin_step()
    state.accumulate(make_stats([1.0, 2.0, 3.0], [1.0, 1.0, 2.0], [1.0, 1.0, 1.0]))
    payload = state.contribute_counts()
    np.testing.assert_array_equal(payload.numpy(), [1.0, 1.0, 2.0, 1.0, 2.0, 3.0])
    state.record_global_counts(payload)
    assert state.metrics().loss == pytest.approx(6.0 / 4.0)


def test_abort_is_idempotent():
    state = DraftStepState()
    state.abort()
    state.abort()
    assert state.phase is StepPhase.IDLE
