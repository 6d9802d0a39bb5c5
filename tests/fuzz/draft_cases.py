"""Fuzz cases of the co-training step: plain data in, tensors built deterministically.

A ``DraftCase`` holds only ints, floats, strings, bools and nested tuples, so
its JSON form is a readable record of the layout, the token distribution per
DP rank and microbatch, the dtype, the reduction model and the fault; every
tensor (tokens, bins, initial parameters) is rebuilt from its seeds on replay.
``draft_cases`` draws them; each choice lists its simplest option first, so a
failure shrinks towards one rank, one microbatch and fully valid 0/1 masks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from cotrain_faults import fault_points
from hypothesis import strategies as st

from draft_loss.cotrain import CotrainBatch, CotrainConfig
from simdist import Layout
from simdist.strategies import (
    REDUCTION_NAMES,
    ReductionChoice,
    bin_weights,
    campaign_max_world_size,
    dtype_names,
    fault_from_json,
    fault_to_json,
    faults,
    layouts,
    probe_faults,
    reductions,
    sequence_lengths,
    token_distributions,
)

# CotrainWorker accepts cp > 1 (load-balanced shards, draft_loss.context_parallel):
# layouts draw cp too and every property runs on it. False leaves cp at 1.
CP_SUPPORTED = True

HIDDEN_SIZE = 8
FFN_SIZE = 12  # divisible by every TP degree 1..4, as CotrainWorker requires
NUM_LAYERS = 2
MAX_SEQ_LEN = 6
LONG_SEQ_LEN = (129, 320)
# With clipping on, limits far below the grad norms of this tiny model, so the
# clip is active whenever a group has any gradient.
CLIP_NORMS = {"policy_max_grad_norm": 0.05, "draft_max_grad_norm": 0.02}


def max_world_size() -> int:
    """The campaign's world-size bound: ``SIMDIST_FUZZ_MAX_WORLD_SIZE`` (default 16)."""
    return campaign_max_world_size(16) or 16


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class DraftCase:
    """One co-training step's inputs; see the module docstring."""

    tp: int
    dp: int
    pp: int
    microbatches: int
    seq_len: int
    masks: tuple  # [dp][microbatch][row][position] floats
    vocab_size: int  # a multiple of tp (CotrainWorker shards it evenly)
    token_chunk_size: int
    dtype: str  # "float32" | "bfloat16"
    bin_weights: tuple[float, ...]
    single_bin: int | None  # every token in this bin; None: bins drawn from the seed
    seed: int  # tokens, bins and initial parameters
    reduction: str
    reduction_seed: int
    clip: bool
    cp: int = 1
    mode: str = "split"  # the mode a single-mode property runs
    warmup: bool = False  # fault property: one clean step first (momentum buffers exist)
    fault: Mapping[str, Any] | None = None  # {"probe": point, "rank": r} or a simdist Fault as JSON
    bad_input: Mapping[str, Any] | None = None  # {"kind": ..., "rank": r}

    # ------------------------------------------------------------- JSON form

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["masks"] = [[[list(row) for row in micro] for micro in rank] for rank in self.masks]
        data["bin_weights"] = list(self.bin_weights)
        data["fault"] = None if self.fault is None else dict(self.fault)
        data["bad_input"] = None if self.bad_input is None else dict(self.bad_input)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DraftCase:
        fields = dict(data)
        fields["masks"] = _tuples(fields["masks"])
        fields["bin_weights"] = tuple(float(w) for w in fields["bin_weights"])
        if fields.get("fault") is not None:
            fields["fault"] = dict(fields["fault"])
        if fields.get("bad_input") is not None:
            fields["bad_input"] = dict(fields["bad_input"])
        return cls(**fields)

    # ------------------------------------------------------------ derived

    @property
    def layout(self) -> Layout:
        return Layout(tp=self.tp, cp=self.cp, dp=self.dp, pp=self.pp)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def reduction_choice(self) -> ReductionChoice:
        return ReductionChoice(self.reduction, self.reduction_seed)

    def config(self) -> CotrainConfig:
        clip = CLIP_NORMS if self.clip else {}
        return CotrainConfig(
            vocab_size=self.vocab_size,
            hidden_size=HIDDEN_SIZE,
            ffn_size=FFN_SIZE,
            num_layers=NUM_LAYERS,
            bin_weights=self.bin_weights,
            token_chunk_size=self.token_chunk_size,
            seed=self.seed,
            dtype=self.torch_dtype,
            **clip,
        )

    def batches(self, data_seed: int | None = None) -> list[CotrainBatch]:
        """One batch per DP rank: its microbatches' rows, concatenated (``tensor_split``
        over ``microbatches`` gives them back, every microbatch of a rank has as many rows).
        Tokens and bins come from ``data_seed`` (default: the case's seed)."""
        generator = torch.Generator().manual_seed(self.seed if data_seed is None else data_seed)
        out = []
        for rank_masks in self.masks:
            mask = torch.tensor([row for micro in rank_masks for row in micro], dtype=torch.float32)
            shape = tuple(mask.shape)
            tokens = torch.randint(0, self.vocab_size, shape, generator=generator)
            if self.single_bin is None:
                bins = torch.randint(0, len(self.bin_weights), shape, generator=generator)
            else:
                bins = torch.full(shape, self.single_bin, dtype=torch.int64)
            out.append(CotrainBatch(tokens, mask, bins))
        return out

    def global_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The DP ranks' batches stacked, as the single-process reference sees them."""
        batches = self.batches()
        return (
            torch.cat([b.tokens for b in batches]),
            torch.cat([b.mask for b in batches]),
            torch.cat([b.bin_ids for b in batches]),
        )

    def zero_count(self) -> str:
        """Which normalisers of the step are 0: "none", "draft" (weighted draft count
        only), "both"; "policy" cannot happen here (the draft count is the policy's)."""
        _, mask, bins = self.global_batch()
        shifted_mask, shifted_bins = mask[:, 1:].double(), bins[:, 1:]
        policy = float(shifted_mask.sum())
        weights = torch.tensor(self.bin_weights, dtype=torch.float64)
        draft = float((weights[shifted_bins] * shifted_mask).sum())
        if policy == 0:
            return "both"
        return "draft" if draft == 0 else "none"

    def cover(self) -> dict[str, Any]:
        """The coverage features every property records with ``fuzz.cover``."""
        fault = "none"
        if self.fault is not None:
            fault = "probe" if "probe" in self.fault else str(self.fault["kind"])
        return {
            "tp": self.tp,
            "cp": self.cp,
            "dp": self.dp,
            "pp": self.pp,
            "world": self.layout.world_size,
            "microbatches": self.microbatches,
            "dtype": self.dtype,
            "reduction": self.reduction,
            "zero_count": self.zero_count(),
            "fault": fault,
            "clip": self.clip,
        }


