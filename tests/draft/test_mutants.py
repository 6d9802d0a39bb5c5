"""Deliberately broken rules must make the parity / abort-retry checks fail.

Each mutant is a monkeypatch on the real implementation, applied only inside
its test, and judged by exactly the functions the parity and abort/retry
suites use (``check_parity``, ``faulty_then_retry`` + ``assert_bitwise_equal``).
Their unmutated runs pass in ``test_cotrain_parity`` / ``test_abort_retry``
on the same cases, so a failure here is the mutant's doing.
"""

from __future__ import annotations

import math

import cotrain_harness
import pytest
import torch.distributed as dist
from cotrain_faults import assert_bitwise_equal, clean_run, faulty_then_retry
from cotrain_harness import check_parity, config_for

import simdist
from draft_loss import context_parallel as context_parallel_module
from draft_loss import grads as grads_module
from draft_loss import step_state as step_state_module
from draft_loss.cotrain import CotrainWorker
from draft_loss.grads import GradientOrderError, parameter_group, scale_gradients
from draft_loss.step_state import DraftStepState, StepOrderError, StepPhase
from simdist import Layout

SENSITIVE = Layout(tp=2, dp=2, pp=2)  # every axis; uneven counts across DP ranks and microbatches
CLIPPED = {"policy_max_grad_norm": 2.0, "draft_max_grad_norm": 0.5}
# A draft-stage rank of DP replica 0: both its microbatches hold valid tokens
# (the "uneven" scenario leaves the last replica empty), so sums it failed to
# drop always change the retried step.
DRAFT_RANK = SENSITIVE.rank_of(tp=1, dp=0, pp=1)


def _parity() -> None:
    check_parity(SENSITIVE, config_for(), "uneven", 3)


def test_mutant_normalising_by_the_local_count_is_caught(monkeypatch):
    original = DraftStepState.record_global_counts

    def local_counts(self, reduced):
        # The bug: ignore the DP all-reduce and keep this rank's own counts.
        return original(self, self.contribute_counts() if self.active else reduced)

    monkeypatch.setattr(DraftStepState, "record_global_counts", local_counts)
    # Caught twice over: ranks of different DP replicas report different draft
    # metrics, and the draft gradients leave the monolithic ones.
    with pytest.raises(AssertionError, match="split: rank 2 metrics"):
        _parity()
    monkeypatch.setattr(cotrain_harness, "check_ranks_agree", lambda *args: None)
    # (The grad norms agree across the world by construction, so the draft
    # loss metric is where rank 2's local normalisation shows.)
    with pytest.raises(
        AssertionError, match=r"split vs monolithic: rank 2 (draft grad norm|metric draft_loss)"
    ):
        _parity()


def test_mutant_skipping_the_pp_norm_collective_without_draft_parameters_is_caught(monkeypatch):
    original = grads_module.group_grad_norms

    def skip_on_policy_only_stages(params, *, tp_group, pp_group, **rest):
        params = list(params)
        has_draft = any(parameter_group(p) == "draft" for p in params)
        # The bug: "this stage has nothing to add to the draft norm".
        return original(params, tp_group=tp_group, pp_group=pp_group if has_draft else None, **rest)

    monkeypatch.setattr(grads_module, "group_grad_norms", skip_on_policy_only_stages)
    # The draft stage waits in a PP collective the others never join: on NCCL a
    # hang, on simdist a collective mismatch or deadlock reported at once.
    with pytest.raises(simdist.SimulationError) as info:
        _parity()
    assert isinstance(
        info.value.__cause__, (simdist.CollectiveMismatchError, simdist.DeadlockError)
    ) or isinstance(info.value, (simdist.CollectiveMismatchError, simdist.DeadlockError)), repr(info.value)


def _correct_then_scale(self, params, policy_count, probe):
    self.draft_state.correct_main_grads(params)
    scale_gradients(params, policy_count)


def test_mutant_correcting_before_scaling_is_refused(monkeypatch):
    monkeypatch.setattr(CotrainWorker, "_normalise_gradients", _correct_then_scale)
    with pytest.raises(simdist.RankError) as info:
        _parity()
    assert isinstance(info.value.__cause__, GradientOrderError)
    assert "call scale_gradients before correcting" in str(info.value.__cause__)


