"""draft_loss's soft cross-entropy against the float64 reference (single rank, no TP).

Values and gradients of the cached path (all tokens in one tile), the streaming
path (several tiles) and the projected form, over random shapes, masks
(including all-zero), bins, weights and dtypes; float64 gradchecks; the
documented non-finite behaviour; DraftLossStats.normalized; align_for_draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from soft_ce_reference import reference_gradient, reference_stats, token_cross_entropy

import draft_loss.soft_ce
from draft_loss import DraftLossStats, align_for_draft, projected_soft_cross_entropy, soft_cross_entropy

# Relative spacing of each dtype: the student gradient comes back rounded to it.
EPS = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
LOW_PRECISION = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class Case:
    student: torch.Tensor
    teacher: torch.Tensor
    mask: torch.Tensor
    bin_ids: torch.Tensor | None
    weights: torch.Tensor | None
    upstream: torch.Tensor  # dL/dnumerators used for the gradient comparison

    @property
    def num_tokens(self) -> int:
        return self.mask.numel()


@st.composite
def cases(draw: st.DrawFn, dtype: torch.dtype, min_tokens: int = 1) -> Case:
    leading = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    if math.prod(leading) < min_tokens:
        leading = leading[:-1] + (leading[-1] + min_tokens,)
    vocab = draw(st.integers(1, 24))
    scale = draw(st.sampled_from([0.1, 1.0, 4.0, 12.0]))
    offset = draw(st.sampled_from([0.0, 30.0, -50.0]))  # logsumexp must not care
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def logits() -> torch.Tensor:
        return (torch.randn(*leading, vocab, generator=generator, dtype=torch.float64) * scale + offset).to(
            dtype
        )

    mask_kind = draw(st.sampled_from(["bool", "float", "zeros", "ones", "int"]))
    if mask_kind == "bool":
        mask = torch.rand(leading, generator=generator) < 0.7
    elif mask_kind == "float":
        mask = torch.rand(leading, generator=generator, dtype=torch.float64).to(torch.float32)
        mask[torch.rand(leading, generator=generator) < 0.3] = 0
    elif mask_kind == "zeros":
        mask = torch.zeros(leading, dtype=torch.bool)
    elif mask_kind == "ones":
        mask = torch.ones(leading, dtype=torch.float32)
    else:
        mask = torch.randint(0, 2, leading, generator=generator, dtype=torch.int32)
    bins_kind = draw(st.sampled_from(["none", "bins", "bins+weights", "weights"]))
    num_bins = draw(st.integers(1, 4))
    bin_ids = None
    weights = None
    if bins_kind in ("bins", "bins+weights"):
        bin_ids = torch.randint(0, num_bins, leading, generator=generator)
    if bins_kind in ("bins+weights", "weights"):
        weights = torch.rand(num_bins, generator=generator) * 2
        if bins_kind == "weights":
            weights = weights[:1]
    if bin_ids is not None and weights is None:
        num_bins = int(bin_ids.max()) + 1
    elif bin_ids is None:
        num_bins = 1 if weights is None else len(weights)
    upstream = torch.randn(num_bins, generator=generator, dtype=torch.float64).to(torch.float32)
    return Case(logits(), logits(), mask, bin_ids, weights, upstream)


def run_case(case: Case, token_chunk_size: int) -> tuple[DraftLossStats, torch.Tensor]:
    student = case.student.clone().requires_grad_(True)
    stats = soft_cross_entropy(
        student,
        case.teacher,
        case.mask,
        tp_group=None,
        token_chunk_size=token_chunk_size,
        bin_ids=case.bin_ids,
        weights=case.weights,
    )
    (stats.numerators * case.upstream.to(stats.numerators.dtype)).sum().backward()
    assert student.grad is not None
    return stats, student.grad


def assert_matches_reference(case: Case, stats: DraftLossStats, grad: torch.Tensor) -> None:
    dtype = case.student.dtype
    ref = reference_stats(case.student, case.teacher, case.mask, case.bin_ids, case.weights)
    assert stats.numerators.shape == ref.numerators.shape
    # Work is float32 (float64 for float64 inputs) on exactly representable inputs.
    work_eps = EPS[torch.float64 if dtype == torch.float64 else torch.float32]
    logit_size = float(case.student.double().abs().max()) + float(case.teacher.double().abs().max()) + 1.0
    tolerance = (
        8
        * work_eps
        * logit_size
        * (1.0 + float(case.mask.double().sum()))
        * math.sqrt(case.student.shape[-1])
    )
    torch.testing.assert_close(stats.numerators.double(), ref.numerators, rtol=0, atol=tolerance)
    # Counts of float masks are summed in float32.
    count_tolerance = 2 * work_eps * (1.0 + float(case.mask.double().sum()))
    torch.testing.assert_close(stats.counts.double(), ref.counts, rtol=0, atol=count_tolerance)
    torch.testing.assert_close(stats.weights.double(), ref.weights, rtol=0, atol=0)
    expected_grad = reference_gradient(
        case.student, case.teacher, case.mask, case.upstream, case.bin_ids, case.weights
    )
    assert grad.dtype == dtype and grad.shape == case.student.shape
    grad_size = float(case.upstream.abs().max()) * float(case.mask.double().abs().max().clamp(min=1))
    torch.testing.assert_close(
        grad.double(),
        expected_grad,
        rtol=2 * EPS[dtype],
        atol=4 * work_eps * logit_size * grad_size + 4e-4 * EPS[dtype],
    )


@pytest.mark.parametrize("dtype", [torch.float64, *LOW_PRECISION], ids=str)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_cached_path_matches_reference(dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(cases(dtype))
    chunk = data.draw(st.integers(case.num_tokens, case.num_tokens + 5))
    stats, grad = run_case(case, chunk)
    assert_matches_reference(case, stats, grad)


@pytest.mark.parametrize("dtype", [torch.float64, *LOW_PRECISION], ids=str)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_streaming_path_matches_reference(dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(cases(dtype, min_tokens=2))
    chunk = data.draw(st.integers(1, case.num_tokens - 1))
    stats, grad = run_case(case, chunk)
    assert_matches_reference(case, stats, grad)


@pytest.mark.parametrize("block_elements", [1, 25, 64], ids=lambda n: f"block{n}")
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_row_blocks_inside_a_tile_give_the_same_result(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, block_elements: int
) -> None:
    # Real vocabularies make many row blocks per tile; force them at test sizes
    # (V=12: blocks of 1, 2 and 5 rows in tiles of 5 tokens, last tile of 3).
    monkeypatch.setattr(draft_loss.soft_ce, "BLOCK_ELEMENTS", block_elements)
    generator = torch.Generator().manual_seed(block_elements)
    leading, vocab = (13,), 12
    case = Case(
        student=(torch.randn(*leading, vocab, generator=generator, dtype=torch.float64) * 3).to(dtype),
        teacher=(torch.randn(*leading, vocab, generator=generator, dtype=torch.float64) * 3).to(dtype),
        mask=torch.rand(leading, generator=generator) < 0.8,
        bin_ids=torch.randint(0, 2, leading, generator=generator),
        weights=None,
        upstream=torch.tensor([0.5, -2.0]),
    )
    stats, grad = run_case(case, token_chunk_size=5)
    assert_matches_reference(case, stats, grad)


def test_paths_are_chosen_by_tile_count_and_streaming_keeps_no_vocab_sized_work() -> None:
    tokens, vocab = 6, 9
    student = torch.randn(tokens, vocab, requires_grad=True)
    teacher = torch.randn(tokens, vocab)
    mask = torch.ones(tokens)
    cached = soft_cross_entropy(student, teacher, mask, tp_group=None, token_chunk_size=tokens)
    streaming = soft_cross_entropy(student, teacher, mask, tp_group=None, token_chunk_size=tokens - 1)
    cached_saved = cached.numerators.grad_fn.saved_tensors  # type: ignore[union-attr]
    streaming_saved = streaming.numerators.grad_fn.saved_tensors  # type: ignore[union-attr]
    # Cached: exactly one [T, V] float32 tensor (the probability difference).
    assert [tuple(t.shape) for t in cached_saved] == [(tokens, vocab)]
    # Streaming: the inputs themselves (no new storage) plus per-token vectors only.
    inputs = {student.data_ptr(), teacher.data_ptr()}
    vocab_sized = [t for t in streaming_saved if t.dim() == 2]
    assert {t.data_ptr() for t in vocab_sized} == inputs
    assert all(t.shape == (tokens,) for t in streaming_saved if t.dim() != 2)


@pytest.mark.parametrize("chunk", [2, 50], ids=["streaming", "cached"])
def test_gradcheck_float64(chunk: int) -> None:
    generator = torch.Generator().manual_seed(11)
    student = torch.randn(2, 4, 6, generator=generator, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(2, 4, 6, generator=generator, dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 0.5, 2.0], [1.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    bin_ids = torch.tensor([[0, 1, 2, 1], [2, 2, 0, 1]])
    weights = torch.tensor([1.0, 0.5, 3.0], dtype=torch.float64)

    def numerators(x: torch.Tensor) -> torch.Tensor:
        return soft_cross_entropy(
            x, teacher, mask, tp_group=None, token_chunk_size=chunk, bin_ids=bin_ids, weights=weights
        ).numerators

    def normalized(x: torch.Tensor) -> torch.Tensor:
        stats = soft_cross_entropy(
            x, teacher, mask, tp_group=None, token_chunk_size=chunk, bin_ids=bin_ids, weights=weights
        )
        return stats.normalized(stats.counts + 1.0)

    assert torch.autograd.gradcheck(numerators, (student,))
    assert torch.autograd.gradcheck(normalized, (student,))


@pytest.mark.parametrize("chunk", [3, 50], ids=["streaming", "cached"])
def test_projected_gradcheck_float64(chunk: int) -> None:
    generator = torch.Generator().manual_seed(5)
    hidden = torch.randn(7, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(7, 6, generator=generator, dtype=torch.float64)
    mask = torch.tensor([1, 1, 0, 1, 0, 1, 1], dtype=torch.bool)
    bin_ids = torch.tensor([0, 1, 1, 0, 1, 0, 1])

    def numerators(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return projected_soft_cross_entropy(
            h, w, teacher, mask, tp_group=None, token_chunk_size=chunk, bin_ids=bin_ids
        ).numerators

    assert torch.autograd.gradcheck(numerators, (hidden, weight))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("chunk", "block_elements"),
    [(1, None), (4, None), (4, 13), (64, None)],
    ids=["chunk1", "chunk4", "chunk4-blocks", "cached"],
)
def test_projected_matches_reference(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, chunk: int, block_elements: int | None
) -> None:
    if block_elements is not None:
        monkeypatch.setattr(draft_loss.soft_ce, "BLOCK_ELEMENTS", block_elements)  # 1-row blocks at V=13
    generator = torch.Generator().manual_seed(7)
    leading, hidden_size, vocab = (3, 5), 8, 13
    hidden = torch.randn(*leading, hidden_size, generator=generator, dtype=torch.float64).to(dtype)
    weight = (torch.randn(vocab, hidden_size, generator=generator, dtype=torch.float64) * 0.7).to(dtype)
    teacher = (torch.randn(*leading, vocab, generator=generator, dtype=torch.float64) * 2).to(dtype)
    mask = torch.rand(leading, generator=generator) < 0.8
    bin_ids = torch.randint(0, 2, leading, generator=generator)
    weights = torch.tensor([1.0, 2.0])
    upstream = torch.tensor([0.7, -1.3])

    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    stats = projected_soft_cross_entropy(
        h, w, teacher, mask, tp_group=None, token_chunk_size=chunk, bin_ids=bin_ids, weights=weights
    )
    (stats.numerators * upstream.to(stats.numerators.dtype)).sum().backward()

    h64 = hidden.double().requires_grad_(True)
    w64 = weight.double().requires_grad_(True)
    ref = reference_stats(h64 @ w64.t(), teacher, mask, bin_ids, weights)
    ref_grads = torch.autograd.grad((upstream.double() * ref.numerators).sum(), (h64, w64))

    # bf16 logits are rounded to bf16 by the head's matmul, as a bf16 model's would be.
    tolerance = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 6e-2}[dtype]
    torch.testing.assert_close(
        stats.numerators.double(), ref.numerators.detach(), rtol=tolerance, atol=tolerance
    )
    torch.testing.assert_close(stats.counts.double(), ref.counts)
    assert h.grad is not None and w.grad is not None
    assert h.grad.dtype == dtype and w.grad.dtype == dtype
    torch.testing.assert_close(h.grad.double(), ref_grads[0], rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(w.grad.double(), ref_grads[1], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("chunk", [2, 64], ids=["streaming", "cached"])
def test_gradient_comes_back_in_student_dtype(dtype: torch.dtype, chunk: int) -> None:
    student = torch.randn(5, 10).to(dtype).requires_grad_(True)
    teacher = torch.randn(5, 10).to(torch.bfloat16)  # the teacher may have its own dtype
    stats = soft_cross_entropy(student, teacher, torch.ones(5), tp_group=None, token_chunk_size=chunk)
    assert stats.numerators.dtype == torch.float32
    stats.normalized().backward()
    assert student.grad is not None and student.grad.dtype == dtype


@pytest.mark.parametrize("chunk", [1, 3, 64], ids=["chunk1", "chunk3", "cached"])
def test_all_zero_mask_gives_zero_statistics_loss_and_gradient(chunk: int) -> None:
    student = torch.randn(2, 3, 8, requires_grad=True)
    stats = soft_cross_entropy(
        student, torch.randn(2, 3, 8), torch.zeros(2, 3), tp_group=None, token_chunk_size=chunk
    )
    assert stats.numerators.tolist() == [0.0] and stats.counts.tolist() == [0.0]
    loss = stats.normalized()
    assert loss.item() == 0.0
    loss.backward()
    assert student.grad is not None and torch.equal(student.grad, torch.zeros_like(student))


def test_no_tokens_at_all() -> None:
    student = torch.randn(0, 8, requires_grad=True)
    stats = soft_cross_entropy(student, torch.randn(0, 8), torch.zeros(0), tp_group=None, token_chunk_size=4)
    assert stats.numerators.tolist() == [0.0] and stats.counts.tolist() == [0.0]
    stats.normalized().backward()
    assert student.grad is not None and student.grad.shape == (0, 8)


# ------------------------------------------------------------ non-finite logits


def _poisoned(where: str, value: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    student = torch.randn(6, 7, generator=generator)
    teacher = torch.randn(6, 7, generator=generator)
    target = student if where == "student" else teacher
    target[2, 4] = value
    mask = torch.ones(6)
    return student, teacher, mask


NON_FINITE = [
    ("student", math.nan),
    ("student", math.inf),
    ("student", -math.inf),
    ("teacher", math.nan),
    ("teacher", math.inf),
]


@pytest.mark.parametrize("chunk", [2, 64], ids=["streaming", "cached"])
@pytest.mark.parametrize(("where", "value"), NON_FINITE, ids=[f"{w}{v}" for w, v in NON_FINITE])
def test_non_finite_logit_in_a_counted_token_makes_its_bin_non_finite(
    where: str, value: float, chunk: int
) -> None:
    student, teacher, mask = _poisoned(where, value)
    bin_ids = torch.tensor([0, 0, 1, 1, 2, 2])  # the poisoned token (2) is in bin 1
    s = student.requires_grad_(True)
    stats = soft_cross_entropy(s, teacher, mask, tp_group=None, token_chunk_size=chunk, bin_ids=bin_ids)
    finite = torch.isfinite(stats.numerators).tolist()
    assert finite == [True, False, True]
    assert not torch.isfinite(stats.normalized())
    stats.numerators.sum().backward()
    assert s.grad is not None
    assert torch.isfinite(s.grad[[0, 1, 3, 4, 5]]).all()  # other tokens are untouched
    if not (where == "student" and value == -math.inf):
        # (-inf student logit: CE is +inf but softmax(s) - softmax(z) stays finite.)
        assert not torch.isfinite(s.grad[2]).all()


@pytest.mark.parametrize("chunk", [2, 64], ids=["streaming", "cached"])
def test_minus_infinity_teacher_logit_means_probability_zero(chunk: int) -> None:
    student, teacher, mask = _poisoned("teacher", -math.inf)
    teacher[4, :3] = -math.inf
    stats, grad = run_case(Case(student, teacher, mask, None, None, torch.ones(1)), chunk)
    assert torch.isfinite(stats.numerators).all() and torch.isfinite(grad).all()
    assert_matches_reference(Case(student, teacher, mask, None, None, torch.ones(1)), stats, grad)


@pytest.mark.parametrize("chunk", [2, 64], ids=["streaming", "cached"])
@pytest.mark.parametrize(("where", "value"), NON_FINITE, ids=[f"{w}{v}" for w, v in NON_FINITE])
def test_non_finite_logits_of_masked_tokens_are_ignored(where: str, value: float, chunk: int) -> None:
    student, teacher, mask = _poisoned(where, value)
    mask[2] = 0
    case = Case(student, teacher, mask, None, None, torch.tensor([1.5]))
    stats, grad = run_case(case, chunk)
    assert torch.isfinite(stats.numerators).all()
    assert torch.equal(grad[2], torch.zeros(7))
    keep = [0, 1, 3, 4, 5]
    clean = Case(student[keep], teacher[keep], mask[keep], None, None, case.upstream)
    ref = reference_stats(clean.student, clean.teacher, clean.mask)
    torch.testing.assert_close(stats.numerators.double(), ref.numerators, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        grad[keep].double(), reference_gradient(clean.student, clean.teacher, clean.mask, clean.upstream)
    )


def test_projected_masked_non_finite_hidden_does_not_reach_the_weight_gradient() -> None:
    hidden = torch.randn(5, 4)
    hidden[1, 0] = math.nan
    h = hidden.requires_grad_(True)
    w = torch.randn(6, 4, requires_grad=True)
    mask = torch.tensor([1, 0, 1, 1, 1])
    stats = projected_soft_cross_entropy(h, w, torch.randn(5, 6), mask, tp_group=None, token_chunk_size=2)
    assert torch.isfinite(stats.numerators).all()
    stats.numerators.sum().backward()
    assert w.grad is not None and h.grad is not None
    assert torch.isfinite(w.grad).all()
    assert torch.equal(h.grad[1], torch.zeros(4))


# ------------------------------------------------------------------ statistics


def test_normalized_is_weighted_numerators_over_weighted_counts() -> None:
    numerators = torch.tensor([2.0, 3.0, 5.0], requires_grad=True)
    stats = DraftLossStats(numerators, torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 0.5, 2.0]))
    global_counts = torch.tensor([2.0, 4.0, 6.0])
    loss = stats.normalized(global_counts)
    expected = (1.0 * 2 + 0.5 * 3 + 2.0 * 5) / (1.0 * 2 + 0.5 * 4 + 2.0 * 6)
    assert loss.dim() == 0 and math.isclose(loss.item(), expected, rel_tol=1e-6)
    assert math.isclose(stats.normalized().item(), 13.5 / 10.0, rel_tol=1e-6)
    loss.backward()
    torch.testing.assert_close(numerators.grad, torch.tensor([1.0, 0.5, 2.0]) / 16.0)


@pytest.mark.parametrize(
    ("counts", "weights"),
    [([0.0, 0.0], [1.0, 1.0]), ([3.0, 2.0], [0.0, 0.0]), ([0.0, 5.0], [1.0, 0.0])],
    ids=["no-tokens", "zero-weights", "weighted-bins-empty"],
)
def test_normalized_is_exactly_zero_with_zero_gradient_when_weighted_count_is_zero(
    counts: list[float], weights: list[float]
) -> None:
    numerators = torch.tensor([4.0, 7.0], requires_grad=True)
    stats = DraftLossStats(numerators, torch.tensor(counts), torch.tensor(weights))
    loss = stats.normalized()
    assert loss.item() == 0.0 and torch.isfinite(loss)
    loss.backward()
    assert numerators.grad is not None and torch.equal(numerators.grad, torch.zeros(2))


def test_detach_drops_history_and_keeps_values() -> None:
    student = torch.randn(4, 5, requires_grad=True)
    stats = soft_cross_entropy(student, torch.randn(4, 5), torch.ones(4), tp_group=None, token_chunk_size=2)
    detached = stats.detach()
    assert stats.numerators.requires_grad and not detached.numerators.requires_grad
    assert torch.equal(detached.numerators, stats.numerators.detach())
    assert torch.equal(detached.counts, stats.counts) and torch.equal(detached.weights, stats.weights)


def test_bin_count_follows_weights_or_the_largest_bin_id() -> None:
    student, teacher = torch.randn(4, 3), torch.randn(4, 3)
    bins = torch.tensor([0, 2, 2, 0])
    by_ids = soft_cross_entropy(
        student, teacher, torch.ones(4), tp_group=None, token_chunk_size=4, bin_ids=bins
    )
    assert by_ids.counts.tolist() == [2.0, 0.0, 2.0]
    by_weights = soft_cross_entropy(
        student,
        teacher,
        torch.ones(4),
        tp_group=None,
        token_chunk_size=4,
        bin_ids=bins,
        weights=torch.ones(5),
    )
    assert by_weights.counts.tolist() == [2.0, 0.0, 2.0, 0.0, 0.0]


# ------------------------------------------------------------------- alignment


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 3), seq=st.integers(1, 6), vocab=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_align_for_draft_rolls_left_by_one_and_zeroes_the_last_slot(
    batch: int, seq: int, vocab: int, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(batch, seq, vocab, generator=generator, requires_grad=True)
    token_mask = torch.rand(batch, seq, generator=generator) < 0.6
    aligned_teacher, aligned_mask = align_for_draft(teacher, token_mask)
    assert aligned_teacher.dtype == teacher.dtype and aligned_mask.dtype == token_mask.dtype
    assert not aligned_teacher.requires_grad
    for t in range(seq - 1):
        assert torch.equal(aligned_teacher[:, t], teacher.detach()[:, t + 1])
        assert torch.equal(aligned_mask[:, t], token_mask[:, t + 1])
    assert torch.equal(aligned_teacher[:, -1], torch.zeros(batch, vocab))
    assert not aligned_mask[:, -1].any()
    assert int(aligned_mask.sum()) == int(token_mask[:, 1:].sum())
    # The draft count seen by the loss is the policy's shifted-token count.
    stats = soft_cross_entropy(
        torch.randn(batch, seq, vocab), aligned_teacher, aligned_mask, tp_group=None, token_chunk_size=2
    )
    assert stats.counts.tolist() == [float(token_mask[:, 1:].sum())]


def test_align_for_draft_does_not_modify_its_inputs() -> None:
    teacher = torch.randn(2, 3, 4)
    mask = torch.ones(2, 3)
    before = (teacher.clone(), mask.clone())
    align_for_draft(teacher, mask)
    assert torch.equal(teacher, before[0]) and torch.equal(mask, before[1])


def test_reference_cross_entropy_is_entropy_when_student_equals_teacher() -> None:
    # Guards the reference itself: CE(p, p) is the entropy of p.
    logits = torch.randn(3, 9, dtype=torch.float64)
    p = torch.softmax(logits, dim=-1)
    entropy = -(p * p.log()).sum(-1)
    torch.testing.assert_close(token_cross_entropy(logits, logits), entropy)