# ----------------------------------------------------------------- strategies


@st.composite
def draft_cases(
    draw: st.DrawFn,
    *,
    max_world: int | None = None,
    dtypes: tuple[str, ...] = ("float32", "bfloat16"),
    modes: tuple[str, ...] = ("split", "monolithic"),
    min_microbatches: int = 1,
) -> DraftCase:
    """Valid co-training steps over random layouts and token distributions.

    Layouts: tp, dp, pp in 1..4 (cp too when ``CP_SUPPORTED``), world size up to
    ``max_world`` (default: ``SIMDIST_FUZZ_MAX_WORLD_SIZE``); 1..4 microbatches;
    per-rank, per-microbatch masks (uneven, all-masked ranks and microbatches,
    single tokens, fractional values); zero, fractional and large bin weights,
    with a draft-only zero count drawn on purpose (every token in a bin of
    weight 0); token_chunk_size from 1 to beyond the tokens of a microbatch.
    """
    axes = ("tp", "cp", "dp", "pp") if CP_SUPPORTED else ("tp", "dp", "pp")
    layout = draw(layouts(max_world_size=max_world or max_world_size(), axes=axes, max_degree=4))
    microbatches = draw(st.integers(min_microbatches, 4))
    # One case in eight has 129..320 positions a row: a rank's count, or the
    # DP sum of two ranks' counts, passes bfloat16's exact integers (256).
    seq_len = draw(sequence_lengths((2, MAX_SEQ_LEN), LONG_SEQ_LEN))
    masks = draw(token_distributions(layout.dp, microbatches, seq_len))
    weights = draw(bin_weights((1, 4)))
    # Every token in one bin; a weight-0 bin zeroes the draft count alone. The
    # bin is drawn either way: a case makes the same choices whatever their
    # values, so Hypothesis' mutations never run out of choices (gave_up).
    one_bin = draw(st.booleans())
    bin_index = draw(st.integers(0, len(weights) - 1))
    single_bin = bin_index if one_bin else None
    chunk = draw(chunk_sizes(max(len(m[0]) * seq_len for m in masks)))
    reduction = draw(reductions(REDUCTION_NAMES))
    return DraftCase(
        tp=layout.tp,
        cp=layout.cp,
        dp=layout.dp,
        pp=layout.pp,
        microbatches=microbatches,
        seq_len=seq_len,
        masks=_tuples(masks),
        vocab_size=layout.tp * draw(st.integers(2, 6)),
        token_chunk_size=chunk,
        dtype=draw(dtype_names(dtypes)),
        bin_weights=weights,
        single_bin=single_bin,
        seed=draw(st.integers(0, 2**16)),
        reduction=reduction.model,
        reduction_seed=reduction.seed,
        clip=draw(st.booleans()),
        mode=draw(st.sampled_from(modes)),
    )


def chunk_sizes(tokens: int) -> st.SearchStrategy[int]:
    """token_chunk_size against the ``tokens`` of a microbatch: beyond them and
    equal (one cached tile), a few partial tiles (streaming, a last partial
    tile), or 1 (a tile per token; eight tiles in a long microbatch). Every tile
    costs two TP all-reduces per microbatch, so the many-tile sizes are kept
    to a quarter of the cases."""
    return _chunk_sizes(tokens)


