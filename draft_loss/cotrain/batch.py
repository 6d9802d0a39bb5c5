"""A rank's batch: its shape and checks, its CP shard, its microbatches and its token counts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..context_parallel import shard_sequence
from .config import CotrainConfig

# Mask dtypes a batch may carry, in a fixed order: CP ranks compare them by index.
MASK_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)


@dataclass(frozen=True)
class CotrainBatch:
    """One DP replica's batch (under CP: this rank's CP shard of it, see
    ``shard_batch_for_cp``). ``bin_ids[:, t]`` is the bin of the token at t
    (the draft position t-1, which predicts it, is counted in that bin)."""

    tokens: torch.Tensor  # [B, S] int64
    mask: torch.Tensor  # [B, S], 1 where the token is trained on
    bin_ids: torch.Tensor  # [B, S] int64 in [0, num_bins)


def shard_batch_for_cp(batch: CotrainBatch, cp_rank: int, cp_size: int) -> CotrainBatch:
    """CP rank ``cp_rank``'s load-balanced shard of a DP replica's batch.

    The sequence is cut into ``2 * cp_size`` chunks, the rank keeps chunks
    ``cp_rank`` and ``2 * cp_size - 1 - cp_rank``. A length that does not divide
    is padded at the end with token 0, mask 0, bin 0: padding never trains and
    never counts, so the step equals that of the unpadded batch.
    """
    return CotrainBatch(
        *(shard_sequence(t, cp_rank, cp_size) for t in (batch.tokens, batch.mask, batch.bin_ids))
    )


def split_batch(batch: CotrainBatch, parts: int) -> list[CotrainBatch]:
    """``parts`` microbatches of consecutive rows (the first ones take the remainder)."""
    return [
        CotrainBatch(tokens, mask, bins)
        for tokens, mask, bins in zip(
            batch.tokens.tensor_split(parts),
            batch.mask.tensor_split(parts),
            batch.bin_ids.tensor_split(parts),
        )
    ]


# ------------------------------------------------------------------ counts


def predicted_mask(batch: CotrainBatch, starts_sequence: bool) -> torch.Tensor:
    """The mask of the tokens some position predicts: all but the sequence's first (float64).

    Counted where the token lives, so no boundary exchange is needed; the
    DP x CP sums equal those of the shifted masks. ``starts_sequence``: this
    rank's shard begins with the sequence's first chunk (CP rank 0).
    """
    mask = batch.mask.to(torch.float64).clone()
    if starts_sequence:
        mask[:, 0] = 0.0
    return mask


def policy_count(batch: CotrainBatch, starts_sequence: bool) -> torch.Tensor:
    """Local shifted-token count, ``sum(mask[:, 1:])`` of the unsharded sequence summed over CP."""
    return predicted_mask(batch, starts_sequence).sum()


def draft_counts(batch: CotrainBatch, starts_sequence: bool, num_bins: int) -> torch.Tensor:
    """Local per-bin draft token counts, known from the masks before any forward."""
    return torch.bincount(
        batch.bin_ids.reshape(-1),
        weights=predicted_mask(batch, starts_sequence).reshape(-1),
        minlength=num_bins,
    ).to(torch.float64)


# ------------------------------------------------------------------ checks


def check_step_arguments(
    batch: object, mode: object, num_microbatches: object, config: CotrainConfig, cp_size: int = 1
) -> None:
    """This rank's own ``train_step`` arguments, checked without communicating."""
    what = "CotrainWorker.train_step"
    if mode not in ("monolithic", "split"):
        raise ValueError(f"{what}: mode must be 'monolithic' or 'split', got {mode!r}")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise ValueError(f"{what}: num_microbatches must be a positive int, got {num_microbatches!r}")
    if not isinstance(batch, CotrainBatch):
        raise TypeError(f"{what}: batch must be a CotrainBatch, got {type(batch).__name__}")
    _check_tensors(batch, what)
    tokens, bins = batch.tokens, batch.bin_ids
    rows, seq = tokens.shape
    if bool(((tokens < 0) | (tokens >= config.vocab_size)).any()):
        raise ValueError(f"{what}: batch.tokens must lie in [0, {config.vocab_size})")
    if bool(((bins < 0) | (bins >= config.num_bins)).any()):
        raise ValueError(f"{what}: batch.bin_ids must lie in [0, {config.num_bins})")
    if cp_size > 1 and seq % 2:
        raise ValueError(
            f"{what}: under context parallelism ({cp_size} CP ranks) a rank's batch is its two load-balanced "
            f"chunks, so its sequence length must be even, got {seq}; shard with shard_batch_for_cp"
        )
    if mode == "split" and num_microbatches > rows:
        raise ValueError(
            f"{what}: num_microbatches ({num_microbatches}) exceeds this rank's {rows} batch rows"
        )


def _check_tensors(batch: CotrainBatch, what: str) -> None:
    """Shapes and dtypes of the batch's three tensors."""
    tokens, mask, bins = batch.tokens, batch.mask, batch.bin_ids
    for name, value in (("tokens", tokens), ("mask", mask), ("bin_ids", bins)):
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            raise ValueError(f"{what}: batch.{name} must be a 2-D [batch, seq] tensor, got {value!r:.80}")
    if not (tokens.shape == mask.shape == bins.shape):
        raise ValueError(
            f"{what}: batch.tokens, mask and bin_ids must share one shape, got "
            f"{tuple(tokens.shape)}, {tuple(mask.shape)}, {tuple(bins.shape)}"
        )
    if mask.dtype not in MASK_DTYPES:
        raise TypeError(f"{what}: batch.mask must be bool, integer or real floating, got {mask.dtype}")
    rows, seq = tokens.shape
    if rows < 1 or seq < 2:
        raise ValueError(
            f"{what}: batch needs at least 1 row and 2 positions, got shape {tuple(tokens.shape)}"
        )
    for name, value in (("tokens", tokens), ("bin_ids", bins)):
        if value.dtype != torch.int64:
            raise TypeError(f"{what}: batch.{name} must be int64, got {value.dtype}")
