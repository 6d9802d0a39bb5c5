"""Context-parallel sharding and the one-token shift across shard boundaries.

The sharded results are compared element by element with the unsharded
sequence: positions are written out by hand for the layout, and the shifted
values are read directly from the padded full tensor at ``position + 1``.
"""

from __future__ import annotations

import pytest
import torch

import simdist
from draft_loss import align_for_draft, load_balanced_positions, padded_length, shard_sequence, shift_left
from simdist import Layout

# Megatron's load balancing written out: chunks r and 2cp-1-r on CP rank r.
HAND_WRITTEN = {
    (8, 2): [[0, 1, 6, 7], [2, 3, 4, 5]],
    (12, 3): [[0, 1, 10, 11], [2, 3, 8, 9], [4, 5, 6, 7]],
    (7, 2): [[0, 1, 6, 7], [2, 3, 4, 5]],  # padded to 8
    (5, 4): [[0, 7], [1, 6], [2, 5], [3, 4]],  # padded to 8, chunks of one
    (5, 1): [[0, 1, 2, 3, 4]],  # no CP: no cut, no padding
}


@pytest.mark.parametrize("seq_len, cp", list(HAND_WRITTEN), ids=str)
def test_load_balanced_positions_are_megatrons(seq_len, cp):
    for rank, expected in enumerate(HAND_WRITTEN[(seq_len, cp)]):
        assert load_balanced_positions(seq_len, rank, cp).tolist() == expected
    every = torch.cat([load_balanced_positions(seq_len, r, cp) for r in range(cp)]).sort().values
    assert every.tolist() == list(range(padded_length(seq_len, cp)))


def test_shard_sequence_pads_at_the_end_with_the_pad_value():
    values = torch.arange(1, 8).reshape(1, 7)  # 7 positions, cp=2: padded to 8
    assert shard_sequence(values, 0, 2, pad_value=-1).tolist() == [[1, 2, 7, -1]]
    assert shard_sequence(values, 1, 2).tolist() == [[3, 4, 5, 6]]


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: padded_length(0, 2), ValueError, "seq_len must be a positive int, got 0"),
        (lambda: load_balanced_positions(8, 2, 2), ValueError, r"cp_rank must be an int in \[0, 2\), got 2"),
        (
            lambda: shard_sequence(torch.zeros(4), 0, 2),
            ValueError,
            r"values must be a tensor \[batch, seq, ...\]",
        ),
        (
            lambda: shift_left(torch.zeros(2, 4, requires_grad=True)),
            ValueError,
            "requires grad, but no gradient",
        ),
        (
            lambda: shift_left(torch.zeros(2, 4), torch.zeros(3, 4)),
            ValueError,
            r"must share \[batch, seq_local\]",
        ),
        (lambda: shift_left(torch.zeros(4)), ValueError, r"values\[0\] must be \[batch, seq_local, ...\]"),
        (lambda: shift_left([1, 2]), TypeError, r"values\[0\] must be a torch.Tensor, got list"),
    ],
)
def test_bad_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ------------------------------------------------------------- the exchange


