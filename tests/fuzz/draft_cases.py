"""Fuzz cases of the co-training step: plain data in, tensors built deterministically.

A ``DraftCase`` holds only ints, floats, strings, bools and nested tuples, so
its JSON form is a readable record of the layout, the token distribution per
DP rank and microbatch, the dtype, the reduction model and the fault; every
tensor (tokens, bins, initial parameters) is rebuilt from its seeds on replay.
``draft_cases`` draws them; each choice lists its simplest option first, so a
failure shrinks towards one rank, one microbatch and fully valid 0/1 masks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from hypothesis import strategies as st

from draft_loss import soft_ce
from draft_loss.cotrain import CotrainBatch, CotrainConfig
from simdist import Layout
from simdist.strategies import (
    REDUCTION_NAMES,
    Features,
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
    swarm,
    token_distributions,
)

# CotrainWorker accepts cp > 1 (load-balanced shards, draft_loss.context_parallel):
# layouts draw cp too and every property runs on it. False leaves cp at 1.
CP_SUPPORTED = True

HIDDEN_SIZE = 8
FFN_SIZE = 12  # the default of cases written before ffn_size was drawn
NUM_LAYERS = 2
MAX_SEQ_LEN = 6
LONG_SEQ_LEN = (129, 320)
MAX_DEGREE = 8  # every parallel axis draws 1..8
# Cases written before clip ratios were drawn: limits far below the grad norms
# of this tiny model, so the clip is active whenever a group has any gradient.
CLIP_NORMS = {"policy_max_grad_norm": 0.05, "draft_max_grad_norm": 0.02}
# A group's max norm as a multiple of its float64 reference norm (0: that group
# is not clipped): far below, below, at, just above, above the norm.
CLIP_RATIOS = (0.0, 0.01, 0.5, 0.9, 1.0, 1.1, 2.0)

# Swarm testing (simdist.strategies.swarm): each case turns a random subset of
# these off. An axis off stays at degree 1; "padding" off makes every token
# valid, "fractional" off every mask value 0/1, "bins" off one bin, "low_precision"
# off no bfloat16, "sizes" off the small shapes only (<= 12 tokens a
# microbatch, a local vocabulary <= 6), "uneven_vocab" off a vocabulary that
# divides by tp, "streaming" off one token tile, "small_blocks" off the real
# row-block size, "remainders" off as many rows in every microbatch of a rank,
# "reduction_order" off rank order, "clip" off no clipping.
DRAFT_FEATURES = (
    "tp",
    "cp",
    "dp",
    "pp",
    "padding",
    "fractional",
    "bins",
    "low_precision",
    "sizes",
    "uneven_vocab",
    "streaming",
    "small_blocks",
    "remainders",
    "reduction_order",
    "clip",
)
DRAFT_DTYPES = ("float32", "bfloat16", "float64")  # what CotrainConfig accepts


def max_world_size() -> int:
    """The campaign's world-size bound: ``SIMDIST_FUZZ_MAX_WORLD_SIZE`` (default 64)."""
    return campaign_max_world_size(64) or 64


