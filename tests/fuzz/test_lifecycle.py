"""The lifecycle property (lifecycle.py): its cases replay from JSON, and it judges
state carried between steps, which a one-step property cannot see."""

from __future__ import annotations

import json
from pathlib import Path

import mutants
import pytest
import torch
from cotrain_harness import shard
from draft_cases import DraftCase
from hypothesis import HealthCheck, given, settings
from lifecycle import LifecycleCase, gathered_state, lifecycle_cases, run_lifecycle

from draft_loss.cotrain import full_initial_parameters


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


# A clean campaign's float32 program (dp=4, three steps of 3 tokens): its
# gradients move up to 1,000 times as far as its parameters, so the workers,
# a few float32 roundings from a float64 model chained over the run, ended
# 5e-4 of the momentum's scale away from it, 35 times as far as a float32
# replay. Each step from the workers' own state is within float32's rounding.
ILL_CONDITIONED = "test_lifecycle_matches_float64_model-0fd57c269d.json"


def _regression(name: str) -> LifecycleCase:
    path = Path(__file__).resolve().parents[2] / "fixtures" / "regressions" / name
    return LifecycleCase.from_json(json.loads(path.read_text())["case"])


def test_an_ill_conditioned_program_is_judged_step_by_step() -> None:
    case = _regression(ILL_CONDITIONED)
    run_lifecycle(case)
    with mutants.applied("dp_gradients_averaged"):
        with pytest.raises(AssertionError, match="step 0"):
            run_lifecycle(case)


def test_the_state_a_step_starts_from_is_gathered_whole_over_tp_shards() -> None:
    base = _base()
    config = base.config()
    workers: dict = {}
    run_lifecycle(LifecycleCase(base, (_step(), _step(data_seed=2))), workers=workers)
    master, momentum = gathered_state(base, workers)
    initial = full_initial_parameters(config)
    assert momentum is not None and set(master) == set(momentum) == set(initial)
    for rank, worker in workers.items():
        tp_rank = base.layout.coords(rank).tp
        for name, value in worker.master.items():
            assert torch.equal(shard(master[name], name, tp_rank, base.layout.tp), value.double())
            assert torch.equal(
                shard(momentum[name], name, tp_rank, base.layout.tp), worker.optimizer.buffers[name].double()
            )