# Module level: Hypothesis reads a composite's source each time @st.composite
# decorates it (see simdist.strategies), too slow to repeat for every case.
@st.composite
def _chunk_sizes(draw: st.DrawFn, tokens: int) -> int:
    kind = draw(st.sampled_from(("beyond", "equal", "partial", "one")))
    # Both sizes are drawn whatever the kind: the same choices in every case.
    beyond = tokens + 1 + draw(st.integers(0, 1))
    low = max(2, -(-tokens // 4))
    partial = low + draw(st.integers(0, max(0, tokens - 1 - low)))
    if kind == "beyond":
        return beyond
    if kind == "equal" or tokens < 2:
        return tokens
    if kind == "partial":
        return partial if tokens > 2 else 1
    # A tile per token of a long microbatch would be hundreds of tiles: eight.
    return 1 if tokens <= _LONG_TOKENS else -(-tokens // 8)


_LONG_TOKENS = 32  # short cases have at most 2 rows of MAX_SEQ_LEN tokens


def probe_points(microbatches: int) -> list[str]:
    """Every probe point of a split step that all ranks pass through (the abort/retry suite's list)."""
    return fault_points(Layout(), microbatches)


@st.composite
def fault_cases(draw: st.DrawFn, *, max_world: int | None = None) -> DraftCase:
    """A split step with one fault on one rank: an exception at a probe point of
    ``train_step`` (on the first attempt), or a simdist fault (crash, timeout,
    communicator abort, delay) at the n-th matching collective."""
    case = draw(draft_cases(max_world=max_world, modes=("split",)))
    world = case.layout.world_size
    # Both are drawn, one is used: the same choices in every case.
    use_probe = draw(st.booleans())
    probe = draw(probe_faults(probe_points(case.microbatches), world))
    collective = draw(faults(world, max_nth=12))
    fault: dict[str, Any] = (
        {"probe": probe.point, "rank": probe.rank} if use_probe else fault_to_json(collective)
    )
    return replace(case, fault=fault, warmup=draw(st.booleans()))


def fault_plan_of(case: DraftCase):
    """The simdist FaultPlan of a case's fault (None for a probe fault or no fault)."""
    from simdist import FaultPlan

    if case.fault is None or "probe" in case.fault:
        return None
    return FaultPlan((fault_from_json(case.fault),))


# Bad input on one rank: each kind is a batch (or argument) that this rank's own
# checks refuse; every other rank's input is valid.
BAD_INPUT_KINDS: tuple[str, ...] = (
    "tokens_out_of_range",
    "negative_bin",
    "bin_too_large",
    "mask_shape",
    "tokens_int32",
    "bins_float",
    "tokens_1d",
    "too_many_microbatches",
    "one_position",
    "mode_typo",
)


@st.composite
def bad_input_cases(draw: st.DrawFn, *, max_world: int | None = None) -> DraftCase:
    case = draw(draft_cases(max_world=max_world))
    bad = {
        "kind": draw(st.sampled_from(BAD_INPUT_KINDS)),
        "rank": draw(st.integers(0, case.layout.world_size - 1)),
    }
    return replace(case, bad_input=bad)


def spoil(batch: CotrainBatch, kind: str, config: CotrainConfig) -> tuple[Any, str, int | None]:
    """``(batch, mode override, microbatches override)`` for one bad-input kind."""
    tokens, mask, bins = batch.tokens.clone(), batch.mask.clone(), batch.bin_ids.clone()
    if kind == "tokens_out_of_range":
        tokens[0, 0] = config.vocab_size
    elif kind == "negative_bin":
        bins[0, -1] = -1
    elif kind == "bin_too_large":
        bins[-1, 0] = config.num_bins
    elif kind == "mask_shape":
        mask = torch.cat([mask, mask[:, :1]], dim=1)
    elif kind == "tokens_int32":
        tokens = tokens.to(torch.int32)
    elif kind == "bins_float":
        bins = bins.to(torch.float32)
    elif kind == "tokens_1d":
        tokens = tokens.reshape(-1)
    elif kind == "one_position":
        tokens, mask, bins = tokens[:, :1], mask[:, :1], bins[:, :1]
    elif kind == "too_many_microbatches":
        return batch, "", tokens.shape[0] + 1
    elif kind == "mode_typo":
        return batch, "splt", None
    else:
        raise ValueError(f"unknown bad-input kind {kind!r}; expected one of {BAD_INPUT_KINDS}")
    return CotrainBatch(tokens, mask, bins), "", None


__all__ = [
    "BAD_INPUT_KINDS",
    "CP_SUPPORTED",
    "DraftCase",
    "bad_input_cases",
    "chunk_sizes",
    "draft_cases",
    "fault_cases",
    "fault_plan_of",
    "max_world_size",
    "probe_points",
    "spoil",
]
