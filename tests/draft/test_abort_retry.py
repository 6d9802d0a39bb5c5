"""An exception at any point of a split step, then a retry of the same batch,
equals a clean run bit for bit and leaves no stale state behind."""

from __future__ import annotations

import math

import pytest
import torch
from cotrain_faults import (
    LAYOUT,
    MICROBATCHES,
    InjectedFault,
    assert_bitwise_equal,
    clean_run,
    fault_points,
    faulty_then_retry,
)
from cotrain_harness import config_for, local_batch, make_global_batch

from draft_loss.cotrain import CotrainWorker, ParallelGroups, StepAbortedError
from draft_loss.step_state import StepPhase
from simdist import Layout

# A rank of the last PP stage (draft head and step state) in DP replica 0,
# whose microbatches all hold valid tokens in the "uneven" scenario.
LAST_RANK = LAYOUT.rank_of(tp=1, dp=0, pp=1)
POINTS = fault_points(LAYOUT, MICROBATCHES)
CLIPPED = {"policy_max_grad_norm": 2.0, "draft_max_grad_norm": 0.5}


@pytest.fixture(scope="module")
def clean():
    return clean_run(**CLIPPED)


def _check_fault_then_retry(clean, fault_rank: int, point: str, layout: Layout = LAYOUT) -> None:
    failure, before, after, states, leftovers, retried = faulty_then_retry(
        layout, fault_rank, point, **CLIPPED
    )
    # The injected fault is the first failure, unless the faulty rank reached
    # the commit agreement and a peer learnt there that the step failed (then
    # simdist releases the rest, the faulty rank included).
    kinds = {type(e) for e in failure.failures.values()}
    assert kinds and kinds <= {InjectedFault, StepAbortedError}, failure.failures
    assert set(failure.failures) | set(failure.released) == set(range(layout.world_size))
    for rank in before:
        # The failed attempt changed nothing that a retry reads.
        assert states[rank] == (StepPhase.IDLE.value, 0), f"rank {rank}: draft state left at {states[rank]}"
        assert leftovers[rank] == [], f"rank {rank}: stale gradients on {leftovers[rank]}"
        for key, value in before[rank].items():
            assert torch.equal(after[rank][key], value), f"rank {rank}: {key} changed by the failed step"
        assert before[rank].keys() == after[rank].keys()
    assert_bitwise_equal(retried, clean)


@pytest.mark.parametrize("point", POINTS)
def test_fault_on_the_draft_stage_then_retry_equals_a_clean_run(clean, point):
    _check_fault_then_retry(clean, LAST_RANK, point)


@pytest.mark.parametrize(
    "point", ["split:microbatch:1:backward", "split:during_correction", "split:optimizer:0"]
)
def test_fault_on_the_first_stage_then_retry_equals_a_clean_run(clean, point):
    _check_fault_then_retry(clean, 0, point)


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("fault_rank", range(LAYOUT.world_size))
def test_fault_anywhere_then_retry_equals_a_clean_run(clean, fault_rank, point):
    _check_fault_then_retry(clean, fault_rank, point)


# ------------------------------------------------------- context parallel

CP_LAYOUT = Layout(cp=2, dp=2, pp=2)
# The draft stage's CP rank 1 of replica 0: it holds the middle chunks, so it
# both sends and receives boundary rows.
CP_LAST_RANK = CP_LAYOUT.rank_of(cp=1, dp=0, pp=1)


@pytest.fixture(scope="module")
def clean_cp():
    return clean_run(CP_LAYOUT, **CLIPPED)


@pytest.mark.parametrize(
    "point",
    [
        "split:microbatch:1:forward",
        "split:before_count_reduction",
        "split:during_correction",
        "split:optimizer:2",
    ],
)
def test_fault_on_a_cp_layout_then_retry_equals_a_clean_run(clean_cp, point):
    _check_fault_then_retry(clean_cp, CP_LAST_RANK, point, CP_LAYOUT)


@pytest.mark.slow
@pytest.mark.parametrize("point", fault_points(CP_LAYOUT, MICROBATCHES))
@pytest.mark.parametrize("fault_rank", range(CP_LAYOUT.world_size))
def test_fault_anywhere_on_a_cp_layout_then_retry_equals_a_clean_run(clean_cp, fault_rank, point):
    _check_fault_then_retry(clean_cp, fault_rank, point, CP_LAYOUT)


def test_non_finite_gradient_skips_the_step_and_a_retry_equals_a_clean_step():
    """Single rank: a NaN gradient aborts the step (reported, not hidden); the retry is clean."""
    config = config_for()
    batch = local_batch(make_global_batch("uneven", 1, config, seed=3), 0)
    clean_worker = CotrainWorker(config, ParallelGroups())
    expected = clean_worker.train_step(batch, mode="split", num_microbatches=3)

    worker = CotrainWorker(config, ParallelGroups())
    initial = {n: v.clone() for n, v in worker.master.items()}

    def poison(point: str) -> None:
        if point == "split:microbatch:1:accumulated":
            worker.params["draft.fc.bias"].main_grad[0] = float("nan")

    skipped = worker.train_step(batch, mode="split", num_microbatches=3, probe=poison)
    assert skipped.skipped
    assert math.isnan(skipped.grad_norms["draft"]) and math.isfinite(skipped.grad_norms["policy"])
    assert worker.draft_state.phase is StepPhase.IDLE
    for name, value in initial.items():
        assert torch.equal(worker.master[name], value), f"{name} changed by a skipped step"
    assert worker.optimizer.buffers == {}
    retried = worker.train_step(batch, mode="split", num_microbatches=3)
    assert_bitwise_equal([retried], [expected])


def test_in_process_exception_resets_the_worker():
    """Without any collective, an exception mid-step leaves a fresh state and intact parameters."""
    config = config_for()
    batch = local_batch(make_global_batch("uneven", 1, config, seed=4), 0)
    worker = CotrainWorker(config, ParallelGroups())
    initial = {n: v.clone() for n, v in worker.master.items()}

    def fail(point: str) -> None:
        if point == "split:after_count_reduction":
            assert worker.draft_state.num_microbatches == 2  # the state did hold a step
            raise InjectedFault(point)

    with pytest.raises(InjectedFault):
        worker.train_step(batch, mode="split", num_microbatches=2, probe=fail)
    assert worker.draft_state.phase is StepPhase.IDLE and worker.draft_state.num_microbatches == 0
    assert all(not hasattr(p, "main_grad") and p.grad is None for p in worker.params.values())
    assert all(torch.equal(worker.master[n], v) for n, v in initial.items())
    retried = worker.train_step(batch, mode="split", num_microbatches=2)
    expected = CotrainWorker(config, ParallelGroups()).train_step(batch, mode="split", num_microbatches=2)
    assert_bitwise_equal([retried], [expected])