def test_mutant_correcting_before_scaling_without_order_guards_is_caught(monkeypatch):
    monkeypatch.setattr(CotrainWorker, "_normalise_gradients", _correct_then_scale)
    real = grads_module.main_grad_denominator
    # Guards removed: the correction takes an unscaled grad as "normalised by
    # 1", and scaling no longer refuses an already normalised grad.
    monkeypatch.setattr(step_state_module, "main_grad_denominator", lambda p: real(p) or 1.0)
    monkeypatch.setattr(grads_module, "main_grad_denominator", lambda p: None)
    with pytest.raises(AssertionError, match="split vs monolithic: rank 0 draft grad norm"):
        _parity()


@pytest.fixture(scope="module")
def clean():
    return clean_run(**CLIPPED)


def _abort_then_retry(clean) -> None:
    """The abort/retry suite's check, at a point where the draft state holds sums."""
    _, _, _, states, _, retried = faulty_then_retry(
        SENSITIVE, DRAFT_RANK, "split:before_count_reduction", **CLIPPED
    )
    assert all(phase == StepPhase.IDLE.value and n == 0 for phase, n in states.values()), states
    assert_bitwise_equal(retried, clean)


def test_mutant_abort_that_does_nothing_is_caught(monkeypatch, clean):
    monkeypatch.setattr(DraftStepState, "abort", lambda self: None)
    # The stale step refuses a new one: the retry fails instead of running.
    with pytest.raises(simdist.RankError) as info:
        _abort_then_retry(clean)
    assert isinstance(info.value.__cause__, StepOrderError)
    assert "a step is already in progress" in str(info.value.__cause__)


def test_mutant_abort_that_keeps_the_sums_is_caught(monkeypatch, clean):
    def phase_only(self):
        # The bug: the phase is reset, the accumulated microbatch sums are not.
        self._phase = StepPhase.IDLE

    monkeypatch.setattr(DraftStepState, "abort", phase_only)
    with pytest.raises(AssertionError):
        _abort_then_retry(clean)


def test_mutant_abort_that_keeps_the_sums_is_caught_by_retry_values_alone(monkeypatch, clean):
    """Even without inspecting the state, the retried step's numbers expose the stale sums."""

    def phase_only(self):
        self._phase = StepPhase.IDLE

    monkeypatch.setattr(DraftStepState, "abort", phase_only)
    _, _, _, _, _, retried = faulty_then_retry(
        SENSITIVE, DRAFT_RANK, "split:before_count_reduction", **CLIPPED
    )
    with pytest.raises(AssertionError, match="rank"):
        assert_bitwise_equal(retried, clean)


# ------------------------------------------------------- context parallel

CP_SENSITIVE = Layout(cp=3, dp=2)  # a middle CP rank exchanges with both neighbours; dp_cp != dp


def _cp_parity(scenario: str = "boundary") -> None:
    check_parity(CP_SENSITIVE, config_for(**CLIPPED), scenario, 2, seq_len=12)


def _cp_monolithic_vs_reference(scenario: str = "boundary") -> None:
    """The monolithic step alone against the unsharded float64 reference."""
    config = config_for(**CLIPPED)
    results, global_batch = cotrain_harness.run_modes(
        CP_SENSITIVE, config, scenario, 2, ("monolithic",), seq_len=12
    )
    rtol, atol = cotrain_harness.TOLERANCES[config.dtype]["vs_reference"]
    reference = cotrain_harness.reference_of(config, global_batch)
    cotrain_harness.check_against(
        CP_SENSITIVE,
        results["monolithic"],
        lambda rank: reference,
        rtol=rtol,
        atol_fraction=atol,
        what="monolithic vs float64 reference",
        tp_sharded_expected=True,
    )


def test_cp_unmutated_cases_pass():
    """The mutants below fail for their mutation, not for the case."""
    _cp_parity("boundary")
    _cp_parity("uneven")
    _cp_monolithic_vs_reference()