_CONFIGS: dict[int, tuple[Any, CotrainConfig]] = {}


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
    ffn_size: int = FFN_SIZE
    num_layers: int = NUM_LAYERS
    # (policy, draft) max norms as multiples of the float64 reference's grad
    # norms (0: not clipped); None with ``clip``: the fixed CLIP_NORMS.
    clip_ratios: tuple[float, float] | None = None
    # soft_ce.BLOCK_ELEMENTS while the case runs (None: the real one): a small
    # value splits a token tile into several row blocks, which only vocabularies
    # of 10**5 and more reach otherwise.
    block_elements: int | None = None
    features: tuple[str, ...] | None = None  # the swarm's features on (None: every one)

    # ------------------------------------------------------------- JSON form

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["masks"] = [[[list(row) for row in micro] for micro in rank] for rank in self.masks]
        data["bin_weights"] = list(self.bin_weights)
        data["fault"] = None if self.fault is None else dict(self.fault)
        data["bad_input"] = None if self.bad_input is None else dict(self.bad_input)
        data["clip_ratios"] = None if self.clip_ratios is None else list(self.clip_ratios)
        data["features"] = None if self.features is None else list(self.features)
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
        if fields.get("clip_ratios") is not None:
            policy, draft = fields["clip_ratios"]
            fields["clip_ratios"] = (float(policy), float(draft))
        if fields.get("features") is not None:
            fields["features"] = tuple(str(f) for f in fields["features"])
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
        """The step's configuration; clip ratios become max norms relative to the
        float64 reference's own grad norms of this case (computed once)."""
        cached = _CONFIGS.get(id(self))
        if cached is not None and cached[0] is self:
            return cached[1]
        config = CotrainConfig(
            vocab_size=self.vocab_size,
            hidden_size=HIDDEN_SIZE,
            ffn_size=self.ffn_size,
            num_layers=self.num_layers,
            bin_weights=self.bin_weights,
            token_chunk_size=self.token_chunk_size,
            seed=self.seed,
            dtype=self.torch_dtype,
        )
        if self.clip and self.clip_ratios is None:
            config = replace(config, **CLIP_NORMS)
        elif self.clip and self.clip_ratios is not None:
            config = replace(config, **self._max_norms(config))
        _CONFIGS.clear()  # one case at a time: a cache, not a store
        _CONFIGS[id(self)] = (self, config)
        return config

    def _max_norms(self, config: CotrainConfig) -> dict[str, float | None]:
        from cotrain_harness import reference_of

        assert self.clip_ratios is not None
        norms = reference_of(config, self.global_batch()).grad_norms
        out: dict[str, float | None] = {}
        for group, ratio in zip(("policy", "draft"), self.clip_ratios):
            # A zero norm has no multiple: any positive limit leaves it unclipped.
            out[f"{group}_max_grad_norm"] = None if ratio == 0 else (ratio * norms[group] or 1.0)
        return out

    @contextmanager
    def blocks(self) -> Iterator[None]:
        """``soft_ce.BLOCK_ELEMENTS`` set to the case's while the case runs."""
        if self.block_elements is None:
            yield
            return
        saved = soft_ce.BLOCK_ELEMENTS
        soft_ce.BLOCK_ELEMENTS = self.block_elements
        try:
            yield
        finally:
            soft_ce.BLOCK_ELEMENTS = saved

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
            **self.corners(),
            "swarm_features_on": len(self.features) if self.features is not None else len(DRAFT_FEATURES),
        }

    def corners(self) -> dict[str, Any]:
        """Where the case sits on each documented dimension, in the classes the
        campaign's summary and the drawability floors (benchmarks/drawability.py,
        tests/fuzz/test_drawability.py) count."""
        micro_rows = [len(micro) for rank in self.masks for micro in rank]
        tokens = max(micro_rows) * self.seq_len
        local_vocab = self.vocab_size // self.tp
        largest_shard = -(-self.vocab_size // self.tp)
        blocks = soft_ce.BLOCK_ELEMENTS if self.block_elements is None else self.block_elements
        block_rows = max(1, blocks // largest_shard)
        streaming = self.token_chunk_size < tokens
        return {
            "max_degree": ">=5" if max(self.tp, self.cp, self.dp, self.pp) >= 5 else "<=4",
            "rows": "3+" if max(micro_rows) >= 3 else "1-2",
            "remainder": any(len({len(micro) for micro in rank}) > 1 for rank in self.masks),
            "tokens": _token_class(tokens),
            "local_vocab": "10+" if local_vocab >= 10 else "1-9",
            "uneven_vocab": self.vocab_size % self.tp != 0,
            "multi_block_tile": streaming and min(self.token_chunk_size, tokens) > block_rows,
            "clip_vs_norm": self._clip_class(),
        }

    def _clip_class(self) -> str:
        if not self.clip:
            return "off"
        if self.clip_ratios is None:
            return "fixed"
        live = [r for r in self.clip_ratios if r > 0]
        # A limit exactly at the norm is the boundary case, whatever the other
        # group's limit is.
        if any(r == 1 for r in live):
            return "at"
        if any(r < 1 for r in live) and any(r > 1 for r in live):
            return "below+above"
        return "below" if any(r < 1 for r in live) else "above"


def _token_class(tokens: int) -> str:
    if tokens <= 12:
        return "2-12"
    return "13-128" if tokens <= 128 else ("129-512" if tokens <= 512 else "513+")


# ----------------------------------------------------------------- strategies

_BELOW = tuple(r for r in CLIP_RATIOS if 0 < r < 1)
_ABOVE = tuple(r for r in CLIP_RATIOS if r > 1)


@st.composite
def clip_ratio_pairs(draw: st.DrawFn) -> tuple[float, float]:
    """(policy, draft) clip ratios, the class first: both below the norm, one at
    it, both above, one below and one above, or one group not clipped. Drawn
    value by value, a limit exactly at the norm (one value of seven) and both
    groups above it were too rare for their floor shares."""
    kind = draw(st.sampled_from(("below", "at", "above", "mixed", "one")))
    if kind == "below":
        pair = (draw(st.sampled_from(_BELOW)), draw(st.sampled_from(_BELOW)))
    elif kind == "above":
        pair = (draw(st.sampled_from(_ABOVE)), draw(st.sampled_from(_ABOVE)))
    elif kind == "mixed":
        pair = (draw(st.sampled_from(_BELOW)), draw(st.sampled_from(_ABOVE)))
    else:
        other = draw(st.sampled_from(CLIP_RATIOS))
        pair = (1.0 if kind == "at" else 0.0, other)
    return pair[::-1] if draw(st.booleans()) else pair


@st.composite
def draft_cases(
    draw: st.DrawFn,
    *,
    max_world: int | None = None,
    dtypes: tuple[str, ...] = DRAFT_DTYPES,
    modes: tuple[str, ...] = ("split", "monolithic"),
    min_microbatches: int = 1,
) -> DraftCase:
    """Valid co-training steps over random layouts and token distributions.

    Swarm-tested (``DRAFT_FEATURES``: each case turns a random subset off).
    Layouts: tp, cp, dp, pp each in 1..8, cost-weighted (one axis at any
    degree, the others small), world size up to ``max_world`` (default:
    ``SIMDIST_FUZZ_MAX_WORLD_SIZE``, else 64); 1..4 microbatches of 1..8 rows,
    a rank's first microbatches taking a remainder row; 2..512 tokens a
    microbatch (small, medium and large shapes); per-rank, per-microbatch
    masks (uneven, all-masked ranks and microbatches, single tokens,
    fractional values); local vocabularies of 1..128 entries, shards of
    uneven sizes; float32, bfloat16 and float64; zero, fractional and large
    bin weights, with a draft-only zero count drawn on purpose (every token in
    a bin of weight 0); token_chunk_size from 1 to beyond the tokens of a
    microbatch, with row blocks smaller than a tile; clip limits below, at and
    above the reference's grad norms.
    """
    features: Features = draw(swarm(DRAFT_FEATURES))
    # The layout's focus axis is one of the axes the swarm left on, so an axis
    # reaches its largest degrees in a share of cases that does not shrink
    # with the number of axes switched off.
    axes = tuple(
        a for a in (("tp", "cp", "dp", "pp") if CP_SUPPORTED else ("tp", "dp", "pp")) if features.on(a)
    )
    layout = Layout()
    if axes:
        bound = max_world or max_world_size()
        layout = draw(layouts(max_world_size=bound, axes=axes, max_degree=MAX_DEGREE, weighting="cost"))
    microbatches = draw(st.integers(min_microbatches, 4))
    seq_len, rows = draw(shapes(small_only=not features.on("sizes")))
    remainders = features.on("remainders") and microbatches > 1
    masks = draw(
        token_distributions(
            layout.dp,
            microbatches,
            seq_len,
            rows_per_microbatch=rows,
            fractional=features.on("fractional"),
            remainders=remainders,
        )
    )
    if not features.on("padding"):
        masks = [[[[v if v else 1.0 for v in row] for row in micro] for micro in rank] for rank in masks]
    weights = draw(bin_weights((1, 4)))
    if not features.on("bins"):
        weights = weights[:1]
    # Every token in one bin; a weight-0 bin zeroes the draft count alone. The
    # bin is drawn either way: a case makes the same choices whatever their
    # values, so Hypothesis' mutations never run out of choices (gave_up).
    one_bin = draw(st.booleans())
    bin_index = draw(st.integers(0, 3)) % len(weights)
    single_bin = bin_index if one_bin else None
    tokens = max(len(micro) * seq_len for rank in masks for micro in rank)
    chunk = draw(chunk_sizes(tokens))
    if not features.on("streaming"):
        chunk = max(chunk, tokens)
    elif features.on("small_blocks") and chunk >= tokens > 3:
        chunk = tokens // 2  # small blocks only matter to streaming tiles
    local_vocab = draw(local_vocab_sizes())
    # With the feature on, the vocabulary never divides by tp (> 1).
    remainder = 1 + draw(st.integers(0, MAX_DEGREE - 2)) % max(1, layout.tp - 1) if layout.tp > 1 else 0
    if not features.on("sizes"):
        local_vocab = min(local_vocab, 6)
    vocab_size = layout.tp * local_vocab + (remainder if features.on("uneven_vocab") else 0)
    # Row blocks of a half to a quarter of a tile (of the largest shard): a
    # streaming tile then spans 2..4 blocks, the last one partial or not.
    per_tile = draw(st.integers(2, 4))
    largest_shard = -(-vocab_size // layout.tp)
    block_elements = max(1, chunk // per_tile) * largest_shard if features.on("small_blocks") else None
    reduction = draw(reductions(REDUCTION_NAMES))
    if not features.on("reduction_order"):
        reduction = ReductionChoice("rank", 0)
    dtype = draw(dtype_names(dtypes))
    if dtype == "bfloat16" and not features.on("low_precision"):
        dtype = "float32"
    clip_ratios = draw(clip_ratio_pairs())
    return DraftCase(
        tp=layout.tp,
        cp=layout.cp,
        dp=layout.dp,
        pp=layout.pp,
        microbatches=microbatches,
        seq_len=seq_len,
        masks=_tuples(masks),
        vocab_size=vocab_size,
        token_chunk_size=chunk,
        dtype=dtype,
        bin_weights=weights,
        single_bin=single_bin,
        seed=draw(st.integers(0, 2**16)),
        reduction=reduction.model,
        reduction_seed=reduction.seed,
        clip=features.on("clip") and clip_ratios != (0.0, 0.0),
        mode=draw(st.sampled_from(modes)),
        ffn_size=max(layout.tp, draw(st.integers(1, 16))),
        num_layers=draw(st.integers(1, 4)),
        clip_ratios=clip_ratios,
        block_elements=block_elements,
        features=tuple(sorted(features)),
    )


def shapes(*, small_only: bool = False) -> st.SearchStrategy[tuple[int, tuple[int, int]]]:
    """``(seq_len, rows_per_microbatch)``: small (2..6 positions, 1..2 rows: at most
    12 tokens a microbatch), medium (13..128 tokens: 3..32 positions, 1..4 rows),
    large (up to 512 tokens: 17..64 positions of 2..8 rows), or long (129..320
    positions of 1..2 rows: a row's count past bfloat16's exact integers, 256).
    ``small_only``: the small ones (the draws are made all the same). Shrinks
    towards small."""
    return _shapes(small_only)


_SHAPE_KINDS = ("small", "small", "medium", "medium", "large", "large", "long")


@st.composite
def _shapes(draw: st.DrawFn, small_only: bool) -> tuple[int, tuple[int, int]]:
    kind = draw(st.sampled_from(_SHAPE_KINDS))
    # Each kind's length is drawn whatever the kind: the same choices in every case.
    small, medium, large = (
        draw(st.integers(2, MAX_SEQ_LEN)),
        draw(st.integers(4, 32)),
        draw(st.integers(17, 64)),
    )
    long = draw(st.integers(*LONG_SEQ_LEN))
    if kind == "small" or small_only:
        return small, (1, 2)
    if kind == "medium":
        return medium, (1, 4)
    if kind == "large":
        return large, (2, 8)
    return long, (1, 2)


# Local vocabulary sizes: mostly tiny (bfloat16 cases stay near the parity
# suite's), then 7..32 and 33..128.
_VOCAB_KINDS = ("tiny", "tiny", "medium", "large")


def local_vocab_sizes() -> st.SearchStrategy[int]:
    """A TP rank's vocabulary shard: 1..6 in half the draws, else 7..32 or 33..128."""
    return _local_vocab_sizes()


@st.composite
def _local_vocab_sizes(draw: st.DrawFn) -> int:
    kind = draw(st.sampled_from(_VOCAB_KINDS))
    tiny, medium, large = draw(st.integers(2, 6)), draw(st.integers(7, 32)), draw(st.integers(33, 128))
    one = draw(st.booleans())
    if kind == "tiny":
        return 1 if one and tiny == 2 else tiny
    return medium if kind == "medium" else large


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


def probe_points(microbatches: int, mode: str = "split", num_layers: int = NUM_LAYERS) -> list[str]:
    """Every probe point of a step in ``mode`` (``draft_loss.cotrain.probe``), in the
    order the step reaches them. The optimizer's points run to the largest number
    of parameters a rank can hold (a single stage holding every layer); on a rank
    with fewer, the last ones never fire (a fault that aborts nothing)."""
    optimizer = [f"{mode}:optimizer:{i}" for i in range(6 + 4 * num_layers)]
    if mode == "monolithic":
        return [
            "monolithic:before_count_reduction",
            "monolithic:after_count_reduction",
            "monolithic:microbatch:0:forward",
            "monolithic:microbatch:0:backward",
            "monolithic:after_gradient_reduction",
            "monolithic:after_grad_norms",
            *optimizer,
        ]
    points = [
        f"split:microbatch:{k}:{where}"
        for k in range(microbatches)
        for where in ("forward", "backward", "accumulated")
    ]
    return points + [
        "split:before_count_reduction",
        "split:after_count_reduction",
        "split:after_gradient_reduction",
        "split:during_correction",
        "split:after_grad_norms",
        *optimizer,
    ]


@st.composite
def fault_cases(draw: st.DrawFn, *, max_world: int | None = None) -> DraftCase:
    """A step (split or monolithic) with one fault on one rank: an exception at any
    probe point of ``train_step`` (on the first attempt), or a simdist fault
    (crash, timeout, communicator abort, delay) at the n-th matching collective."""
    case = draw(draft_cases(max_world=max_world))
    world = case.layout.world_size
    # Both are drawn, one is used: the same choices in every case.
    use_probe = draw(st.booleans())
    probe = draw(probe_faults(probe_points(case.microbatches, case.mode, case.num_layers), world))
    # Only groups the layout has: a fault filtered on an axis of degree 1 (no
    # such calls) never fires, and its case tests a clean world.
    groups = (None, *(axis for axis in ("tp", "cp", "dp", "pp") if getattr(case, axis) > 1))
    # nth is drawn wide and wrapped onto the calls the step makes (fault_plan_of),
    # so every matching call of the step, the last optimizer reduction included,
    # can be the one that fails.
    collective = draw(faults(world, groups=groups, max_nth=MAX_FAULT_NTH))
    fault: dict[str, Any] = (
        {"probe": probe.point, "rank": probe.rank} if use_probe else fault_to_json(collective)
    )
    return replace(case, fault=fault, warmup=draw(st.booleans()))


MAX_FAULT_NTH = 64


def fault_plan_of(case: DraftCase, matching_calls: Callable[[Any], int] | None = None):
    """The simdist FaultPlan of a case's fault (None for a probe fault or no fault).

    ``matching_calls(fault)``: how many calls of a clean run of the same step
    the fault matches on its rank. A drawn ``nth`` past them is wrapped onto
    them (``1 + (nth - 1) % calls``): unwrapped, about two in five drawn
    collective faults named a call the step never makes and tested a clean
    world. The wrap is a function of the case, so a replay fires the same call.
    """
    from simdist import FaultPlan

    if case.fault is None or "probe" in case.fault:
        return None
    fault = fault_from_json(case.fault)
    calls = 0 if matching_calls is None else matching_calls(fault)
    if calls > 0 and fault.nth > calls:
        fault = replace(fault, nth=1 + (fault.nth - 1) % calls)
    return FaultPlan((fault,))


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
