"""A catalogue of realistic bugs in draft_loss, for measuring what the fuzz properties catch.

Each mutant is a function that monkeypatches the real modules and returns a
callable that undoes the patch. ``DRAFT_LOSS_MUTANT=<name>`` makes
``tests/fuzz/conftest.py`` apply one for a whole session (``apply_from_environment``),
so a campaign can be run against it in its own process; ``applied(name)``
is the same as a context manager. They complement the four mutants of
``tests/test_mutants.py`` (local draft counts, a skipped PP norm collective,
correction before scaling, an abort that forgets).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from draft_loss import _validation as validation
from draft_loss import grads, projected, soft_ce, stats, step_state
from draft_loss.cotrain import agreement, batch, commit, model, sgd, worker

Undo = Callable[[], None]
MUTANTS: dict[str, Callable[[], Undo]] = {}
ENV_VAR = "DRAFT_LOSS_MUTANT"


def _mutant(fn: Callable[[], Undo]) -> Callable[[], Undo]:
    MUTANTS[fn.__name__] = fn
    return fn


def _patch(*replacements: tuple[Any, str, Any]) -> Undo:
    """Sets each ``(owner, attribute, value)``; the returned callable restores them."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in replacements]
    for owner, name, value in replacements:
        setattr(owner, name, value)

    def undo() -> None:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)

    return undo


# ------------------------------------------------------------- soft_ce maths


@_mutant
def tp_max_local() -> Undo:
    """The TP max all-reduce of the logits is skipped: each rank shifts by its
    own shard's maximum, so the ranks' exp-sums are on different scales."""
    original = soft_ce.TilePlan.all_reduce

    def all_reduce(self, values, op):
        if op == dist.ReduceOp.MAX:
            return
        original(self, values, op)

    return _patch((soft_ce.TilePlan, "all_reduce", all_reduce))


@_mutant
def last_partial_chunk_dropped() -> Undo:
    """Tiles are ``range(0, T - chunk + 1, chunk)``: a last partial tile is never
    computed (its tokens' CE stays 0) when T is not a multiple of the chunk."""
    original = soft_ce.TilePlan.tiles

    def tiles(self, num_tokens):
        full = original(self, num_tokens)
        return full[:-1] if len(full) > 1 and full[-1].stop - full[-1].start < self.chunk else full

    class _Torch:
        """soft_ce's view of torch, with CE buffers zero-initialised, so the
        tokens of the dropped tile deterministically add nothing."""

        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*args, **kwargs):
            return torch.zeros(*args, **kwargs)

    return _patch((soft_ce.TilePlan, "tiles", tiles), (soft_ce, "torch", _Torch()))


@_mutant
def numerators_in_bf16() -> Undo:
    """Per-bin numerators are accumulated in bfloat16 (an autocast-style
    "save memory" change): each token's contribution is rounded to 8 bits."""

    def masked_numerators(ce, tokens):
        contributions = torch.where(tokens.mask != 0, tokens.mask * ce, torch.zeros_like(ce))
        numerators = torch.zeros(tokens.num_bins, dtype=torch.bfloat16, device=ce.device)
        numerators.index_add_(0, tokens.bins, contributions.to(torch.bfloat16))
        return numerators.to(tokens.compute_dtype)

    return _patch((soft_ce, "masked_numerators", masked_numerators))


@_mutant
def counts_on_the_host() -> Undo:
    """Per-bin counts are allocated without a device (on the host), a bug only
    CUDA shows: on a GPU (or an emulated one) adding the device's mask into
    them raises; on the CPU nothing changes."""

    def bin_counts(tokens):
        counts = torch.zeros(tokens.num_bins, dtype=tokens.compute_dtype)
        return counts.index_add_(0, tokens.bins, tokens.mask)

    return _patch((soft_ce, "bin_counts", bin_counts))


@_mutant
def teacher_not_aligned() -> Undo:
    """The mask is rolled left for the draft but the teacher logits are not:
    draft position t learns the policy's distribution at t instead of t+1."""
    original = model.align_for_draft

    def align(teacher_logits, token_mask):
        _, mask = original(teacher_logits, token_mask)
        return teacher_logits.detach(), mask

    return _patch((model, "align_for_draft", align))


@_mutant
def tp_agreement_skipped() -> Undo:
    """A rank whose own arguments are bad raises at once instead of first
    joining the TP agreement: its peers wait in a collective it never joins."""
    original = validation.validate_on_every_rank

    def validate(tp_group, group_size, what, check):
        check()  # raises locally on bad input, before any exchange
        return original(tp_group, group_size, what, check)

    return _patch((soft_ce.v, "validate_on_every_rank", validate))