def test_mutant_boundary_from_the_wrong_neighbour_is_caught(monkeypatch):
    original = context_parallel_module._neighbour_heads

    def swapped(heads_a, heads_b, group, rank, size):
        from_right, from_left = original(heads_a, heads_b, group, rank, size)
        return from_left, from_right  # the bug: rank - 1's row where rank + 1's belongs, and back

    monkeypatch.setattr(context_parallel_module, "_neighbour_heads", swapped)
    _assert_misaligned()


def _assert_misaligned() -> None:
    # The monolithic counts are taken where the tokens live (no exchange), the
    # split ones from the aligned mask: a wrong alignment first shows as a
    # split/monolithic disagreement, and each mode alone leaves the reference.
    with pytest.raises(AssertionError, match=r"split vs monolithic: rank 0 grad draft\."):
        _cp_parity()
    with pytest.raises(AssertionError, match="monolithic vs float64 reference"):
        _cp_monolithic_vs_reference()


def test_mutant_boundary_dropped_is_caught(monkeypatch):
    # The bug: each rank shifts its shard as if it were the whole sequence.
    monkeypatch.setattr(context_parallel_module, "_neighbour_heads", lambda *args: (None, None))
    _assert_misaligned()


def test_mutant_cp_factor_added_to_the_correction_is_caught(monkeypatch):
    original = CotrainWorker._normalise_gradients

    def nemo_factor(self, params, policy_count, probe):
        original(self, params, policy_count, probe)
        # The bug: NeMo RL's "draft correction x CP size", which compensates a
        # gradient AVERAGED over CP, applied to our gradient SUMMED over DP x CP.
        for p in params:
            if parameter_group(p) == "draft":
                p.main_grad.mul_(self.groups.size("cp"))

    monkeypatch.setattr(CotrainWorker, "_normalise_gradients", nemo_factor)
    with pytest.raises(AssertionError, match=r"split vs monolithic: rank 0 grad draft\."):
        _cp_parity("uneven")


def test_mutant_gradients_averaged_over_dp_cp_without_a_cp_factor_is_caught(monkeypatch):
    original = CotrainWorker._all_reduce_gradients

    def averaged(self, params):
        # The bug: Megatron's DDP average over DP x CP while the loss is already
        # divided by the global count, with no factor to undo it.
        original(self, params)
        for p in params:
            p.main_grad.div_(self.groups.size("dp") * self.groups.size("cp"))

    monkeypatch.setattr(CotrainWorker, "_all_reduce_gradients", averaged)
    with pytest.raises(AssertionError, match="monolithic vs float64 reference"):
        _cp_parity("uneven")


def test_mutant_counts_reduced_over_dp_instead_of_dp_cp_is_caught(monkeypatch):
    def dp_only(self, tensor):
        if self.groups.dp is not None:
            dist.all_reduce(tensor, group=self.groups.dp)  # the bug: the CP peers' tokens are not counted

    monkeypatch.setattr(CotrainWorker, "_all_reduce_counts", dp_only)
    # CP ranks of one replica see different counts: their metrics differ.
    with pytest.raises(AssertionError, match="monolithic: rank 1 metrics"):
        _cp_parity("uneven")
    # And the gradients are wrong: the split step's correction uses a count
    # that differs from the monolithic normalisation on every CP rank.
    monkeypatch.setattr(cotrain_harness, "check_ranks_agree", lambda *args: None)
    with pytest.raises(AssertionError, match="split vs monolithic: rank 0 grad"):
        _cp_parity("uneven")


def test_mutant_grad_norms_summed_over_cp_is_caught(monkeypatch):
    original = grads_module.group_grad_norms

    def counted_per_cp_rank(params, *, tp_group, pp_group, **rest):
        # The bug: every CP rank adds its (replicated) squares, as an all-reduce
        # of the squares over the CP group would.
        norms = original(params, tp_group=tp_group, pp_group=pp_group, **rest)
        return {name: value * math.sqrt(CP_SENSITIVE.cp) for name, value in norms.items()}

    monkeypatch.setattr(grads_module, "group_grad_norms", counted_per_cp_rank)
    with pytest.raises(AssertionError, match="monolithic vs float64 reference: rank 0 param"):
        _cp_parity("uneven")
