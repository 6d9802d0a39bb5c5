"""The lifecycle property (lifecycle.py): its cases replay from JSON, and it judges
state carried between steps, which a one-step property cannot see."""

from __future__ import annotations

import json

import mutants
import pytest
from draft_cases import DraftCase
from hypothesis import HealthCheck, given, settings
from lifecycle import LifecycleCase, lifecycle_cases, run_lifecycle


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(lifecycle_cases())
def test_lifecycle_cases_survive_json(case: LifecycleCase) -> None:
    assert LifecycleCase.from_json(json.loads(json.dumps(case.to_json()))) == case
    assert 2 <= len(case.steps) and case.base.dtype in ("float32", "float64")


def _base() -> DraftCase:
    # dp=2, tp=2: four rows a replica, so every split of 1..4 microbatches exists.
    rows = ((1.0, 1.0, 1.0, 0.0), (1.0, 0.5, 1.0, 1.0))
    return DraftCase(
        tp=2,
        dp=2,
        pp=1,
        microbatches=2,
        seq_len=4,
        masks=((rows, rows), (rows, (rows[1], rows[1]))),
        vocab_size=6,
        token_chunk_size=3,
        dtype="float32",
        bin_weights=(1.0, 0.5),
        single_bin=None,
        seed=3,
        reduction="rank",
        reduction_seed=0,
        clip=False,
    )


def _step(mode="split", microbatches=2, data_seed=1, fault=None, retry=True):
    return {
        "mode": mode,
        "microbatches": microbatches,
        "data_seed": data_seed,
        "fault": fault,
        "retry": retry,
    }


# Each lifecycle exposes its mutant only past its first step: a retry after a late
# abort, momentum carried into a second step.
CASES = {
    "reset_forgotten_after_second_microbatch": (
        _step(microbatches=4),
        _step(microbatches=4, data_seed=2, fault={"probe": "split:microbatch:2:forward", "rank": 1}),
    ),
    "optimizer_not_transactional": (
        _step(),
        _step(
            mode="monolithic",
            microbatches=1,
            data_seed=2,
            fault={"probe": "monolithic:optimizer:3", "rank": 0},
        ),
    ),
}


@pytest.mark.parametrize("mutant", sorted(CASES))
def test_a_lifecycle_catches_state_carried_across_steps(mutant: str) -> None:
    case = LifecycleCase(_base(), CASES[mutant])
    run_lifecycle(case)  # clean code matches the float64 model
    with mutants.applied(mutant):
        with pytest.raises(AssertionError):
            run_lifecycle(case)


def test_a_dropped_step_leaves_the_state_as_it_was() -> None:
    # No retry: the faulty step is dropped, the next starts from the same state.
    case = LifecycleCase(
        _base(),
        (
            _step(),
            _step(fault={"probe": "split:during_correction", "rank": 2}, retry=False),
            _step(data_seed=3),
        ),
    )
    run_lifecycle(case)