# ------------------------------------------------------------- counts, weights


@_mutant
def counts_kept_in_bf16() -> Undo:
    """Per-bin token counts are accumulated in bfloat16 (a "save memory"
    change): each token's add rounds, so a bin's count sticks at 256 (257
    rounds back to 256) and weighted counts (mask values such as 0.1) drift."""

    def bin_counts(tokens):
        counts = torch.zeros(tokens.num_bins, dtype=torch.bfloat16, device=tokens.mask.device)
        counts.index_add_(0, tokens.bins, tokens.mask.to(torch.bfloat16))
        return counts.to(tokens.compute_dtype)

    return _patch((soft_ce, "bin_counts", bin_counts), (projected, "bin_counts", bin_counts))


@_mutant
def counts_before_alignment() -> Undo:
    """The monolithic path's draft counts are taken from the mask and bins
    before the alignment roll (``mask`` instead of ``mask[:, 1:]``)."""

    def draft_counts(self, local_batch):
        return torch.bincount(
            local_batch.bin_ids.reshape(-1),
            weights=local_batch.mask.reshape(-1).to(torch.float64),
            minlength=self.config.num_bins,
        ).to(torch.float64)

    return _patch((worker.CotrainWorker, "_draft_counts", draft_counts))


@_mutant
def weights_on_counts_only() -> Undo:
    """The normalised loss weights the counts but not the numerators:
    ``sum(num) / sum(w * C)``."""

    def normalized(self, normalization_counts=None):
        counts = self.counts if normalization_counts is None else normalization_counts
        counts = counts.to(self.numerators.dtype)
        denominator = (self.weights * counts).sum()
        has_tokens = denominator > 0
        safe = torch.where(has_tokens, denominator, torch.ones_like(denominator))
        quotient = self.numerators.sum() / safe
        return torch.where(has_tokens, quotient, torch.zeros_like(quotient))

    return _patch((stats.DraftLossStats, "normalized", normalized))


@_mutant
def zero_count_divides() -> Undo:
    """The zero-count guard is gone: a step whose weighted draft count is 0
    divides 0 by 0 and the NaN reaches the gradients."""

    def normalized(self, normalization_counts=None):
        counts = self.counts if normalization_counts is None else normalization_counts
        counts = counts.to(self.numerators.dtype)
        return (self.weights * self.numerators).sum() / (self.weights * counts).sum()

    return _patch((stats.DraftLossStats, "normalized", normalized))


@_mutant
def correction_inverted() -> Undo:
    """The draft correction multiplies by ``d / n`` instead of ``n / d``."""
    original = step_state.DraftStepState.correct_main_grads

    def correct(self, params):
        params = list(params)
        factor = original(self, params)  # applied n / d
        if factor:
            for p in params:
                if grads.parameter_group(p) == "draft":
                    p.main_grad.mul_(1.0 / (factor * factor))  # now d / n
        return factor

    return _patch((step_state.DraftStepState, "correct_main_grads", correct))


# ------------------------------------------------------------------ gradients


@_mutant
def replicated_param_counted_twice() -> Undo:
    """The grad norm counts TP-replicated parameters on every TP rank (as if
    they were sharded), inflating their share by the TP size."""

    def is_tensor_parallel(param):
        grads.parameter_group(param)  # still refuses untagged parameters
        return True

    return _patch((grads, "is_tensor_parallel", is_tensor_parallel))


@_mutant
def grad_norm_without_pp_reduction() -> Undo:
    """Every stage forgets the PP all-reduce of the squared norms: each reports
    (and clips by) its own stages' norm only."""
    original = grads.group_grad_norms

    def norms(params, *, tp_group, pp_group, **rest):
        return original(params, tp_group=tp_group, pp_group=None, **rest)

    return _patch((grads, "group_grad_norms", norms))


@_mutant
def dp_gradients_averaged() -> Undo:
    """The DP gradient all-reduce averages (DDP's default) while the loss is
    already normalised by the DP-global count: gradients shrink by 1/dp."""
    original = worker.CotrainWorker._all_reduce_gradients

    def all_reduce(self, params):
        original(self, params)
        dp = self.groups.size("dp")
        for p in params:
            p.main_grad.div_(dp)

    return _patch((worker.CotrainWorker, "_all_reduce_gradients", all_reduce))


