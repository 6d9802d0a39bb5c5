"""The vocab-parallel losses under simdist: TP results equal the single-rank
full-vocabulary computation, and bad input on any TP rank fails on every rank.

The vocabulary is split evenly and unevenly (shards of different sizes, down
to a single entry). Inputs are float64, so every rank's numerators must match
the float64 reference to rounding, and the shards of the gradient, put back
together, must match the reference gradient.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from soft_ce_reference import reference_gradient, reference_stats

import simdist
from draft_loss import projected_soft_cross_entropy, soft_cross_entropy
from simdist import Layout

TIMEOUT_S = 30.0
TP_SIZES = [1, 2, 3, 4, 8]


def shard_sizes(vocab: int, tp: int, kind: str) -> list[int]:
    if kind == "even":
        assert vocab % tp == 0
        return [vocab // tp] * tp
    # Uneven: shard r gets r + 1 entries, the last one takes the rest.
    sizes = [r + 1 for r in range(tp - 1)]
    sizes.append(vocab - sum(sizes))
    assert sizes[-1] >= 1
    return sizes


def shard(values: torch.Tensor, sizes: list[int], rank: int) -> torch.Tensor:
    start = sum(sizes[:rank])
    return values[..., start : start + sizes[rank]]


def make_inputs(
    seed: int, leading: tuple[int, ...], vocab: int, dtype: torch.dtype = torch.float64
) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return dict(
        student=(torch.randn(*leading, vocab, generator=generator, dtype=torch.float64) * 3).to(dtype),
        teacher=(torch.randn(*leading, vocab, generator=generator, dtype=torch.float64) * 3).to(dtype),
        mask=torch.rand(leading, generator=generator) < 0.75,
        bin_ids=torch.randint(0, 3, leading, generator=generator),
        weights=torch.tensor([1.0, 0.5, 2.0]),
        upstream=torch.tensor([1.0, -0.5, 2.0]),
    )


def run_tp(body: Callable[..., Any], tp: int, **kwargs: Any) -> list[Any]:
    return simdist.run(body, layout=Layout(tp=tp), kwargs=kwargs, timeout=TIMEOUT_S)


def soft_ce_body(
    ctx: simdist.RankContext, inputs: dict[str, torch.Tensor], sizes: list[int], chunk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rank = ctx.coords.tp
    student = shard(inputs["student"], sizes, rank).clone().requires_grad_(True)
    stats = soft_cross_entropy(
        student,
        shard(inputs["teacher"], sizes, rank),
        inputs["mask"],
        tp_group=ctx.groups.tp,
        token_chunk_size=chunk,
        bin_ids=inputs["bin_ids"],
        weights=inputs["weights"],
    )
    (stats.numerators * inputs["upstream"].to(stats.numerators.dtype)).sum().backward()
    assert student.grad is not None
    return stats.numerators.detach(), stats.counts, student.grad


SPLITS = [(tp, kind) for tp in TP_SIZES for kind in ("even", "uneven") if not (tp == 1 and kind == "uneven")]


@pytest.mark.parametrize("chunk", [3, 64], ids=["streaming", "cached"])
@pytest.mark.parametrize(("tp", "kind"), SPLITS, ids=[f"tp{tp}-{kind}" for tp, kind in SPLITS])
def test_tensor_parallel_equals_full_vocabulary_reference(tp: int, kind: str, chunk: int) -> None:
    vocab = 24 if kind == "even" else 41
    sizes = shard_sizes(vocab, tp, kind)
    inputs = make_inputs(seed=tp * 10 + len(kind), leading=(2, 5), vocab=vocab)
    results = run_tp(soft_ce_body, tp, inputs=inputs, sizes=sizes, chunk=chunk)

    ref = reference_stats(
        inputs["student"], inputs["teacher"], inputs["mask"], inputs["bin_ids"], inputs["weights"]
    )
    ref_grad = reference_gradient(
        inputs["student"],
        inputs["teacher"],
        inputs["mask"],
        inputs["upstream"],
        inputs["bin_ids"],
        inputs["weights"],
    )
    for numerators, counts, _ in results:
        # Every TP rank reports the same (global) statistics, bit for bit.
        assert torch.equal(numerators, results[0][0]) and torch.equal(counts, results[0][1])
    torch.testing.assert_close(results[0][0], ref.numerators, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(results[0][1], ref.counts, rtol=0, atol=0)
    grad = torch.cat([g for _, _, g in results], dim=-1)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-14)


def test_tensor_parallel_bfloat16_matches_single_rank_within_its_precision() -> None:
    sizes = shard_sizes(37, 4, "uneven")
    inputs = make_inputs(seed=99, leading=(3, 4), vocab=37, dtype=torch.bfloat16)
    results = run_tp(soft_ce_body, 4, inputs=inputs, sizes=sizes, chunk=5)
    ref = reference_stats(
        inputs["student"], inputs["teacher"], inputs["mask"], inputs["bin_ids"], inputs["weights"]
    )
    ref_grad = reference_gradient(
        inputs["student"],
        inputs["teacher"],
        inputs["mask"],
        inputs["upstream"],
        inputs["bin_ids"],
        inputs["weights"],
    )
    assert results[0][0].dtype == torch.float32
    torch.testing.assert_close(results[0][0].double(), ref.numerators, rtol=1e-5, atol=1e-4)
    grad = torch.cat([g for _, _, g in results], dim=-1)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad.double(), ref_grad, rtol=2**-7, atol=1e-5)


def projected_body(
    ctx: simdist.RankContext,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    sizes: list[int],
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rank = ctx.coords.tp
    start = sum(sizes[:rank])
    h = hidden.clone().requires_grad_(True)
    w = weight[start : start + sizes[rank]].clone().requires_grad_(True)
    stats = projected_soft_cross_entropy(
        h,
        w,
        shard(inputs["teacher"], sizes, rank),
        inputs["mask"],
        tp_group=ctx.groups.tp,
        token_chunk_size=chunk,
        bin_ids=inputs["bin_ids"],
        weights=inputs["weights"],
    )
    (stats.numerators * inputs["upstream"].to(stats.numerators.dtype)).sum().backward()
    assert h.grad is not None and w.grad is not None
    return stats.numerators.detach(), h.grad, w.grad


@pytest.mark.parametrize("chunk", [4, 64], ids=["streaming", "cached"])
@pytest.mark.parametrize(("tp", "kind"), [(1, "even"), (2, "even"), (3, "uneven"), (8, "uneven")])
def test_projected_tensor_parallel_equals_full_vocabulary_reference(tp: int, kind: str, chunk: int) -> None:
    vocab, hidden_size = (24 if kind == "even" else 41), 5
    sizes = shard_sizes(vocab, tp, kind)
    inputs = make_inputs(seed=7 + tp, leading=(2, 6), vocab=vocab)
    generator = torch.Generator().manual_seed(tp)
    hidden = torch.randn(2, 6, hidden_size, generator=generator, dtype=torch.float64)
    weight = torch.randn(vocab, hidden_size, generator=generator, dtype=torch.float64)
    results = run_tp(
        projected_body, tp, hidden=hidden, weight=weight, inputs=inputs, sizes=sizes, chunk=chunk
    )

    h64 = hidden.clone().requires_grad_(True)
    w64 = weight.clone().requires_grad_(True)
    ref = reference_stats(
        h64 @ w64.t(), inputs["teacher"], inputs["mask"], inputs["bin_ids"], inputs["weights"]
    )
    ref_h, ref_w = torch.autograd.grad((inputs["upstream"].double() * ref.numerators).sum(), (h64, w64))
    for numerators, grad_hidden, _ in results:
        torch.testing.assert_close(numerators, ref.numerators.detach(), rtol=1e-12, atol=1e-12)
        # The replicated hidden state gets the gradient summed over every vocabulary shard.
        torch.testing.assert_close(grad_hidden, ref_h, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.cat([w for _, _, w in results]), ref_w, rtol=1e-12, atol=1e-12)


def test_tp_groups_inside_a_larger_layout_use_their_own_data() -> None:
    # tp=2 x dp=2: each DP replica has its own batch; statistics must follow the replica's data.
    sizes = shard_sizes(10, 2, "uneven")
    batches = [make_inputs(seed=s, leading=(3,), vocab=10) for s in (1, 2)]

    def body(ctx: simdist.RankContext) -> torch.Tensor:
        return soft_ce_body(ctx, batches[ctx.coords.dp], sizes, chunk=2)[0]

    results = simdist.run(body, layout=Layout(tp=2, dp=2), timeout=TIMEOUT_S)
    for rank, numerators in enumerate(results):
        batch = batches[Layout(tp=2, dp=2).coords(rank).dp]
        ref = reference_stats(
            batch["student"], batch["teacher"], batch["mask"], batch["bin_ids"], batch["weights"]
        )
        torch.testing.assert_close(numerators, ref.numerators, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
def test_non_finite_logit_on_one_shard_is_seen_by_every_rank(value: float) -> None:
    sizes = shard_sizes(12, 3, "uneven")
    inputs = make_inputs(seed=5, leading=(4,), vocab=12)
    inputs["mask"] = torch.ones(4, dtype=torch.bool)
    inputs["bin_ids"] = torch.tensor([0, 1, 2, 0])
    inputs["student"][1, 11] = value  # token 1 (bin 1), in the last shard only
    results = run_tp(soft_ce_body, 3, inputs=inputs, sizes=sizes, chunk=2)
    for numerators, _, _ in results:
        assert torch.isfinite(numerators).tolist() == [True, False, True]


def test_teacher_shard_of_minus_infinity_on_one_rank_is_probability_zero() -> None:
    # E.g. padded vocabulary entries masked to -inf that fill a whole shard.
    sizes = shard_sizes(13, 3, "uneven")  # the first shard has a single entry
    inputs = make_inputs(seed=8, leading=(5,), vocab=13)
    inputs["teacher"][:, :1] = -math.inf
    inputs["teacher"][2, :6] = -math.inf  # token 2: the first two shards entirely
    results = run_tp(soft_ce_body, 3, inputs=inputs, sizes=sizes, chunk=2)
    ref = reference_stats(
        inputs["student"], inputs["teacher"], inputs["mask"], inputs["bin_ids"], inputs["weights"]
    )
    ref_grad = reference_gradient(
        inputs["student"],
        inputs["teacher"],
        inputs["mask"],
        inputs["upstream"],
        inputs["bin_ids"],
        inputs["weights"],
    )
    assert torch.isfinite(ref.numerators).all()
    torch.testing.assert_close(results[0][0], ref.numerators, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        torch.cat([g for _, _, g in results], dim=-1), ref_grad, rtol=1e-12, atol=1e-14
    )


def test_row_blocks_under_tensor_parallelism(monkeypatch: pytest.MonkeyPatch) -> None:
    import draft_loss.soft_ce

    monkeypatch.setattr(draft_loss.soft_ce, "BLOCK_ELEMENTS", 9)  # 1 to 3 rows per block on shards of 3 to 9
    sizes = shard_sizes(19, 4, "uneven")
    inputs = make_inputs(seed=21, leading=(3, 5), vocab=19)
    results = run_tp(soft_ce_body, 4, inputs=inputs, sizes=sizes, chunk=4)
    ref = reference_stats(
        inputs["student"], inputs["teacher"], inputs["mask"], inputs["bin_ids"], inputs["weights"]
    )
    ref_grad = reference_gradient(
        inputs["student"],
        inputs["teacher"],
        inputs["mask"],
        inputs["upstream"],
        inputs["bin_ids"],
        inputs["weights"],
    )
    torch.testing.assert_close(results[0][0], ref.numerators, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        torch.cat([g for _, _, g in results], dim=-1), ref_grad, rtol=1e-12, atol=1e-14
    )


# ----------------------------------------------------------- bad input under TP


def bad_input_body(ctx: simdist.RankContext, vocab: int, bad_ranks: tuple[int, ...], change: str) -> None:
    rank = ctx.coords.tp
    inputs = make_inputs(seed=3, leading=(2, 3), vocab=vocab * ctx.layout.tp)  # type: ignore[union-attr]
    arguments: dict[str, Any] = dict(
        student_logits=inputs["student"][..., :vocab],
        teacher_logits=inputs["teacher"][..., :vocab],
        mask=inputs["mask"],
        tp_group=ctx.groups.tp,
        token_chunk_size=2,
        bin_ids=inputs["bin_ids"],
        weights=inputs["weights"],
    )
    function: Callable[..., Any] = soft_cross_entropy
    if rank in bad_ranks:
        apply_change(arguments, change)
        if change == "projected-on-one-rank":
            function = projected_soft_cross_entropy
    if function is projected_soft_cross_entropy:
        hidden = torch.randn(2, 3, 4, dtype=torch.float64)
        weight = torch.randn(vocab, 4, dtype=torch.float64)
        arguments.pop("student_logits")
        function(hidden, weight, arguments.pop("teacher_logits"), arguments.pop("mask"), **arguments)
    else:
        function(
            arguments.pop("student_logits"),
            arguments.pop("teacher_logits"),
            arguments.pop("mask"),
            **arguments,
        )
    # Unreachable when validation works: the next collective would find its peers gone.
    torch.distributed.all_reduce(torch.zeros(1), group=ctx.groups.tp)


def apply_change(arguments: dict[str, Any], change: str) -> None:
    mask = arguments["mask"]
    if change == "mask-shape":
        arguments["mask"] = mask[:, :2]
    elif change == "mask-value":
        flipped = mask.clone()
        flipped[0, 0] = not bool(flipped[0, 0])
        arguments["mask"] = flipped
    elif change == "mask-dtype":
        arguments["mask"] = mask.float()
    elif change == "bins-value":
        arguments["bin_ids"] = (arguments["bin_ids"] + 1) % 3
    elif change == "bins-out-of-range":
        arguments["bin_ids"] = arguments["bin_ids"] + 5
    elif change == "weights-value":
        arguments["weights"] = arguments["weights"] * 2
    elif change == "no-bins":
        arguments["bin_ids"] = None
    elif change == "chunk-value":
        arguments["token_chunk_size"] = 3
    elif change == "chunk-zero":
        arguments["token_chunk_size"] = 0
    elif change == "student-dtype":
        arguments["student_logits"] = arguments["student_logits"].float()
    elif change == "teacher-shape":
        arguments["teacher_logits"] = arguments["teacher_logits"][..., :-1]
    elif change == "student-not-tensor":
        arguments["student_logits"] = arguments["student_logits"].tolist()
    elif change == "token-count":
        arguments["student_logits"] = arguments["student_logits"][:1]
        arguments["teacher_logits"] = arguments["teacher_logits"][:1]
        arguments["mask"] = mask[:1]
        arguments["bin_ids"] = arguments["bin_ids"][:1]
    elif change == "leading-shape":
        arguments["student_logits"] = arguments["student_logits"].reshape(3, 2, -1)
        arguments["teacher_logits"] = arguments["teacher_logits"].reshape(3, 2, -1)
        arguments["mask"] = mask.reshape(3, 2)
        arguments["bin_ids"] = arguments["bin_ids"].reshape(3, 2)
    elif change != "projected-on-one-rank":
        raise AssertionError(change)


BAD_INPUTS: list[tuple[str, type[Exception], str]] = [
    (
        "mask-shape",
        ValueError,
        r"mask must have the logits' leading shape \(2, 3\), got \(2, 2\) \[TP rank 1 of 3 found this",
    ),
    (
        "mask-value",
        ValueError,
        r"TP ranks disagree on mask values \(digest\): values differ between TP ranks \[0, 2\] vs \[1\]",
    ),
    ("mask-dtype", ValueError, r"TP ranks disagree on mask dtype"),
    ("bins-value", ValueError, r"TP ranks disagree on bin_ids values \(digest\)"),
    (
        "bins-out-of-range",
        ValueError,
        r"bin_ids must be < len\(weights\) = 3, got maximum 7 \[TP rank 1 of 3",
    ),
    ("weights-value", ValueError, r"TP ranks disagree on weights values \(digest\)"),
    ("no-bins", ValueError, r"TP ranks disagree on bin_ids given: rank 0: 1, rank 1: 0, rank 2: 1"),
    ("chunk-value", ValueError, r"TP ranks disagree on token_chunk_size: rank 0: 2, rank 1: 3, rank 2: 2"),
    ("chunk-zero", ValueError, r"token_chunk_size must be >= 1, got 0 \[TP rank 1 of 3"),
    (
        "student-dtype",
        ValueError,
        r"TP ranks disagree on student_logits dtype: rank 0: torch.float64, rank 1: torch.float32",
    ),
    (
        "teacher-shape",
        ValueError,
        r"teacher_logits must have the shape of student_logits .* \[TP rank 1 of 3",
    ),
    ("student-not-tensor", TypeError, r"student_logits must be a torch.Tensor, got list \[TP rank 1 of 3"),
    ("token-count", ValueError, r"TP ranks disagree on leading shape \(digest\)"),
    (
        "leading-shape",
        ValueError,
        r"TP ranks disagree on number of leading dims|TP ranks disagree on leading shape",
    ),
    (
        "projected-on-one-rank",
        ValueError,
        r"^draft_loss: TP ranks called different losses: rank 0: soft_cross_entropy, rank 1: projected_soft_cross_entropy, rank 2: soft_cross_entropy$",
    ),
]


def assert_every_rank_raised(
    error: simdist.RankError, ranks: int, kind: type[Exception], pattern: str
) -> None:
    assert sorted(error.failures) == list(range(ranks)), error
    assert not error.released  # each rank raised by itself; none was woken out of a wait
    messages = {str(failure) for failure in error.failures.values()}
    assert len(messages) == 1, messages  # the same error everywhere
    for failure in error.failures.values():
        assert type(failure) is kind
    assert re.search(pattern, messages.pop())


@pytest.mark.parametrize(("change", "kind", "pattern"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_on_one_tp_rank_fails_on_every_rank(
    change: str, kind: type[Exception], pattern: str
) -> None:
    with pytest.raises(simdist.RankError) as info:
        run_tp(bad_input_body, 3, vocab=4, bad_ranks=(1,), change=change)
    assert_every_rank_raised(info.value, 3, kind, pattern)


def test_when_several_ranks_fail_the_lowest_is_reported_and_the_others_named() -> None:
    with pytest.raises(simdist.RankError) as info:
        run_tp(bad_input_body, 4, vocab=3, bad_ranks=(1, 3), change="chunk-zero")
    assert_every_rank_raised(
        info.value,
        4,
        ValueError,
        r"got 0 \[TP rank 1 of 4 found this; also failed on TP ranks \[3\]; every TP rank raises it\]",
    )


@pytest.mark.parametrize("tp", [2, 8])
def test_bad_input_on_the_last_rank_of_a_large_group(tp: int) -> None:
    with pytest.raises(simdist.RankError) as info:
        run_tp(bad_input_body, tp, vocab=2, bad_ranks=(tp - 1,), change="mask-shape")
    assert_every_rank_raised(info.value, tp, ValueError, rf"\[TP rank {tp - 1} of {tp} found this")


def test_long_messages_are_cut_to_the_fixed_payload_and_still_agree() -> None:
    from draft_loss import _validation

    def body(ctx: simdist.RankContext) -> None:
        def check() -> tuple[None, _validation.Header]:
            if ctx.rank == 1:
                raise TypeError("soft_cross_entropy: " + "é" * 2000)  # multi-byte characters, cut anywhere
            return None, ((_validation.FUNCTION_FIELD, 1),)

        _validation.validate_on_every_rank(ctx.groups.tp, 2, "soft_cross_entropy", check)

    with pytest.raises(simdist.RankError) as info:
        simdist.run(body, layout=Layout(tp=2), timeout=TIMEOUT_S)
    assert_every_rank_raised(
        info.value, 2, TypeError, r"^soft_cross_entropy: éé.*\.\.\. \[TP rank 1 of 2 found this"
    )
    assert len(str(info.value.failures[0]).encode()) < 600


def test_an_unexpected_error_while_checking_is_shared_too() -> None:
    from draft_loss import _validation

    def body(ctx: simdist.RankContext) -> None:
        def check() -> tuple[None, _validation.Header]:
            if ctx.rank == 0:
                raise KeyError("surprise")
            return None, ((_validation.FUNCTION_FIELD, 1),)

        _validation.validate_on_every_rank(ctx.groups.tp, 3, "soft_cross_entropy", check)

    with pytest.raises(simdist.RankError) as info:
        simdist.run(body, layout=Layout(tp=3), timeout=TIMEOUT_S)
    assert_every_rank_raised(
        info.value, 3, RuntimeError, r"^KeyError while checking arguments: 'surprise' \[TP rank 0 of 3"
    )
