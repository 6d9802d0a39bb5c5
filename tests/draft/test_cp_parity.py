"""Context parallelism in the co-training step: split == monolithic == the float64
reference of the UNSHARDED sequence, on layouts with cp in {2, 3, 4}.

Each rank holds its load-balanced CP shard (chunks r and 2cp-1-r, padded when
the length does not divide by 2cp). CI runs a subset covering every axis next
to cp, boundary-only masks, lengths that do not divide, both dtypes and
clipping; the grid is marked slow.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from cotrain_harness import CP_SCENARIOS, check_parity, config_for, groups_of, local_batch, make_global_batch

import simdist
from draft_loss.cotrain import CotrainBatch, CotrainWorker, ParallelGroups
from simdist import Layout

F32, BF16 = torch.float32, torch.bfloat16
CLIPPED = {"policy_max_grad_norm": 2.0, "draft_max_grad_norm": 0.5}

CI_CASES = [
    # layout, microbatches, scenario, dtype, sequence length, config overrides
    (Layout(cp=2, dp=2), 2, "uneven", F32, 8, {}),
    (Layout(tp=2, cp=2, pp=2), 3, "boundary", F32, 8, CLIPPED),
    (Layout(cp=3, dp=2), 2, "uneven", F32, 7, {}),  # 7 -> padded to 12
    (Layout(cp=4), 4, "boundary", F32, 10, {}),  # 10 -> padded to 16
    (Layout(cp=3, pp=2), 1, "zero_weight", F32, 6, {}),
    (Layout(cp=2, dp=2), 2, "empty", F32, 6, {}),
    (Layout(tp=2, cp=2, dp=2), 2, "uneven", BF16, 9, CLIPPED),  # 9 -> padded to 12
    (Layout(cp=4, pp=2), 2, "boundary", BF16, 16, {"token_chunk_size": 64}),  # the soft CE's cached path
]


def _case_id(layout, m, scenario, dtype, seq_len, overrides):
    axes = "x".join(f"{a}{getattr(layout, a)}" for a in ("tp", "cp", "dp", "pp") if getattr(layout, a) > 1)
    return f"{axes}-m{m}-{scenario}-s{seq_len}-{str(dtype)[6:]}{'-clip' if overrides == CLIPPED else ''}"


@pytest.mark.parametrize(
    "layout, microbatches, scenario, dtype, seq_len, overrides",
    CI_CASES,
    ids=[_case_id(*c) for c in CI_CASES],
)
def test_split_equals_monolithic_equals_unsharded_reference(
    layout, microbatches, scenario, dtype, seq_len, overrides
):
    check_parity(layout, config_for(dtype, **overrides), scenario, microbatches, seq_len=seq_len)


# One microbatch on a length that divides by 2cp for cp in {2, 3}, three on one that never does.
GRID = [
    (Layout(tp=tp, cp=cp, dp=dp, pp=pp), m, s, d, 12 if m == 1 else 13)
    for tp, cp, dp, pp, m, s, d in itertools.product(
        (1, 2), (2, 3, 4), (1, 2), (1, 2), (1, 3), CP_SCENARIOS, (F32, BF16)
    )
    if tp * cp * dp * pp <= 16
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout, microbatches, scenario, dtype, seq_len", GRID, ids=[_case_id(*c, {}) for c in GRID]
)
def test_cp_parity_full_grid(layout, microbatches, scenario, dtype, seq_len):
    check_parity(
        layout, config_for(dtype, **CLIPPED), scenario, microbatches, seed=microbatches, seq_len=seq_len
    )


# --------------------------------------------------------------- bad input


def _bad_body(ctx, bad_rank, kind):
    config = config_for()
    seq_len = 10 if (kind == "longer" and ctx.rank == bad_rank) else 6
    global_batch = make_global_batch("uneven", ctx.layout.dp, config, seq_len=seq_len, cp=ctx.layout.cp)
    batch = local_batch(global_batch, ctx.coords.dp, ctx.coords.cp, ctx.layout.cp)
    microbatches, mode = 2, "split"
    if ctx.rank == bad_rank:
        if kind == "token":
            tokens = batch.tokens.clone()
            tokens[0, -1] = config.vocab_size
            batch = CotrainBatch(tokens, batch.mask, batch.bin_ids)
        elif kind == "microbatches":
            microbatches = 1
        elif kind == "mode":
            mode = "monolithic"
        elif kind == "mask dtype":
            batch = CotrainBatch(batch.tokens, batch.mask.bool(), batch.bin_ids)
    worker = CotrainWorker(config, groups_of(ctx))
    try:
        worker.train_step(batch, mode=mode, num_microbatches=microbatches)
    except ValueError as error:
        # Returned, not raised: a rank that went on into the step would wait
        # forever and simdist would report a deadlock instead.
        return str(error), worker.draft_state.phase.value
    return None, worker.draft_state.phase.value


LAYOUT = Layout(cp=3, dp=2)
BAD_RANK = LAYOUT.rank_of(cp=1, dp=0)


@pytest.mark.parametrize(
    "kind, own_message, cp_peer_message",
    [
        ("token", "batch.tokens must lie in [0, 24)", "another rank's arguments were invalid"),
        ("longer", "disagree on local sequence length from 2 to 4", None),
        ("microbatches", "disagree on num_microbatches from 1 to 2", None),
        ("mode", "disagree on mode from monolithic to split", None),
        # The rows travel as raw bytes: another dtype would be read back as garbage.
        ("mask dtype", "disagree on mask dtype from torch.bool to torch.float32", None),
    ],
)
def test_bad_input_on_one_cp_rank_fails_every_rank_together(kind, own_message, cp_peer_message):
    results = simdist.run(_bad_body, layout=LAYOUT, args=(BAD_RANK, kind), timeout=60.0)
    for rank, (message, phase) in enumerate(results):
        assert message is not None, f"rank {rank} did not fail"
        assert phase == "idle"
        coords = LAYOUT.coords(rank)
        if rank == BAD_RANK:
            assert own_message in message, message
        elif coords.dp == LAYOUT.coords(BAD_RANK).dp:
            # The bad rank's CP peers: the same words where they saw the same table.
            assert (cp_peer_message or own_message) in message, message
        else:
            assert "another rank's arguments were invalid" in message, message
    same_group = {results[r][0] for r in range(LAYOUT.world_size) if LAYOUT.coords(r).dp == 0}
    if cp_peer_message is None:
        assert len(same_group) == 1, "every CP rank of the group must raise the same error"


def _odd_body(ctx):
    worker = CotrainWorker(config_for(), groups_of(ctx))
    batch = local_batch(make_global_batch("uneven", 1, config_for(), seq_len=5), 0)  # unsharded, 5 positions
    try:
        worker.train_step(batch, mode="monolithic")
    except ValueError as error:
        return str(error)
    return None


def test_an_unsharded_odd_length_batch_is_refused_on_every_cp_rank():
    messages = simdist.run(_odd_body, layout=Layout(cp=2), timeout=60.0)
    for message in messages:
        assert message is not None and "its sequence length must be even, got 5" in message, message
        assert "shard_batch_for_cp" in message


def _missing_dp_cp_body(ctx):
    groups = ParallelGroups(cp=ctx.groups.cp, dp=ctx.groups.dp)
    with pytest.raises(
        ValueError, match=r"dp \(2 ranks\) and cp \(2 ranks\) are both present, so the dp_cp group"
    ):
        CotrainWorker(config_for(), groups)
    wrong = ParallelGroups(cp=ctx.groups.cp, dp=ctx.groups.dp, dp_cp=ctx.groups.cp)
    with pytest.raises(ValueError, match=r"dp_cp group must have dp x cp = 2 x 2 = 4 ranks, got 2"):
        CotrainWorker(config_for(), wrong)


def test_dp_and_cp_without_their_product_group_are_refused():
    simdist.run(_missing_dp_cp_body, layout=Layout(cp=2, dp=2), timeout=60.0)