@_mutant
def clip_by_global_norm() -> Undo:
    """Both groups are clipped by the combined norm of policy and draft
    instead of each by its own."""
    original = grads.clip_by_group_norms

    def clip(params, norms, max_norms, eps=1e-6):
        total = torch.sqrt(sum(value.to(torch.float64) ** 2 for value in norms.values()))
        return original(params, {name: total for name in norms}, max_norms, eps)

    return _patch((commit, "clip_by_group_norms", clip))


@_mutant
def last_microbatch_dropped() -> Undo:
    """Off by one in the accumulation loop: the split step skips its last
    microbatch (the monolithic step, and the counts, still see every row)."""
    original = worker.split_batch

    def split(whole, parts):
        pieces = original(whole, parts)
        return pieces[:-1] if len(pieces) > 1 else pieces

    return _patch((worker, "split_batch", split))


# ------------------------------------------------------------ abort and retry


@_mutant
def reset_forgotten_after_second_microbatch() -> Undo:
    """``abort`` resets the phase but keeps the accumulated sums once two
    microbatches are in: a retry after a failure past microbatch 1 adds them twice."""
    original = step_state.DraftStepState.abort

    def abort(self):
        if self._num_microbatches >= 2:
            self._phase = step_state.StepPhase.IDLE
            self._num_microbatches = 0
            return
        original(self)

    return _patch((step_state.DraftStepState, "abort", abort))


@_mutant
def optimizer_not_transactional() -> Undo:
    """The optimizer stores each momentum buffer as it computes it, in
    ``prepare``: a step that fails later leaves momentum that a retry adds again."""

    def prepare(self, params, grads_, probe=None):
        values, buffers = {}, {}
        for index, (name, param) in enumerate(params.items()):
            if probe is not None:
                probe(f"optimizer:{index}")
            update = grads_[name] + self.weight_decay * param
            previous = self.buffers.get(name)
            buffer = update if previous is None else self.momentum * previous + update
            self.buffers[name] = buffers[name] = buffer  # the bug: stored before the commit
            values[name] = param - self.lr * buffer
        return sgd.PreparedStep(values, buffers)

    return _patch((sgd.MomentumSGD, "prepare", prepare))


@_mutant
def validation_not_agreed() -> Undo:
    """``train_step`` raises a rank's own argument error before the ranks agree:
    peers of a rank with a bad batch wait for it in their first collective."""

    def validate(self, step_batch, mode, num_microbatches):
        batch.check_step_arguments(step_batch, mode, num_microbatches, self.config)
        agreement.all_ranks_ok(True)

    return _patch((worker.CotrainWorker, "_validate", validate))


# ------------------------------------------------------------------- applying


def apply(name: str) -> Undo:
    """Applies the mutant called ``name``; returns its undo.

    ``FILE.py:NAME`` applies mutant ``NAME`` of another catalogue, a Python
    file with a ``MUTANTS`` dict of the same kind as this one's: a set of
    mutants kept out of this repository, so that nobody tunes the campaign
    to them, is measured through the same switch."""
    path, sep, inner = name.rpartition(":")
    if sep and path.endswith(".py"):
        return _external_catalogue(path)(inner)()
    try:
        mutant = MUTANTS[name]
    except KeyError:
        raise ValueError(
            f"unknown draft_loss mutant {name!r}; valid names: {', '.join(sorted(MUTANTS))}"
        ) from None
    return mutant()


def _external_catalogue(path: str) -> Callable[[str], Callable[[], Undo]]:
    import importlib.util

    file = os.path.abspath(path)
    if not os.path.isfile(file):
        raise ValueError(f"{ENV_VAR}: no mutant catalogue at {path!r} (FILE.py:NAME names a file)")
    spec = importlib.util.spec_from_file_location("draft_loss_external_mutants", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    catalogue: dict[str, Callable[[], Undo]] = getattr(module, "MUTANTS", {})

    def find(inner: str) -> Callable[[], Undo]:
        if inner not in catalogue:
            raise ValueError(
                f"unknown draft_loss mutant {inner!r} in {path}; valid names: {', '.join(sorted(catalogue))}"
            )
        return catalogue[inner]

    return find


@contextlib.contextmanager
def applied(name: str) -> Iterator[None]:
    undo = apply(name)
    try:
        yield
    finally:
        undo()


def apply_from_environment() -> Undo | None:
    """Applies the mutant named by ``DRAFT_LOSS_MUTANT`` (none when unset or empty)."""
    name = os.environ.get(ENV_VAR, "").strip()
    return apply(name) if name else None
