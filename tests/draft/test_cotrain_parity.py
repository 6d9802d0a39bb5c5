"""Split == monolithic == float64 reference, on simdist layouts.

CI runs a representative subset (every axis, 3-way axes, every zero-count
scenario, both dtypes, clipping on and off); the full grid is marked slow.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from cotrain_harness import (
    SCENARIOS,
    check_parity,
    config_for,
    groups_of,
    local_batch,
    make_global_batch,
    run_modes,
)

import simdist
from draft_loss import grads as grads_module
from draft_loss.cotrain import CotrainBatch, CotrainWorker, ParallelGroups
from draft_loss.cotrain import commit as commit_module
from draft_loss.cotrain import sgd as sgd_module
from draft_loss.cotrain import worker as worker_module
from draft_loss.step_state import DraftStepState
from simdist import Layout

F32, BF16 = torch.float32, torch.bfloat16
CLIPPED = {"policy_max_grad_norm": 2.0, "draft_max_grad_norm": 0.5}

CI_CASES = [
    # layout, microbatches, scenario, dtype, config overrides
    (Layout(tp=2, dp=2, pp=2), 3, "uneven", F32, {}),
    (Layout(dp=4), 4, "uneven", F32, CLIPPED),
    (Layout(tp=2, pp=2), 2, "zero_weight", F32, {}),
    (Layout(dp=2, pp=2), 1, "empty", F32, {}),
    (Layout(tp=3, dp=3), 2, "uneven", F32, {}),
    (Layout(pp=3), 4, "uneven", F32, {"num_layers": 3}),
    (Layout(tp=2, dp=2, pp=2), 4, "uneven", BF16, CLIPPED),
    (Layout(dp=2), 3, "uneven", F32, {"token_chunk_size": 64}),  # the soft CE's cached path
]


@pytest.mark.parametrize(
    "layout, microbatches, scenario, dtype, overrides",
    CI_CASES,
    ids=[
        f"{l.tp}x{l.dp}x{l.pp}-m{m}-{s}-{str(d)[6:]}{'-clip' if o == CLIPPED else ''}"
        for l, m, s, d, o in CI_CASES
    ],
)
def test_split_equals_monolithic_equals_reference(layout, microbatches, scenario, dtype, overrides):
    check_parity(layout, config_for(dtype, **overrides), scenario, microbatches)


GRID = [
    (Layout(tp=tp, dp=dp, pp=pp), m, s, d)
    for tp, dp, pp, m, s, d in itertools.product(
        (1, 2), (1, 2, 4), (1, 2), (1, 2, 3, 4), SCENARIOS, (F32, BF16)
    )
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout, microbatches, scenario, dtype",
    GRID,
    ids=[f"tp{l.tp}-dp{l.dp}-pp{l.pp}-m{m}-{s}-{str(d)[6:]}" for l, m, s, d in GRID],
)
def test_parity_full_grid(layout, microbatches, scenario, dtype):
    check_parity(layout, config_for(dtype, **CLIPPED), scenario, microbatches, seed=microbatches)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [Layout(tp=3, pp=3), Layout(dp=3, pp=3)], ids=str)
def test_parity_three_way_axes(layout):
    for microbatches in (1, 3):
        check_parity(layout, config_for(F32, num_layers=3), "uneven", microbatches)


# ------------------------------------------------------------- zero counts


def test_no_valid_token_gives_zero_gradients_and_finite_metrics():
    results, _ = run_modes(Layout(tp=2, dp=2), config_for(), "empty", 2)
    for mode, per_rank in results.items():
        for result in per_rank:
            assert not result.skipped
            assert all(math.isfinite(v) for v in result.metrics.values()), (mode, result.metrics)
            assert result.metrics["policy_loss"] == 0.0 and result.metrics["draft_loss"] == 0.0
            assert result.grad_norms == {"policy": 0.0, "draft": 0.0}
            for name, grad in result.grads.items():
                assert torch.equal(grad, torch.zeros_like(grad)), (mode, name)


# --------------------------------------------------------------- bad input


def _bad_batch_body(ctx, bad_dp_rank):
    config = config_for()
    batch = local_batch(make_global_batch("uneven", ctx.layout.dp, config), ctx.coords.dp)
    if ctx.coords.dp == bad_dp_rank:
        tokens = batch.tokens.clone()
        tokens[0, 0] = config.vocab_size  # out of range on this replica only
        batch = CotrainBatch(tokens, batch.mask, batch.bin_ids)
    worker = CotrainWorker(config, groups_of(ctx))
    try:
        worker.train_step(batch, mode="split", num_microbatches=2)
    except ValueError as error:
        # Returning (not raising) keeps simdist from releasing peers early: a
        # rank that went on into the step would now wait forever, and simdist
        # would report a deadlock instead of returning.
        return error, worker.draft_state.phase.value
    return None, worker.draft_state.phase.value


def test_a_bad_batch_on_one_replica_fails_every_rank_together():
    layout = Layout(tp=2, dp=2, pp=2)
    results = simdist.run(_bad_batch_body, layout=layout, args=(1,), timeout=60.0)
    for rank, (error, phase) in enumerate(results):
        assert isinstance(error, ValueError), f"rank {rank} did not fail: {error!r}"
        assert phase == "idle"
        if layout.coords(rank).dp == 1:
            assert "batch.tokens must lie in [0, 24)" in str(error)
        else:
            assert "another rank's arguments were invalid" in str(error)


def _sub_world_body(ctx):
    # A layout of tp=2 inside a world of 4: ranks 2 and 3 run no worker, so
    # the world-wide commit agreement would wait for them forever.
    tp = torch.distributed.new_group([0, 1])  # every rank creates every group, as torch asks
    if ctx.rank >= 2:
        return None
    try:
        CotrainWorker(config_for(), ParallelGroups(tp=tp))
    except ValueError as exc:
        return str(exc)
    return "constructed"


def test_a_worker_on_part_of_the_world_is_refused_before_any_collective():
    results = simdist.run(_sub_world_body, world_size=4, timeout=60.0)
    for rank in (0, 1):
        assert "every rank of the job must run a worker" in results[rank]
        assert "= 2, but the world has 4 ranks" in results[rank]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"mode": "fused"}, ValueError, "mode must be 'monolithic' or 'split'"),
        ({"num_microbatches": 0}, ValueError, "num_microbatches must be a positive int"),
        ({"num_microbatches": 5}, ValueError, r"num_microbatches \(5\) exceeds this rank's 4 batch rows"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    config = config_for()
    worker = CotrainWorker(config, ParallelGroups())
    batch = local_batch(make_global_batch("uneven", 1, config), 0)
    with pytest.raises(error, match=match):
        worker.train_step(batch, **{"mode": "split", "num_microbatches": 2, **kwargs})
    assert worker.draft_state.phase.value == "idle"


# ------------------------------------------------------------ step order


def test_gradient_transformations_run_in_the_contracted_order(monkeypatch):
    calls: list[str] = []

    def spy(name, original):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(worker_module, "scale_gradients", spy("scale", worker_module.scale_gradients))
    monkeypatch.setattr(
        DraftStepState, "correct_main_grads", spy("correct", DraftStepState.correct_main_grads)
    )
    monkeypatch.setattr(grads_module, "group_grad_norms", spy("norms", grads_module.group_grad_norms))
    monkeypatch.setattr(commit_module, "clip_by_group_norms", spy("clip", commit_module.clip_by_group_norms))
    monkeypatch.setattr(sgd_module.MomentumSGD, "prepare", spy("optimizer", sgd_module.MomentumSGD.prepare))
    monkeypatch.setattr(sgd_module.MomentumSGD, "commit", spy("commit", sgd_module.MomentumSGD.commit))
    config = config_for(**CLIPPED)
    worker = CotrainWorker(config, ParallelGroups())
    worker.train_step(
        local_batch(make_global_batch("uneven", 1, config), 0), mode="split", num_microbatches=3
    )
    assert calls == ["scale", "correct", "norms", "clip", "optimizer", "commit"]


# ------------------------------------------------------ uneven TP shards


@pytest.mark.parametrize(
    "layout, overrides",
    [
        (Layout(tp=5), {"vocab_size": 23, "ffn_size": 12}),  # shards 5,5,5,4,4 and 3,3,2,2,2
        (Layout(tp=3, dp=2, pp=2), {"vocab_size": 7, "ffn_size": 8}),
        (Layout(tp=8), {"vocab_size": 8, "ffn_size": 9}),  # one vocabulary row a rank
    ],
    ids=str,
)
def test_vocabularies_and_ffn_widths_that_do_not_divide_by_tp_shard_unevenly(layout, overrides):
    # Real vocabularies (50257 over 4 ranks) do not divide; the first ranks take the remainder.
    check_parity(layout, config_for(**overrides), "uneven", 2)


def _too_small_vocab_body(ctx):
    try:
        CotrainWorker(config_for(vocab_size=3), groups_of(ctx))
    except ValueError as exc:
        return str(exc)
    return "constructed"


def test_a_vocabulary_smaller_than_tp_is_refused_on_every_rank():
    results = simdist.run(_too_small_vocab_body, layout=Layout(tp=4), timeout=60.0)
    assert all("vocab_size (3) must be at least the TP size (4)" in r for r in results), results
