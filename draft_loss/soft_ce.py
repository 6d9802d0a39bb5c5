"""Vocab-parallel soft cross-entropy between draft (student) and policy (teacher) logits.

Per token t, with the vocabulary sharded over the TP group:

    CE_t = logsumexp(s_t) - sum_v softmax(z_t)_v * s_t,v

Maxima and sums are all-reduced over the TP group (two small all-reduces per
token tile, none in backward). The gradient w.r.t. s_t is
``(softmax(s_t) - softmax(z_t)) * scale_t`` with ``scale_t = mask_t *
dL/dnumerator[bin_t]``.

Two paths, chosen by ``token_chunk_size``:

* cached (all T tokens fit in one tile): ``softmax(s) - softmax(z)`` is computed
  once in forward, in float32, and kept for backward;
* streaming: tiles of ``token_chunk_size`` tokens (two small all-reduces per
  tile); forward keeps only the two per-token log-normalisers, backward
  recomputes both softmaxes. Inside a tile the float32 vocabulary work runs
  over blocks of ``min(token_chunk_size, 2**20 // V_local)`` rows in two
  reused buffers, so it stays within one tile (and within a few MiB, however
  large the tile): apart from the ``[T, V_local]`` gradient that backward must
  return, the working memory does not grow with T.

Non-finite logits (the chosen behaviour; no exception is raised for them):

* a teacher logit of -inf means probability 0 and is handled exactly, also
  when it fills a rank's whole shard (a token needs one finite teacher logit
  somewhere in the full vocabulary);
* any other non-finite logit (NaN or +-inf in the student, NaN or +inf in the
  teacher, a teacher row that is -inf everywhere) in a token whose mask is
  non-zero makes that token's CE NaN or +inf, so the numerator of its bin and
  the normalised loss are non-finite, on every TP rank alike: a guard such as
  ``torch.isfinite(stats.numerators).all()`` sees it. The gradient rows of such
  tokens are non-finite too (a grad-norm guard sees them), except for a -inf
  student logit, whose gradient ``softmax(s) - softmax(z)`` stays finite;
* tokens whose mask is 0 never contribute: their numerator terms and gradient
  rows are exactly 0 even when their logits are non-finite (padding may hold
  garbage).

With ``overwrite_student_with_grad=True`` backward writes the gradient into the
student logits' own storage and returns that storage as the gradient (as
Megatron's vocab-parallel cross-entropy reuses its logits buffer), so neither
path allocates a second ``[T, V_local]`` tensor in backward; the gradient is
bit for bit the one of the default mode. See ``soft_cross_entropy`` for when
this is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from . import _validation as v
from .stats import DraftLossStats

_WHAT = "soft_cross_entropy"


def soft_cross_entropy(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    tp_group: dist.ProcessGroup | None,
    token_chunk_size: int,
    bin_ids: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    overwrite_student_with_grad: bool = False,
) -> DraftLossStats:
    """Binned soft cross-entropy statistics of ``student_logits`` against ``teacher_logits``.

    Args:
        student_logits: ``[..., V_local]`` draft logits (float16/bfloat16/float32;
            float64 is computed in float64, for verification). This rank's
            vocabulary shard; shards may be of unequal sizes across TP ranks.
        teacher_logits: same shape; treated as detached.
        mask: ``[...]`` bool, integer or float token weights (finite, >= 0);
            identical on every TP rank.
        tp_group: the tensor-parallel group the vocabulary is sharded over,
            or None for no tensor parallelism.
        token_chunk_size: tokens per tile; if all tokens fit in one tile the
            cached path is used, otherwise the streaming one.
        bin_ids: ``[...]`` integer bin of each token (None: every token in bin 0).
        weights: ``[num_bins]`` non-negative bin weights (None: ones). When
            given, its length fixes the number of bins; otherwise it is
            ``max(bin_ids) + 1``.
        overwrite_student_with_grad: DESTROYS ``student_logits``. When True,
            backward writes the gradient into the student logits' storage and
            returns that very tensor as their gradient, instead of allocating
            a fresh ``[T, V_local]`` one (1 GiB at T=4096, V=131072 in bf16).
            Values and gradients are bit for bit those of the default mode.
            Only for callers that never read the student logits after
            backward, e.g. logits made by an LM head whose backward needs only
            its input and weight. After backward ``student_logits`` hold the
            gradient (a hook registered on them receives their own storage;
            ``retain_grad()`` keeps a copy, a fresh ``[T, V_local]`` tensor);
            before backward they are untouched. Refused (ValueError, on every
            TP rank together) when ``student_logits`` are, or are a view of, a
            leaf tensor that requires grad (its value is the caller's state
            and ``.grad`` would alias it), and when ``teacher_logits`` share
            storage with them. Detected in backward (RuntimeError, on the
            rank where it happens): the logits were changed in place after
            forward, or a second backward runs through the loss (the first
            one has overwritten them). Not detectable, so the caller must not do it: reading the
            logits after backward, or using them in another loss or op of the
            same graph; autograd's own version check raises when that other
            op saved them and its backward runs after this one, but if its
            backward runs first the result is right, and nothing tells which.
            Logits that are not contiguous are first copied (in forward) and
            the copy receives the gradient, so the caller's tensor is then
            left as it was.

    Returns:
        ``DraftLossStats`` whose numerators are differentiable w.r.t.
        ``student_logits`` (gradients come back in the student's dtype).

    Raises ValueError/TypeError naming the bad argument; under TP every rank of
    the group raises the same error when any rank's arguments are bad.
    """
    group_size = v.check_group(tp_group, _WHAT)

    def check() -> tuple[v.TokenInputs, v.Header]:
        return _check_arguments(
            student_logits,
            teacher_logits,
            mask,
            token_chunk_size,
            bin_ids,
            weights,
            overwrite_student_with_grad,
        )

    tokens = v.validate_on_every_rank(tp_group, group_size, _WHAT, check)
    vocab = student_logits.shape[-1]
    plan = TilePlan(tokens, tp_group, group_size, token_chunk_size)
    student = student_logits.reshape(-1, vocab)
    if overwrite_student_with_grad and not student.is_contiguous():
        # A view with overlapping rows (stride 0) would have gradient rows
        # written over each other; a contiguous copy has no overlap.
        student = student.contiguous()
    numerators = _SoftCrossEntropy.apply(
        student, teacher_logits.detach().reshape(-1, vocab), plan, bool(overwrite_student_with_grad)
    )
    return DraftLossStats(numerators, bin_counts(tokens), tokens.weights)


def _check_arguments(
    student: object,
    teacher: object,
    mask: object,
    token_chunk_size: object,
    bin_ids: object,
    weights: object,
    overwrite: object,
) -> tuple[v.TokenInputs, v.Header]:
    student = v.check_floating("student_logits", student, _WHAT)
    teacher = v.check_floating("teacher_logits", teacher, _WHAT)
    if teacher.shape != student.shape:
        raise ValueError(
            f"{_WHAT}: teacher_logits must have the shape of student_logits {tuple(student.shape)}, "
            f"got {tuple(teacher.shape)}"
        )
    if student.shape[-1] < 1:
        raise ValueError(f"{_WHAT}: the vocabulary shard (last dim of the logits) must be >= 1, got 0")
    v.check_same_device("teacher_logits", teacher, student.device, "student_logits", _WHAT)
    chunk = v.check_chunk_size(token_chunk_size, _WHAT)
    _check_overwrite(overwrite, student, teacher)
    leading = tuple(student.shape[:-1])
    compute_dtype = torch.float64 if student.dtype == torch.float64 else torch.float32
    tokens = v.check_token_inputs(
        _WHAT, leading, student.device, "student_logits", mask, bin_ids, weights, compute_dtype
    )
    header: v.Header = (
        (v.FUNCTION_FIELD, 1),
        ("number of leading dims", len(leading)),
        ("leading shape (digest)", v.shape_digest(leading)),
        ("number of tokens", int(torch.Size(leading).numel())),
        ("student_logits dtype", v.dtype_code(student.dtype)),
        ("teacher_logits dtype", v.dtype_code(teacher.dtype)),
        ("token_chunk_size", chunk),
    )
    return tokens, header + tokens.header


def _check_overwrite(overwrite: object, student: torch.Tensor, teacher: torch.Tensor) -> None:
    """What can be told in forward about whether overwriting the student logits is safe."""
    if not isinstance(overwrite, bool):
        raise TypeError(
            f"{_WHAT}: overwrite_student_with_grad must be a bool, got {type(overwrite).__name__}"
        )
    if not overwrite:
        return
    # Views share their base's storage: a view of a parameter-like leaf would
    # clobber the parameter itself.
    root = student if student._base is None else student._base
    if root.is_leaf and root.requires_grad:
        which = "are a leaf tensor" if root is student else "are a view of a leaf tensor"
        raise ValueError(
            f"{_WHAT}: overwrite_student_with_grad=True needs student_logits that the caller does not read "
            f"after backward, but student_logits {which} that requires grad (shape {tuple(root.shape)}): "
            f"their values would be replaced by the gradient and their .grad would alias them; pass the "
            f"output of the op that computes the logits, or use overwrite_student_with_grad=False"
        )
    if (
        student.numel() > 0
        and teacher.numel() > 0
        and student.untyped_storage().data_ptr() == teacher.untyped_storage().data_ptr()
    ):
        raise ValueError(
            f"{_WHAT}: overwrite_student_with_grad=True, but teacher_logits share storage with student_logits: "
            f"writing the gradient into the student would overwrite the teacher that backward still reads; "
            f"pass a copy of the teacher or use overwrite_student_with_grad=False"
        )


# ------------------------------------------------------------------ shared maths

# Within a streaming tile, float32 vocabulary work runs over blocks of rows of
# about this many elements (4 MiB in float32): small enough to stay in cache
# and far below one tile, big enough that per-op overhead does not show.
BLOCK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class TilePlan:
    """What the autograd Functions need besides the logits.

    A tile (``chunk`` tokens) is the unit of communication: two small
    all-reduces per tile in forward, none in backward.
    """

    tokens: v.TokenInputs
    group: dist.ProcessGroup | None
    group_size: int
    chunk: int

    def tiles(self, num_tokens: int) -> list[slice]:
        return _ranges(0, num_tokens, self.chunk)

    def block_rows(self, vocab: int) -> int:
        return max(1, min(self.chunk, BLOCK_ELEMENTS // max(vocab, 1)))

    def all_reduce(self, values: torch.Tensor, op: Any) -> None:
        if self.group is not None and self.group_size > 1:
            dist.all_reduce(values, op=op, group=self.group)


def _ranges(start: int, stop: int, step: int) -> list[slice]:
    return [slice(first, min(first + step, stop)) for first in range(start, stop, step)]


@dataclass
class TileResult:
    ce: torch.Tensor  # [n]
    lse_student: torch.Tensor  # [n]
    lse_teacher: torch.Tensor  # [n]
    probability_difference: torch.Tensor | None  # [n, V_local], softmax(s) - softmax(z), cached path only


class Workspace:
    """Reused ``[rows, V_local]`` buffers in the compute dtype: a fresh large
    allocation per block would page-fault (CPU) or churn the caching allocator
    (GPU) every time."""

    def __init__(self, rows: int, vocab: int, dtype: torch.dtype, device: torch.device) -> None:
        self.rows = rows
        self.dtype = dtype
        self._shape = (rows, vocab)
        self._device = device
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, rows: int) -> torch.Tensor:
        if name not in self._buffers:
            self._buffers[name] = torch.empty(self._shape, dtype=self.dtype, device=self._device)
        return self._buffers[name][:rows]


def tile_forward(
    student: torch.Tensor, teacher: torch.Tensor, plan: TilePlan, workspace: Workspace, keep: bool
) -> TileResult:
    """CE and log-normalisers of one tile of tokens, reduced over the TP group.

    ``keep`` (cached path) also returns ``softmax(s) - softmax(z)``; the
    workspace must then hold the whole tile. Otherwise the vocabulary work runs
    block by block through the workspace, whatever the tile size.
    """
    compute = plan.tokens.compute_dtype
    rows = student.shape[0]
    # Maxima straight from the input dtype: exact, and no float32 copy needed.
    maxima = torch.stack((student.amax(dim=-1).to(compute), teacher.amax(dim=-1).to(compute)))
    plan.all_reduce(maxima, dist.ReduceOp.MAX)
    max_s, max_z = maxima[0], maxima[1]

    sums = torch.empty(3, rows, dtype=compute, device=student.device)  # sum exp(s), sum exp(z), dot
    kept: list[torch.Tensor] = []
    for block in _ranges(0, rows, workspace.rows):
        kept = _block_sums(
            student[block], teacher[block], max_s[block], max_z[block], workspace, sums[:, block], keep
        )
    plan.all_reduce(sums, dist.ReduceOp.SUM)
    total_s, total_z, dot = sums[0], sums[1], sums[2]

    lse_s = max_s + total_s.log()
    lse_z = max_z + total_z.log()
    ce = lse_s - dot / total_z
    difference = None
    if keep:
        exp_s, exp_z = kept
        difference = exp_s.mul_(total_s.reciprocal()[:, None]).sub_(exp_z.mul_(total_z.reciprocal()[:, None]))
    return TileResult(ce, lse_s, lse_z, difference)


def _block_sums(
    student: torch.Tensor,
    teacher: torch.Tensor,
    max_s: torch.Tensor,
    max_z: torch.Tensor,
    workspace: Workspace,
    out: torch.Tensor,
    keep: bool,
) -> list[torch.Tensor]:
    """Writes ``sum exp(s - max_s)``, ``sum exp(z - max_z)`` and ``sum exp(z - max_z) * s``
    of a block of rows into ``out[0..2]``. Every elementwise op runs in place on
    same-dtype buffers: on CPU a mixed-dtype op (bf16 with float32) is many times
    slower than a copy followed by it."""
    rows = student.shape[0]
    private_student = student.dtype != workspace.dtype
    s = workspace.get("student", rows).copy_(student) if private_student else student
    exp_z = workspace.get("teacher", rows).copy_(teacher).sub_(max_z[:, None]).exp_()
    out[1] = exp_z.sum(dim=-1)
    kept_exp_z = exp_z.clone() if keep else exp_z
    out[2] = exp_z.mul_(s).sum(dim=-1)  # the teacher buffer is free afterwards
    if private_student:
        exp_s = s.sub_(max_s[:, None]).exp_()
    else:
        exp_s = torch.sub(s, max_s[:, None], out=workspace.get("teacher", rows)).exp_()
    out[0] = exp_s.sum(dim=-1)
    return [exp_s, kept_exp_z]


def write_scaled_difference(
    student: torch.Tensor,
    teacher: torch.Tensor,
    lse_s: torch.Tensor,
    lse_z: torch.Tensor,
    scale: torch.Tensor,
    workspace: Workspace,
    out: torch.Tensor,
) -> None:
    """``out = (softmax(s) - softmax(z)) * scale`` for a tile, recomputed block by
    block from the saved log-normalisers (``out`` may have another dtype)."""
    for block in _ranges(0, student.shape[0], workspace.rows):
        rows = block.stop - block.start
        p_s = _shifted_exp(student[block], lse_s[block], workspace.get("student", rows))
        p_z = _shifted_exp(teacher[block], lse_z[block], workspace.get("teacher", rows))
        out[block] = p_s.sub_(p_z).mul_(scale[block, None])


def _shifted_exp(values: torch.Tensor, shift: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    if values.dtype == out.dtype:
        torch.sub(values, shift[:, None], out=out)
    else:
        out.copy_(values).sub_(shift[:, None])
    return out.exp_()


def zero_masked_rows(gradient: torch.Tensor, mask: torch.Tensor) -> None:
    """Masked-out tokens contribute exactly nothing, even if their logits were non-finite."""
    masked = (mask == 0).nonzero().reshape(-1)
    if masked.numel():
        gradient.index_fill_(0, masked, 0)


def masked_numerators(ce: torch.Tensor, tokens: v.TokenInputs) -> torch.Tensor:
    contributions = torch.where(tokens.mask != 0, tokens.mask * ce, torch.zeros_like(ce))
    numerators = torch.zeros(tokens.num_bins, dtype=tokens.compute_dtype, device=ce.device)
    return numerators.index_add_(0, tokens.bins, contributions)


def bin_counts(tokens: v.TokenInputs) -> torch.Tensor:
    counts = torch.zeros(tokens.num_bins, dtype=tokens.compute_dtype, device=tokens.mask.device)
    return counts.index_add_(0, tokens.bins, tokens.mask)


def token_scale(tokens: v.TokenInputs, grad_numerators: torch.Tensor) -> torch.Tensor:
    """d(numerators)/d(CE_t) times the upstream gradient: ``mask_t * g[bin_t]``."""
    return tokens.mask * grad_numerators.to(tokens.compute_dtype)[tokens.bins]


# ---------------------------------------------------------------- autograd


class _SoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, student: torch.Tensor, teacher: torch.Tensor, plan: TilePlan, overwrite: bool
    ) -> torch.Tensor:
        num_tokens, vocab = student.shape
        tokens = plan.tokens
        tiles = plan.tiles(num_tokens)
        cached = len(tiles) == 1
        workspace_rows = num_tokens if cached else plan.block_rows(vocab)
        workspace = Workspace(workspace_rows, vocab, tokens.compute_dtype, student.device)
        ce = torch.empty(num_tokens, dtype=tokens.compute_dtype, device=student.device)
        lse_s = torch.empty_like(ce)
        lse_z = torch.empty_like(ce)
        difference = None
        for tile in tiles:
            result = tile_forward(student[tile], teacher[tile], plan, workspace, keep=cached)
            ce[tile], lse_s[tile], lse_z[tile] = result.ce, result.lse_student, result.lse_teacher
            difference = result.probability_difference
        ctx.plan = plan
        ctx.overwrite = overwrite
        if cached:
            # The student itself only as the destination of the gradient;
            # saving it also makes autograd track its version.
            if overwrite:
                ctx.save_for_backward(difference, student)
            else:
                ctx.save_for_backward(difference)
        else:
            ctx.save_for_backward(student, teacher, lse_s, lse_z)
        ctx.cached = cached
        ctx.student_dtype = student.dtype
        ctx.shape = (num_tokens, vocab)
        return masked_numerators(ce, tokens)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_numerators: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        plan: TilePlan = ctx.plan
        tokens = plan.tokens
        scale = token_scale(tokens, grad_numerators)
        num_tokens, vocab = ctx.shape
        saved = _unpack(ctx)
        if ctx.cached and ctx.overwrite:
            difference, gradient = saved
            # The same two roundings as below (product in float32, then the
            # cast), done in buffers that already exist.
            gradient.copy_(difference.mul_(scale[:, None]))
        elif ctx.cached:
            (difference,) = saved
            gradient = (difference * scale[:, None]).to(ctx.student_dtype)
        else:
            student, teacher, lse_s, lse_z = saved
            if ctx.overwrite:
                # Each row block is read into the workspace before its
                # gradient is written over it, and blocks are disjoint.
                gradient = student
            else:
                gradient = torch.empty((num_tokens, vocab), dtype=ctx.student_dtype, device=student.device)
            workspace = Workspace(plan.block_rows(vocab), vocab, tokens.compute_dtype, student.device)
            write_scaled_difference(student, teacher, lse_s, lse_z, scale, workspace, gradient)
        zero_masked_rows(gradient, tokens.mask)
        return gradient, None, None, None


def _unpack(ctx: Any) -> tuple[torch.Tensor, ...]:
    try:
        return ctx.saved_tensors
    except RuntimeError as exc:
        if not ctx.overwrite or "modified by an inplace operation" not in str(exc):
            raise
        raise RuntimeError(
            f"{_WHAT}: overwrite_student_with_grad=True, but the logits saved for backward changed between "
            f"forward and this backward: the student (or teacher) logits were modified in place, or this is a "
            f"second backward through the loss "
            f"(the first one replaced them with the gradient); retain_graph and repeated backward need "
            f"overwrite_student_with_grad=False"
        ) from exc
