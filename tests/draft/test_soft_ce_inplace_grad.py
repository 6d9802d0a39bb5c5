"""soft_cross_entropy(overwrite_student_with_grad=True): backward writes the
gradient into the student logits' storage.

The gradient must be bit for bit the default mode's, and both must match the
float64 reference; after backward the logits hold it and no second [T, V]
buffer is allocated; what is unsafe and detectable is refused, in forward (on
every TP rank together) or in backward.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from soft_ce_reference import reference_gradient, reference_stats

import simdist
from draft_loss import soft_cross_entropy
from simdist import Layout

EPS = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
TIMEOUT_S = 30.0


def make_case(
    seed: int, leading: tuple[int, ...], vocab: int, dtype: torch.dtype, num_bins: int = 3
) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.rand(leading, generator=generator) < 0.7).float()
    mask[torch.rand(leading, generator=generator) < 0.3] *= 0.5  # some fractional weights
    return dict(
        student=(torch.randn(*leading, vocab, generator=generator, dtype=torch.float64) * 3).to(dtype),
        teacher=(torch.randn(*leading, vocab, generator=generator, dtype=torch.float64) * 3).to(dtype),
        mask=mask,
        bin_ids=torch.randint(0, num_bins, leading, generator=generator),
        weights=torch.rand(num_bins, generator=generator) + 0.5,
        upstream=torch.randn(num_bins, generator=generator),
    )


def loss_of(stats: Any, upstream: torch.Tensor) -> torch.Tensor:
    return (stats.numerators * upstream.to(stats.numerators.dtype)).sum()


def run_mode(
    case: dict[str, Any], chunk: int, overwrite: bool, tp_group: Any = None
) -> dict[str, torch.Tensor]:
    """One forward+backward. In overwrite mode the logits are a non-leaf (as an
    LM head's output is): a clone of the leaf, whose backward hands the
    gradient through unchanged."""
    leaf = case["student"].clone().requires_grad_(True)
    logits = leaf.clone() if overwrite else leaf
    flowing: list[torch.Tensor] = []
    logits.register_hook(flowing.append)  # the gradient tensor autograd hands on, to see its storage
    stats = soft_cross_entropy(
        logits,
        case["teacher"],
        case["mask"],
        tp_group=tp_group,
        token_chunk_size=chunk,
        bin_ids=case["bin_ids"],
        weights=case["weights"],
        overwrite_student_with_grad=overwrite,
    )
    loss_of(stats, case["upstream"]).backward()
    assert leaf.grad is not None and len(flowing) == 1
    return dict(
        numerators=stats.numerators.detach(),
        grad=leaf.grad,
        logits_after=logits.detach(),
        same_storage=torch.tensor(flowing[0].data_ptr() == logits.data_ptr()),
    )


def assert_overwrite_equals_default(case: dict[str, Any], chunk: int, tp_group: Any = None) -> torch.Tensor:
    default = run_mode(case, chunk, overwrite=False, tp_group=tp_group)
    overwrite = run_mode(case, chunk, overwrite=True, tp_group=tp_group)
    assert torch.equal(overwrite["numerators"], default["numerators"])
    assert overwrite["grad"].dtype == case["student"].dtype
    assert torch.equal(overwrite["grad"], default["grad"])  # bit for bit
    # Documented: the logits now hold the gradient, in their own storage.
    assert torch.equal(overwrite["logits_after"], default["grad"])
    assert bool(overwrite["same_storage"]) and not bool(default["same_storage"])
    return overwrite["grad"]


def assert_matches_reference(case: dict[str, Any], grad: torch.Tensor) -> None:
    dtype = case["student"].dtype
    expected = reference_gradient(
        case["student"], case["teacher"], case["mask"], case["upstream"], case["bin_ids"], case["weights"]
    )
    work_eps = EPS[torch.float64 if dtype == torch.float64 else torch.float32]
    logit_size = float(case["student"].double().abs().max() + case["teacher"].double().abs().max()) + 1.0
    grad_size = float(case["upstream"].abs().max())
    torch.testing.assert_close(
        grad.double(),
        expected,
        rtol=2 * EPS[dtype],
        atol=4 * work_eps * logit_size * grad_size + 4e-4 * EPS[dtype],
    )


# ----------------------------------------------------------- same gradient


@pytest.mark.parametrize("path", ["streaming", "cached"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    leading=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
    vocab=st.integers(1, 20),
)
def test_gradient_is_the_default_modes_bit_for_bit_and_matches_the_reference(
    path: str, dtype: torch.dtype, seed: int, leading: tuple[int, ...], vocab: int
) -> None:
    case = make_case(seed, leading, vocab, dtype)
    tokens = math.prod(leading)
    if path == "streaming" and tokens < 2:
        case = make_case(seed, leading + (2,), vocab, dtype)
        tokens *= 2
    chunk = tokens if path == "cached" else max(1, tokens // 3)
    grad = assert_overwrite_equals_default(case, chunk)
    assert_matches_reference(case, grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("chunk", [3, 64], ids=["streaming", "cached"])
def test_lm_head_logits_give_the_default_modes_weight_and_hidden_gradients(
    dtype: torch.dtype, chunk: int
) -> None:
    # The intended use: logits straight from the head, whose backward needs
    # only its input and weight, never the logits.
    generator = torch.Generator().manual_seed(5)
    hidden = torch.randn(2, 7, 8, generator=generator).to(dtype)
    weight = torch.randn(11, 8, generator=generator).to(dtype)
    teacher = torch.randn(2, 7, 11, generator=generator).to(dtype)
    mask = torch.rand(2, 7, generator=generator) < 0.8
    grads = []
    for overwrite in (False, True):
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        stats = soft_cross_entropy(
            h @ w.T,
            teacher,
            mask,
            tp_group=None,
            token_chunk_size=chunk,
            overwrite_student_with_grad=overwrite,
        )
        stats.normalized(stats.counts).backward()
        grads.append((h.grad, w.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("chunk", [2, 64], ids=["streaming", "cached"])
def test_backward_allocates_no_second_vocab_sized_buffer(chunk: int) -> None:
    tokens, vocab = 64, 4096  # a tile of 2 rows keeps the streaming workspace far below [T, V]
    case = make_case(3, (tokens,), vocab, torch.bfloat16)
    gradient_bytes = tokens * vocab * case["student"].element_size()

    def largest_allocation_in_backward(overwrite: bool) -> int:
        leaf = case["student"].clone().requires_grad_(True)
        logits = leaf.clone() if overwrite else leaf
        stats = soft_cross_entropy(
            logits,
            case["teacher"],
            case["mask"],
            tp_group=None,
            token_chunk_size=chunk,
            overwrite_student_with_grad=overwrite,
        )
        loss = stats.numerators.sum()
        # Only the loss's own backward: a clone's backward allocates nothing either.
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        ) as prof:
            torch.autograd.grad(loss, logits)
        return max((event.cpu_memory_usage for event in prof.events()), default=0)

    # The default mode returns a fresh gradient (the check can fail)...
    assert largest_allocation_in_backward(overwrite=False) >= gradient_bytes
    # ...the overwrite mode does not, on either path.
    assert largest_allocation_in_backward(overwrite=True) < gradient_bytes // 4


def test_non_contiguous_logits_are_copied_and_left_as_they_were() -> None:
    case = make_case(8, (6,), 5, torch.float32)
    leaf = case["student"].t().contiguous().requires_grad_(True)  # [V, T]
    made = leaf * 2
    logits = made.t()  # [T, V], not contiguous
    before = logits.detach().clone()
    stats = soft_cross_entropy(
        logits,
        case["teacher"],
        case["mask"],
        tp_group=None,
        token_chunk_size=4,
        overwrite_student_with_grad=True,
    )
    stats.numerators.sum().backward()
    assert torch.equal(logits.detach(), before)
    expected = reference_gradient(2 * case["student"], case["teacher"], case["mask"], torch.ones(1)) * 2
    torch.testing.assert_close(leaf.grad.t().double(), expected, rtol=1e-5, atol=1e-6)


def test_overlapping_rows_get_each_their_own_gradient() -> None:
    # An expanded row (stride 0): writing every token's gradient into one row
    # would leave only the last; the contiguous copy keeps them apart.
    generator = torch.Generator().manual_seed(9)
    leaf = torch.randn(7, generator=generator, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(4, 7, generator=generator, dtype=torch.float64)
    mask = torch.tensor([1.0, 0.5, 1.0, 2.0], dtype=torch.float64)
    grads = []
    for overwrite in (False, True):
        leaf.grad = None
        logits = (leaf * 1).expand(4, 7)
        stats = soft_cross_entropy(
            logits, teacher, mask, tp_group=None, token_chunk_size=2, overwrite_student_with_grad=overwrite
        )
        stats.numerators.sum().backward()
        grads.append(leaf.grad.clone())
    assert torch.equal(grads[0], grads[1])
    expected = reference_gradient(leaf.detach().expand(4, 7), teacher, mask, torch.ones(1)).sum(dim=0)
    torch.testing.assert_close(grads[1], expected, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- refusals


def call(student: torch.Tensor, teacher: torch.Tensor, chunk: int = 2, overwrite: Any = True) -> Any:
    return soft_cross_entropy(
        student,
        teacher,
        torch.ones(student.shape[:-1]),
        tp_group=None,
        token_chunk_size=chunk,
        overwrite_student_with_grad=overwrite,
    )


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda leaf: leaf, r"student_logits are a leaf tensor that requires grad \(shape \(4, 6\)\)"),
        (
            lambda leaf: leaf[:, :3],
            r"student_logits are a view of a leaf tensor that requires grad \(shape \(4, 6\)\)",
        ),
        (lambda leaf: leaf.view(2, 2, 6), r"are a view of a leaf tensor that requires grad"),
    ],
    ids=["leaf", "slice-of-leaf", "view-of-leaf"],
)
def test_a_leaf_that_requires_grad_is_refused_before_anything_is_computed(make: Any, pattern: str) -> None:
    leaf = torch.randn(4, 6, requires_grad=True)
    before = leaf.detach().clone()
    student = make(leaf)
    with pytest.raises(
        ValueError, match="^soft_cross_entropy: overwrite_student_with_grad=True .*" + pattern
    ):
        call(student, torch.randn(student.shape))
    assert torch.equal(leaf.detach(), before)
    call(student, torch.randn(student.shape), overwrite=False)  # the default mode takes it


def test_teacher_sharing_the_students_storage_is_refused() -> None:
    logits = torch.randn(4, 6, requires_grad=True) * 1
    with pytest.raises(ValueError, match=r"teacher_logits share storage with student_logits"):
        call(logits, logits.detach())
    with pytest.raises(ValueError, match=r"teacher_logits share storage with student_logits"):
        call(logits[:, :3], logits.detach()[:, 3:])


@pytest.mark.parametrize("value", [1, "yes", None])
def test_the_flag_must_be_a_bool(value: Any) -> None:
    with pytest.raises(
        TypeError, match=r"overwrite_student_with_grad must be a bool, got " + type(value).__name__
    ):
        call(torch.randn(4, 6), torch.randn(4, 6), overwrite=value)


@pytest.mark.parametrize("chunk", [2, 64], ids=["streaming", "cached"])
def test_logits_modified_after_forward_are_refused_in_backward(chunk: int) -> None:
    logits = torch.randn(4, 6, requires_grad=True) * 1
    stats = call(logits, torch.randn(4, 6), chunk)
    with torch.no_grad():
        logits.add_(1.0)
    with pytest.raises(
        RuntimeError, match=r"logits saved for backward changed between forward and this backward"
    ):
        stats.numerators.sum().backward()


def test_a_teacher_modified_after_forward_is_refused_in_backward() -> None:
    logits = torch.randn(4, 6, requires_grad=True) * 1
    teacher = torch.randn(4, 6)
    stats = call(logits, teacher, chunk=2)  # streaming: backward rereads the teacher
    teacher.mul_(2.0)
    with pytest.raises(RuntimeError, match=r"the student \(or teacher\) logits were modified in place"):
        stats.numerators.sum().backward()


@pytest.mark.parametrize("chunk", [2, 64], ids=["streaming", "cached"])
def test_a_second_backward_is_refused(chunk: int) -> None:
    logits = torch.randn(4, 6, requires_grad=True) * 1
    loss = call(logits, torch.randn(4, 6), chunk).numerators.sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=r"a second backward through the loss"):
        loss.backward()


@pytest.mark.parametrize("chunk", [2, 64], ids=["streaming", "cached"])
def test_two_overwriting_losses_on_the_same_logits_are_refused(chunk: int) -> None:
    logits = torch.randn(4, 6, requires_grad=True) * 1
    first = call(logits, torch.randn(4, 6), chunk).numerators.sum()
    second = call(logits, torch.randn(4, 6), chunk).numerators.sum()
    with pytest.raises(
        RuntimeError, match=r"logits saved for backward changed between forward and this backward"
    ):
        (first + second).backward()


def test_another_op_that_saved_the_logits_is_stopped_by_autograds_version_check() -> None:
    # Documented as not allowed; here the other op's backward runs after ours
    # (autograd runs the later-made node first), so its saved logits are stale.
    logits = torch.randn(4, 6, requires_grad=True) * 1
    other = (logits**2).sum()
    ours = call(logits, torch.randn(4, 6)).numerators.sum()
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation"):
        (other + ours).backward()


# --------------------------------------------------------- tensor parallel


def tp_body(
    ctx: simdist.RankContext, case: dict[str, Any], sizes: list[int], chunk: int
) -> list[torch.Tensor]:
    rank = ctx.coords.tp
    start = sum(sizes[:rank])
    shard = {
        k: (t[..., start : start + sizes[rank]] if k in ("student", "teacher") else t)
        for k, t in case.items()
    }
    default = run_mode(shard, chunk, overwrite=False, tp_group=ctx.groups.tp)
    overwrite = run_mode(shard, chunk, overwrite=True, tp_group=ctx.groups.tp)
    return [default["grad"], overwrite["grad"], overwrite["logits_after"], overwrite["numerators"]]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("chunk", [3, 64], ids=["streaming", "cached"])
@pytest.mark.parametrize("sizes", [[6, 6], [1, 2, 10]], ids=["tp2-even", "tp3-uneven"])
def test_tensor_parallel_shards_get_the_default_modes_gradient(
    dtype: torch.dtype, chunk: int, sizes: list[int]
) -> None:
    case = make_case(len(sizes) + chunk, (2, 5), sum(sizes), dtype)
    results = simdist.run(
        tp_body,
        layout=Layout(tp=len(sizes)),
        kwargs=dict(case=case, sizes=sizes, chunk=chunk),
        timeout=TIMEOUT_S,
    )
    for default_grad, overwrite_grad, logits_after, _ in results:
        assert torch.equal(overwrite_grad, default_grad) and torch.equal(logits_after, default_grad)
    grad = torch.cat([r[1] for r in results], dim=-1)
    assert_matches_reference(case, grad)
    ref = reference_stats(case["student"], case["teacher"], case["mask"], case["bin_ids"], case["weights"])
    tolerance = 1e-12 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(results[0][3].double(), ref.numerators, rtol=tolerance, atol=tolerance)


def refused_on_one_rank_body(ctx: simdist.RankContext) -> None:
    generator = torch.Generator().manual_seed(1)
    student = torch.randn(3, 4, generator=generator, requires_grad=True)
    if ctx.coords.tp != 1:
        student = student * 1  # a non-leaf: fine
    soft_cross_entropy(
        student,
        torch.randn(3, 4, generator=generator),
        torch.ones(3),
        tp_group=ctx.groups.tp,
        token_chunk_size=2,
        overwrite_student_with_grad=True,
    )


def test_a_leaf_on_one_tp_rank_is_refused_on_every_rank() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(refused_on_one_rank_body, layout=Layout(tp=3), timeout=TIMEOUT_S)
    failures = info.value.failures
    assert sorted(failures) == [0, 1, 2]
    assert len({str(failure) for failure in failures.values()}) == 1
    for failure in failures.values():
        assert type(failure) is ValueError
        assert re.search(
            r"student_logits are a leaf tensor that requires grad .*\[TP rank 1 of 3", str(failure)
        )
