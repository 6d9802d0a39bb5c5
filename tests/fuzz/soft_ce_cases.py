"""Fuzz cases of ``soft_cross_entropy`` alone, on a TP group with uneven vocabulary shards.

``CotrainWorker`` shards its vocabulary evenly, so the uneven splits that
real vocabularies make (50257 over 4 ranks) are fuzzed here, on the loss
itself, against ``soft_ce_reference`` (float64, full vocabulary, no
draft_loss code). The mask is the draft's own (already aligned) mask, so
its valid tokens differ from any policy mask by construction.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from hypothesis import assume
from hypothesis import strategies as st
from soft_ce_reference import reference_stats

import simdist
from draft_loss import soft_ce as soft_ce_module
from draft_loss import soft_cross_entropy
from simdist import Layout
from simdist.strategies import (
    MASK_SCALES,
    ReductionChoice,
    bin_weights,
    campaign_max_world_size,
    dtype_names,
    mask_rows,
    reductions,
)

# The largest TP group drawn, lowered by a campaign's --max-world-size.
MAX_TP = 8


def _long_row(seq: int, valid: int, scale: float) -> tuple[float, ...]:
    return (scale,) * valid + (0.0,) * (seq - valid)


MASKED_NONFINITE = ("none", "nan", "inf", "-inf")

# One case in eight is long (over 256 tokens); shrinks towards short.
LONG_CHOICES = (False,) * 7 + (True,)


def max_tp() -> int:
    return min(MAX_TP, campaign_max_world_size(MAX_TP) or MAX_TP)


@dataclass(frozen=True)
class SoftCECase:
    shards: tuple[int, ...]  # vocabulary shard size of each TP rank (the TP size is their number)
    mask: tuple  # [batch][seq] floats
    token_chunk_size: int
    dtype: str
    bin_weights: tuple[float, ...]
    single_bin: int | None  # every token in this bin; None: bins from the seed
    seed: int  # logits, bins, upstream gradient
    reduction: str
    reduction_seed: int
    teacher_neg_inf: bool  # some teacher logits are -inf (probability 0)
    overwrite: bool  # overwrite_student_with_grad
    bad_input: Mapping[str, Any] | None = None  # {"kind": ..., "rank": r}
    # "nan", "inf" or "-inf" in the draft (student) logits at masked (padding)
    # positions, as real padding has them: they must not reach numerators or
    # gradients. "none": finite everywhere.
    masked_nonfinite: str = "none"
    # soft_ce_module.BLOCK_ELEMENTS while the case runs (None: the real one), so that a
    # token tile spans several row blocks (as only vocabularies of 10**5 do).
    block_elements: int | None = None
    # The ranks on emulated CUDA devices (simdist.run(cuda="emulate")), the TP
    # group made with backend="nccl": draft_loss's CUDA paths (its payload
    # device for NCCL groups), judged like any case and bitwise against the
    # same case on the CPU.
    cuda: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["shards"] = list(self.shards)
        data["mask"] = [list(row) for row in self.mask]
        data["bin_weights"] = list(self.bin_weights)
        data["bad_input"] = None if self.bad_input is None else dict(self.bad_input)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SoftCECase:
        fields = dict(data)
        fields["shards"] = tuple(int(s) for s in fields["shards"])
        fields["mask"] = tuple(tuple(float(v) for v in row) for row in fields["mask"])
        fields["bin_weights"] = tuple(float(w) for w in fields["bin_weights"])
        if fields.get("bad_input") is not None:
            fields["bad_input"] = dict(fields["bad_input"])
        return cls(**fields)

    @property
    def tp(self) -> int:
        return len(self.shards)

    @property
    def vocab_size(self) -> int:
        return sum(self.shards)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Full-vocabulary logits (in the case's dtype), mask, bins, weights and the
        upstream gradient of the numerators, all from the seed."""
        generator = torch.Generator().manual_seed(self.seed)
        mask = torch.tensor(self.mask, dtype=torch.float32)
        shape = (*mask.shape, self.vocab_size)
        dtype = getattr(torch, self.dtype)
        clean_student = (torch.randn(shape, generator=generator) * 3).to(dtype)
        teacher = (torch.randn(shape, generator=generator) * 3).to(dtype)
        student = clean_student.clone()
        if self.masked_nonfinite != "none":
            student[mask == 0] = float(self.masked_nonfinite)
        if self.teacher_neg_inf:
            hole = torch.rand(shape, generator=generator) < 0.3
            hole[..., 0] = False  # every token keeps a finite teacher logit
            teacher = teacher.masked_fill(hole, float("-inf"))
        num_bins = len(self.bin_weights)
        if self.single_bin is None:
            bins = torch.randint(0, num_bins, tuple(mask.shape), generator=generator)
        else:
            bins = torch.full(tuple(mask.shape), self.single_bin, dtype=torch.int64)
        weights = torch.tensor(self.bin_weights, dtype=torch.float32)
        upstream = weights * (0.5 + torch.rand(num_bins, generator=generator))
        return {
            "student": student,
            "clean_student": clean_student,  # what the reference sees: padding carries nothing
            "teacher": teacher,
            "mask": mask,
            "bins": bins,
            "weights": weights,
            "upstream": upstream,
        }

    def cover(self) -> dict[str, Any]:
        tokens = len(self.mask) * len(self.mask[0])
        counts = torch.tensor(self.mask).sum()
        return {
            "tp": self.tp,
            "world": self.tp,
            "dtype": self.dtype,
            "reduction": self.reduction,
            "zero_count": "draft" if float(counts) == 0 else "none",
            "fault": "none",
            "clip": False,
            "uneven_vocab": len(set(self.shards)) > 1,
            "chunk_vs_tokens": "1"
            if self.token_chunk_size == 1
            else ("< tokens" if self.token_chunk_size < tokens else ">= tokens"),
            "teacher_neg_inf": self.teacher_neg_inf,
            "overwrite": self.overwrite,
            "masked_nonfinite": self.masked_nonfinite
            if 0.0 in (v for row in self.mask for v in row)
            else "none",
            "long": tokens > 256,
            "emulated_cuda": self.cuda,
            **self.corners(),
        }

    def corners(self) -> dict[str, Any]:
        """The documented dimensions' classes (see DraftCase.corners)."""
        tokens = len(self.mask) * len(self.mask[0])
        blocks = soft_ce_module.BLOCK_ELEMENTS if self.block_elements is None else self.block_elements
        block_rows = max(1, blocks // max(self.shards))
        return {
            "tokens": "0-18" if tokens <= 18 else ("19-257" if tokens <= 257 else "258+"),
            "local_vocab": "10+" if max(self.shards) >= 10 else "1-9",
            "multi_block_tile": self.token_chunk_size < tokens and self.token_chunk_size > block_rows,
        }

    @contextmanager
    def blocks(self) -> Iterator[None]:
        """``soft_ce_module.BLOCK_ELEMENTS`` set to the case's while the case runs."""
        if self.block_elements is None:
            yield
            return
        saved = soft_ce_module.BLOCK_ELEMENTS
        soft_ce_module.BLOCK_ELEMENTS = self.block_elements
        try:
            yield
        finally:
            soft_ce_module.BLOCK_ELEMENTS = saved


SOFT_CE_DTYPES = ("float32", "bfloat16", "float16", "float64")
# Shapes: short (1..3 rows of 1..6 tokens), medium (19..257 tokens), long
# (two rows of 129..160: past bfloat16's exact integers). Shrinks towards short.
_SHAPES = ("short", "short", "short", "short", "medium", "medium", "medium", "long")
_SHARD_KINDS = ("tiny", "tiny", "medium", "large")


@st.composite
def soft_ce_cases(draw: st.DrawFn, *, min_tp: int = 1) -> SoftCECase:
    """Uneven vocabulary shards over 1..8 TP ranks (at most the campaign's
    --max-world-size): 1..9 entries a rank, or 7..32 or 33..128 (each rank a
    few apart); masks by ``mask_rows`` (short shapes, 19..257 tokens, or two
    rows of 129..160 past bfloat16's exact integers); float32, bfloat16,
    float16 and float64; chunk sizes from 1 (at most 16 tiles on large
    shapes) to beyond the token count, with row blocks smaller than a tile."""
    top = max_tp()
    # Every choice below is drawn whatever the values before it (the shards of
    # the largest TP, every kind of mask, the single bin), and the case keeps
    # what it uses: a case makes the same choices whatever their values, so
    # Hypothesis' mutations never run out of choices (gave_up).
    tp = draw(st.integers(min(min_tp, top), top))
    tiny = draw(st.tuples(*[st.integers(1, 9)] * top))[:tp]
    kind = draw(st.sampled_from(_SHARD_KINDS))
    base = draw(st.integers(7, 32)) if kind == "medium" else draw(st.integers(33, 128))
    jitter = draw(st.tuples(*[st.integers(0, 3)] * top))[:tp]
    shards = tiny if kind == "tiny" else tuple(base + j for j in jitter)
    shape = draw(st.sampled_from(_SHAPES))
    # Past bfloat16's exact integers (256): a token count kept in the
    # logits' dtype rounds (257 -> 256) only in cases this long. Rows are
    # nearly full valid prefixes, with a weight drawn like mask_rows'.
    long_seq = draw(st.integers(129, 160))
    long_rows = [(draw(st.integers(0, 8)), draw(st.sampled_from(MASK_SCALES))) for _ in range(2)]
    short_batch, short_seq = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    medium_batch = draw(st.integers(1, 4))
    medium_seq = draw(st.integers(-(-19 // medium_batch), 257 // medium_batch))
    rows = [tuple(draw(mask_rows(medium_seq if shape == "medium" else short_seq))) for _ in range(4)]
    if shape == "long":
        batch, seq = 2, long_seq
        mask = tuple(_long_row(seq, seq - cut, scale) for cut, scale in long_rows)
    elif shape == "medium":
        batch, seq = medium_batch, medium_seq
        mask = tuple(rows[:batch])
    else:
        batch, seq = short_batch, short_seq
        mask = tuple(rows[:batch])
    weights = draw(bin_weights((1, 4)))
    one_bin = draw(st.booleans())
    bin_index = draw(st.integers(0, len(weights) - 1))
    single_bin = bin_index if one_bin else None
    reduction: ReductionChoice = draw(reductions())
    tokens = batch * seq
    # Two all-reduces a tile and TP rank: at most 16 tiles in a large case.
    chunk = draw(st.integers(1 if tokens <= 32 else -(-tokens // 16), tokens + 2))
    small_blocks, per_tile = draw(st.booleans()), draw(st.integers(2, 4))
    block_elements = max(1, chunk // per_tile) * max(shards) if small_blocks else None
    return SoftCECase(
        shards=shards,
        mask=mask,
        token_chunk_size=chunk,
        dtype=draw(dtype_names(SOFT_CE_DTYPES)),
        bin_weights=weights,
        single_bin=single_bin,
        seed=draw(st.integers(0, 2**16)),
        reduction=reduction.model,
        reduction_seed=reduction.seed,
        teacher_neg_inf=draw(st.booleans()),
        overwrite=draw(st.booleans()),
        masked_nonfinite=draw(st.sampled_from(MASKED_NONFINITE)),
        block_elements=block_elements,
        cuda=draw(st.sampled_from(_ON_CUDA)),
    )


# About one case in six on emulated CUDA devices (each runs twice: it is
# compared bitwise with its CPU twin). Shrinks towards the CPU.
_ON_CUDA = (False, False, False, False, False, True)


# float32 maths from the same (rounded) inputs as the float64 reference. A
# token's CE is a difference ``logsumexp(s) - E_z[s]`` of two terms of size up
# to ``max|s| + log V``; float32 rounds each term (and the exp-sums behind
# them) a few times at 6e-8, so a numerator carries an absolute error of a few
# 1e-7 of ``sum_t mask_t (2 max|s_t| + log V)`` (its "term scale"), whatever
# its own size after cancellation: atol is 1e-6 of that. Gradients are a
# difference of two float32 softmaxes, times the token's upstream scale
# ``mask_t * g[bin_t]``: each softmax (at most 1) rounds at 6e-8, so atol is
# 1e-6 of the largest token scale, whatever the difference's own size (two
# near-equal softmaxes of 0.5 whose difference is 6e-4 carry an error of
# 1e-7, 2e-4 of the difference), and rtol 1e-4; bfloat16 only changes the returned gradient, rounded once
# to 8 significant bits (relative 2**-9; we allow 2**-7 and 4e-3 of the scale).
# float16 rounds the returned gradient once to 11 significant bits (relative
# 2**-11, allowed 2**-9 on top of float32's 1e-4) and, below its smallest
# normal number, to a multiple of 2**-24 (an absolute floor, GRAD_FLOOR).
# float64 inputs are computed in float64 (u = 1.1e-16): the same reasoning at
# float32's bounds scaled by 2**-29 would be 1e-14; we allow 1e-10 and 1e-12,
# still a million times tighter than float32's, so a float64 path that lost
# precision to float32 anywhere fails.
TOLERANCES = {
    "float32": {"numerators": (1e-5, 1e-6), "grad": (1e-4, 1e-6)},
    "bfloat16": {"numerators": (1e-5, 1e-6), "grad": (8e-3, 4e-3)},
    "float16": {"numerators": (1e-5, 1e-6), "grad": (1e-4 + 2.0**-9, 1e-6)},
    "float64": {"numerators": (1e-10, 1e-12), "grad": (1e-10, 1e-12)},
}
GRAD_FLOOR = {"float16": 2.0**-24}


def counts_rtol(case: SoftCECase) -> float:
    """Counts are float32 sums of mask values: each added token may round once
    (2**-24 relative), so a sum of n fractional values (0.1, 1.01) is off by up
    to about n * 2**-24. A count kept in bfloat16 is off by 2**-9 and more."""
    return 2.0**-23 * sum(len(row) for row in case.mask)


def _body(
    ctx, case: SoftCECase, tensors: dict[str, torch.Tensor], spoil_rank: int | None, on_cuda: bool = False
):
    start = sum(case.shards[: ctx.rank])
    columns = slice(start, start + case.shards[ctx.rank])
    group = ctx.groups.tp if case.tp > 1 else None
    if case.cuda and group is not None:
        # The TP group made by the program, NCCL on the device and gloo in
        # the CPU twin: the same calls in both, so even the shuffled
        # reduction order (seeded by a call's place) is the same.
        group = dist.new_group(ranks=list(range(case.tp)), backend="nccl" if on_cuda else "gloo")
    if on_cuda:
        # As a GPU job: the rank's device and its tensors there.
        torch.cuda.set_device(ctx.rank % torch.cuda.device_count())
        tensors = {name: t.cuda() for name, t in tensors.items()}
    leaf = tensors["student"][..., columns].clone().requires_grad_(True)
    student = leaf * 1 if case.overwrite else leaf  # overwriting needs a non-leaf
    arguments = dict(
        student_logits=student,
        teacher_logits=tensors["teacher"][..., columns].clone(),
        mask=tensors["mask"],
        tp_group=group,
        token_chunk_size=case.token_chunk_size,
        bin_ids=tensors["bins"],
        weights=tensors["weights"],
        overwrite_student_with_grad=case.overwrite,
    )
    if spoil_rank is not None:
        if ctx.rank == spoil_rank:
            _spoil(arguments, case.bad_input["kind"])
        try:
            soft_cross_entropy(**arguments)
        except (ValueError, TypeError) as error:
            return type(error).__name__, str(error)
        return None
    stats = soft_cross_entropy(**arguments)
    (stats.numerators * tensors["upstream"]).sum().backward()
    out = stats.numerators.detach(), stats.counts, leaf.grad
    if on_cuda:
        where = {str(t.device) for t in out}
        assert where == {f"cuda:{torch.cuda.current_device()}"}, f"results on {where}, not the rank's device"
        out = tuple(t.cpu() for t in out)
    return out


def _run(
    case: SoftCECase, tensors: dict[str, torch.Tensor], spoil_rank: int | None, on_cuda: bool = False
) -> list[Any]:
    choice = ReductionChoice(case.reduction, case.reduction_seed)
    emulate = {"cuda": "emulate"} if on_cuda else {}
    try:
        with case.blocks():
            return simdist.run(
                _body,
                layout=Layout(tp=case.tp),
                args=(case, tensors, spoil_rank, on_cuda),
                timeout=120.0,
                **choice.run_kwargs(),
                **emulate,
            )
    except simdist.SimulationError as error:
        raise AssertionError(
            f"soft_cross_entropy raised {type(error).__name__} (first failure: {error.__cause__!r}): {error}"
        ) from error


def _ratio(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, what: str) -> float:
    actual, expected = actual.to(torch.float64), expected.to(torch.float64)
    error = (actual - expected).abs()
    allowed = atol + rtol * expected.abs()
    ok = torch.isfinite(actual) == torch.isfinite(expected)
    worst = float((error / allowed).nan_to_num(float("inf")).max()) if error.numel() else 0.0
    if not bool(ok.all()) or worst > 1.0:
        raise AssertionError(
            f"{what}: error {worst:.3g}x the tolerance (rtol={rtol}, atol={atol:.3e}):\n"
            f"got      {actual.tolist()}\nexpected {expected.tolist()}"
        )
    return worst


def check_soft_ce(case: SoftCECase) -> float:
    """Runs the case and compares with the reference; returns the worst error / tolerance."""
    tensors = case.tensors()
    per_rank = _run(case, tensors, None, on_cuda=case.cuda)
    if case.cuda:
        # The emulated device computes what the CPU computes, bit for bit.
        for rank, (on_device, on_cpu) in enumerate(zip(per_rank, _run(case, tensors, None))):
            for name, a, b in zip(("numerators", "counts", "gradient"), on_device, on_cpu):
                assert torch.equal(a, b), f"TP rank {rank} {name}: emulated CUDA differs from the CPU"
    student64 = tensors["clean_student"].to(torch.float64).requires_grad_(True)
    ref = reference_stats(
        student64,
        tensors["teacher"].to(torch.float64),
        tensors["mask"],
        tensors["bins"],
        tensors["weights"],
        num_bins=len(case.bin_weights),
    )
    (ref.numerators * tensors["upstream"].to(torch.float64)).sum().backward()
    tol = TOLERANCES[case.dtype]
    student = tensors["clean_student"].to(torch.float64)
    per_token = 2 * student.abs().amax(dim=-1) + torch.log(torch.tensor(float(case.vocab_size)))
    scale = float((tensors["mask"].to(torch.float64) * per_token).sum()) or 1.0
    token_scale = (
        tensors["mask"].to(torch.float64) * tensors["upstream"].to(torch.float64)[tensors["bins"]]
    ).abs()
    grad_scale = float(student64.grad.abs().max())
    if case.dtype != "bfloat16":  # bfloat16's tolerance is its rounding of the gradient itself
        grad_scale = max(grad_scale, float(token_scale.max()))
    grad_scale = grad_scale or 1.0
    worst = 0.0
    for rank, (numerators, counts, grad) in enumerate(per_rank):
        rtol, atol = tol["numerators"]
        worst = max(
            worst,
            _ratio(numerators, ref.numerators.detach(), rtol, atol * scale, f"TP rank {rank} numerators"),
        )
        worst = max(worst, _ratio(counts, ref.counts, counts_rtol(case), 1e-6, f"TP rank {rank} counts"))
        start = sum(case.shards[:rank])
        expected = student64.grad[..., start : start + case.shards[rank]]
        rtol, atol = tol["grad"]
        floor = GRAD_FLOOR.get(case.dtype, 0.0)
        worst = max(
            worst, _ratio(grad, expected, rtol, atol * grad_scale + floor, f"TP rank {rank} gradient")
        )
    return worst


# ---------------------------------------------------------------- bad input

# Kind -> what the error says (on every TP rank alike).
SOFT_CE_BAD_INPUT = {
    "chunk_size_differs": "token_chunk_size",
    "chunk_size_zero": "token_chunk_size must be >= 1",
    "mask_differs": "mask values",
    "mask_negative": "mask values must be finite and >= 0",
    "bins_differ": "bin_ids values",
    "bin_out_of_range": "bin_ids must be < len(weights)",
    "weights_differ": "weights values",
    "weights_negative": "weights must be finite and >= 0",
    "student_dtype_differs": "student_logits dtype",
    "teacher_shape": "teacher_logits must have the shape of student_logits",
    "leading_shape_differs": "leading",
    "mask_shape": "mask must have the logits' leading shape",
    "overwrite_not_bool": "overwrite_student_with_grad must be a bool",
    "overwrite_leaf": "needs student_logits that the caller does not read",
    "overwrite_shares_teacher": "teacher_logits share storage with student_logits",
}


@st.composite
def soft_ce_bad_input_cases(draw: st.DrawFn) -> SoftCECase:
    # Disagreement needs a peer: at least two TP ranks.
    case = draw(soft_ce_cases(min_tp=2))
    assume(case.tp >= 2)  # only under --max-world-size 1: then every case gives up
    bad = {"kind": draw(st.sampled_from(tuple(SOFT_CE_BAD_INPUT))), "rank": draw(st.integers(0, case.tp - 1))}
    return replace(case, bad_input=bad)


def _spoil(arguments: dict[str, Any], kind: str) -> None:
    a = arguments
    if kind == "chunk_size_differs":
        a["token_chunk_size"] += 1
    elif kind == "chunk_size_zero":
        a["token_chunk_size"] = 0
    elif kind == "mask_differs":
        a["mask"] = a["mask"].clone()
        a["mask"].view(-1)[0] += 1.0
    elif kind == "mask_negative":
        a["mask"] = a["mask"].clone()
        a["mask"].view(-1)[-1] = -1.0
    elif kind == "bins_differ":
        a["bin_ids"] = a["bin_ids"].clone()
        if len(a["weights"]) == 1:  # one bin: make room for a second one
            a["weights"] = torch.cat([a["weights"], a["weights"]])
        a["bin_ids"].view(-1)[0] = (int(a["bin_ids"].view(-1)[0]) + 1) % len(a["weights"])
    elif kind == "bin_out_of_range":
        a["bin_ids"] = a["bin_ids"].clone()
        a["bin_ids"].view(-1)[0] = len(a["weights"])
    elif kind == "weights_differ":
        a["weights"] = a["weights"] + 1.0
    elif kind == "weights_negative":
        a["weights"] = a["weights"].clone()
        a["weights"][0] = -1.0
    elif kind == "student_dtype_differs":
        other = torch.float16 if a["student_logits"].dtype != torch.float16 else torch.float32
        a["student_logits"] = a["student_logits"].detach().to(other)
        a["overwrite_student_with_grad"] = False
    elif kind == "teacher_shape":
        a["teacher_logits"] = (
            a["teacher_logits"][..., :-1]
            if a["teacher_logits"].shape[-1] > 1
            else torch.cat([a["teacher_logits"], a["teacher_logits"]], dim=-1)
        )
    elif kind == "leading_shape_differs":
        vocab = a["student_logits"].shape[-1]
        # [batch, seq] tokens flattened to [tokens]: valid on its own, not what the peers pass.
        a["student_logits"] = a["student_logits"].reshape(-1, vocab)
        a["teacher_logits"] = a["teacher_logits"].reshape(-1, vocab)
        a["mask"] = a["mask"].reshape(-1)
        a["bin_ids"] = a["bin_ids"].reshape(-1)
    elif kind == "mask_shape":
        a["mask"] = torch.cat([a["mask"], a["mask"][:, :1]], dim=1)
    elif kind == "overwrite_not_bool":
        a["overwrite_student_with_grad"] = 1  # truthy, but not the documented bool
    elif kind == "overwrite_leaf":
        # The caller's own leaf (a parameter, say): overwriting it would clobber it.
        a["student_logits"] = a["student_logits"].detach().clone().requires_grad_(True)
        a["overwrite_student_with_grad"] = True
    elif kind == "overwrite_shares_teacher":
        # A teacher that is the student's own storage (a self-distillation shortcut).
        leaf = a["student_logits"].detach().clone().requires_grad_(True)
        a["student_logits"] = leaf * 1
        a["teacher_logits"] = a["student_logits"].detach()
        a["overwrite_student_with_grad"] = True
    else:
        raise ValueError(
            f"unknown soft_cross_entropy bad-input kind {kind!r}; expected one of {tuple(SOFT_CE_BAD_INPUT)}"
        )


def run_soft_ce_bad_input(case: SoftCECase) -> None:
    """Every TP rank raises one identical ValueError/TypeError naming the problem."""
    outcomes = _run(case, case.tensors(), case.bad_input["rank"], on_cuda=case.cuda)
    kind = case.bad_input["kind"]
    for rank, outcome in enumerate(outcomes):
        assert outcome is not None, (
            f"TP rank {rank} did not raise although rank {case.bad_input['rank']} had {kind}"
        )
        assert outcome == outcomes[0], (
            f"TP ranks raised different errors: rank 0 {outcomes[0]}, rank {rank} {outcome}"
        )
    name, message = outcomes[0]
    assert SOFT_CE_BAD_INPUT[kind] in message, (
        f"{kind}: expected the error to say {SOFT_CE_BAD_INPUT[kind]!r}, got {name}: {message}"
    )