def _full_inputs(seq_len: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(3, seq_len, 5, generator=g).to(dtype)
    mask = torch.rand(3, seq_len, generator=g) < 0.6
    tokens = torch.randint(0, 1000, (3, seq_len), generator=g)
    return teacher, mask, tokens


def _expected_shift(full: torch.Tensor, positions: torch.Tensor, cp: int) -> torch.Tensor:
    """``padded[:, p + 1]`` for each local position p, zero past the end: read off, not shifted."""
    total = padded_length(full.shape[1], cp)
    padded = torch.zeros((full.shape[0], total, *full.shape[2:]), dtype=full.dtype)
    padded[:, : full.shape[1]] = full
    out = torch.zeros((full.shape[0], len(positions), *full.shape[2:]), dtype=full.dtype)
    for slot, p in enumerate(positions.tolist()):
        if p + 1 < total:
            out[:, slot] = padded[:, p + 1]
    return out


def _align_body(ctx, seq_len, dtype, seed):
    cp, cp_rank = ctx.layout.cp, ctx.coords.cp
    teacher, mask, tokens = _full_inputs(seq_len, dtype, seed)
    local = [shard_sequence(t, cp_rank, cp) for t in (teacher, mask, tokens)]
    aligned_teacher, aligned_mask = align_for_draft(local[0], local[1], cp_group=ctx.groups.cp)
    (next_tokens,) = shift_left(local[2], cp_group=ctx.groups.cp)
    return aligned_teacher, aligned_mask, next_tokens


ALIGN_CASES = [
    (Layout(cp=2), 8, torch.float32),
    (Layout(cp=2, tp=2), 7, torch.bfloat16),
    (Layout(cp=3, dp=2), 12, torch.float32),
    (Layout(cp=3), 10, torch.float16),
    (Layout(cp=4), 8, torch.float32),  # chunks of one position: every slot is a boundary
    (Layout(cp=4), 19, torch.bfloat16),
]


@pytest.mark.parametrize("layout, seq_len, dtype", ALIGN_CASES, ids=lambda x: str(x).replace("Layout", ""))
def test_sharded_alignment_equals_the_unsharded_one_sliced(layout, seq_len, dtype):
    results = simdist.run(_align_body, layout=layout, args=(seq_len, dtype, seq_len), timeout=60.0)
    teacher, mask, tokens = _full_inputs(seq_len, dtype, seq_len)
    total = padded_length(seq_len, layout.cp)
    padded = [
        torch.cat([t, torch.zeros((3, total - seq_len, *t.shape[2:]), dtype=t.dtype)], 1)
        for t in (teacher, mask)
    ]
    unsharded_teacher, unsharded_mask = align_for_draft(*padded)
    for rank, (got_teacher, got_mask, got_tokens) in enumerate(results):
        positions = load_balanced_positions(seq_len, layout.coords(rank).cp, layout.cp)
        assert torch.equal(got_teacher, _expected_shift(teacher, positions, layout.cp)), (
            f"rank {rank} teacher"
        )
        assert torch.equal(got_mask, _expected_shift(mask, positions, layout.cp)), f"rank {rank} mask"
        assert torch.equal(got_tokens, _expected_shift(tokens, positions, layout.cp)), f"rank {rank} tokens"
        assert torch.equal(got_teacher, unsharded_teacher[:, positions]), (
            f"rank {rank} vs unsharded align_for_draft"
        )
        assert torch.equal(got_mask, unsharded_mask[:, positions])
        assert got_teacher.dtype == dtype and got_mask.dtype == torch.bool and got_tokens.dtype == torch.int64


def test_the_boundary_slots_are_the_ones_a_local_shift_gets_wrong():
    """The check above can fail: a rank-local shift differs from it exactly at the chunk ends."""
    layout, seq_len = Layout(cp=3), 12
    _, _, tokens = _full_inputs(seq_len, torch.float32, 0)
    for cp_rank in range(layout.cp):
        positions = load_balanced_positions(seq_len, cp_rank, layout.cp)
        local = shard_sequence(tokens, cp_rank, layout.cp)
        (local_only,) = shift_left(local, cp_group=None)
        wrong = (
            (local_only != _expected_shift(tokens, positions, layout.cp))
            .any(0)
            .nonzero()
            .reshape(-1)
            .tolist()
        )
        # Chunk A's end, except on the last rank (its chunks are adjacent), and
        # chunk B's end, except on rank 0 (the sequence's end, where 0 is right).
        expected_wrong = ([1] if cp_rank < layout.cp - 1 else []) + ([3] if cp_rank > 0 else [])
        assert wrong == expected_wrong, (cp_rank, wrong)


def _odd_body(ctx):
    try:
        shift_left(torch.zeros(2, 5), cp_group=ctx.groups.cp)
    except ValueError as error:
        return str(error)
    return None


def test_an_odd_local_length_fails_on_every_cp_rank_before_any_message():
    messages = simdist.run(_odd_body, layout=Layout(cp=2), timeout=30.0)
    assert all(m is not None and "seq_local must be even, got 5" in m for m in messages), messages
