"""What draft_loss promises about its communication, pinned with simdist.CommStats.

- The draft counts ride the policy's DP count all-reduce: a split step makes
  no DP collective the policy alone would not make, whatever the number of
  microbatches, and with one microbatch its TP and PP traffic is exactly the
  monolithic step's.
- TP validation of ``soft_cross_entropy`` costs one all-reduce per call whose
  size depends on the TP group's size only, never on the inputs.

cp stays 1 here: context parallelism in draft_loss is changing elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from cotrain_harness import config_for, groups_of, local_batch, make_global_batch

import simdist
from draft_loss import soft_cross_entropy
from draft_loss.cotrain import CotrainWorker
from simdist import CommCount, CommStats, Layout

LAYOUTS = [Layout(tp=2, dp=2, pp=2), Layout(dp=2, pp=2), Layout(tp=2, dp=2)]
IDS = [f"tp{lay.tp}-dp{lay.dp}-pp{lay.pp}" for lay in LAYOUTS]


def step_body(ctx: simdist.RankContext, config, global_batch, mode: str, microbatches: int) -> None:
    worker = CotrainWorker(config, groups_of(ctx))
    worker.train_step(local_batch(global_batch, ctx.coords.dp), mode=mode, num_microbatches=microbatches)


def step_stats(layout: Layout, mode: str, microbatches: int) -> CommStats:
    config = config_for()
    batch = make_global_batch("uneven", layout.dp, config)
    with CommStats() as stats:
        simdist.run(step_body, layout=layout, args=(config, batch, mode, microbatches), timeout=120.0)
    return stats


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_split_step_adds_no_dp_collective_for_the_draft(layout: Layout) -> None:
    mono = step_stats(layout, "monolithic", 1)
    splits = {k: step_stats(layout, "split", k) for k in (1, 3)}
    last_stage = [r for r in range(layout.world_size) if layout.coords(r).pp == layout.pp - 1]
    other_stages = [r for r in range(layout.world_size) if r not in last_stage]

    # Microbatches change nothing on DP: counts accumulate locally, one reduction per step.
    splits[3].assert_same_as(splits[1], group="dp")
    split_dp = splits[1].per_rank(group="dp")
    mono_dp = mono.per_rank(group="dp")
    # The stage holding the draft head makes exactly as many DP calls as a
    # stage without one: the draft's counts and numerators ride along.
    calls = {split_dp[r].calls for r in range(layout.world_size)}
    assert len(calls) == 1, split_dp
    # Against the monolithic step: the same DP calls where there is no draft
    # head; one fewer on the last stage, whose monolithic step all-reduces the
    # loss numerators on their own after backward.
    for r in other_stages:
        assert split_dp[r].calls == mono_dp[r].calls
    for r in last_stage:
        assert split_dp[r].calls == mono_dp[r].calls - 1
    # With one microbatch the TP and PP traffic is exactly the monolithic step's.
    splits[1].assert_same_as(mono, group="tp")
    splits[1].assert_same_as(mono, group="pp")


def validation_body(ctx: simdist.RankContext, shapes: list[tuple[int, int, int]]) -> None:
    g = torch.Generator().manual_seed(ctx.rank)
    for tokens, vocab, chunk in shapes:
        student = torch.randn(tokens, vocab, generator=g)
        teacher = torch.randn(tokens, vocab, generator=g)
        mask = torch.ones(tokens)
        bins = torch.zeros(tokens, dtype=torch.int64)
        soft_cross_entropy(
            student,
            teacher,
            mask,
            tp_group=ctx.groups.tp,
            token_chunk_size=chunk,
            bin_ids=bins,
            weights=torch.ones(2),
        )


def validation_cost(tp: int, shapes: list[tuple[int, int, int]]) -> dict[int, CommCount]:
    with CommStats() as stats:
        simdist.run(validation_body, layout=Layout(tp=tp), args=(shapes,), timeout=60.0)
    return stats.per_rank(group="tp", op="all_reduce", site="_validation.py")


def test_tp_validation_is_one_fixed_size_all_reduce_per_call() -> None:
    small = [(3, 5, 64)]
    many = [(3, 5, 64), (40, 17, 8), (1, 1, 1), (64, 33, 16)]
    for tp in (2, 4):
        one = validation_cost(tp, small)
        four = validation_cost(tp, many)
        assert set(one) == set(four) == set(range(tp))
        for r in range(tp):
            assert one[r].calls == 1 and four[r].calls == 4
            # Four calls of very different shapes cost four times one call.
            assert four[r].bytes == 4 * one[r].bytes
        if tp == 2:
            per_call_tp2 = one[0].bytes
        else:
            # One row per TP rank: the header grows with the group, not the data.
            assert one[0].bytes == 2 * per_call_tp2
