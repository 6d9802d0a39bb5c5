"""Binned draft-loss statistics: raw numerators and counts, normalised on demand.

The draft loss cannot be normalised where it is computed: the denominator is a
DP-global, whole-step token count. So the loss hands back one raw numerator and
one token count per bin, and ``normalized`` divides by whatever counts the
caller has reduced (``sum_b w_b num_b / sum_b w_b C_b``).
"""

from __future__ import annotations

import torch

_STATS_DTYPES = (torch.float32, torch.float64)


class DraftLossStats:
    """Per-bin ``numerators`` (sum of mask * CE), ``counts`` (sum of mask) and ``weights``.

    All three are 1-D tensors of one length (one entry per bin), one device and
    one dtype: float32, or float64 when the loss was computed from float64
    logits (meant for verification). ``numerators`` may carry autograd history
    back to the logits; ``counts`` and ``weights`` are plain data and must not
    require grad. Counts and weights must be finite and non-negative.
    ``numerators`` are not checked for finiteness: a non-finite numerator is how
    the loss reports non-finite logits (see ``soft_cross_entropy``).
    """

    __slots__ = ("counts", "numerators", "weights")

    def __init__(self, numerators: torch.Tensor, counts: torch.Tensor, weights: torch.Tensor) -> None:
        _check_fields(numerators, counts, weights)
        self.numerators = numerators
        self.counts = counts
        self.weights = weights

    @property
    def num_bins(self) -> int:
        return int(self.numerators.shape[0])

    def normalized(self, normalization_counts: torch.Tensor | None = None) -> torch.Tensor:
        """``sum(w * num) / sum(w * C)`` as a 0-dim tensor; C defaults to ``self.counts``.

        Pass DP-global (and step-global) counts as ``normalization_counts``.
        When ``sum(w * C)`` is 0 the result is exactly 0 with a zero gradient,
        never NaN, and no host synchronisation is needed to decide it.
        """
        counts = self.counts if normalization_counts is None else normalization_counts
        _check_normalization_counts(counts, self.numerators)
        counts = counts.to(self.numerators.dtype)
        denominator = (self.weights * counts).sum()
        numerator = (self.weights * self.numerators).sum()
        has_tokens = denominator > 0
        # Both branches are evaluated; the safe denominator keeps the unused one
        # finite so that its (zero) gradient contribution is not 0 * inf.
        safe_denominator = torch.where(has_tokens, denominator, torch.ones_like(denominator))
        quotient = numerator / safe_denominator
        return torch.where(has_tokens, quotient, torch.zeros_like(quotient))

    def detach(self) -> DraftLossStats:
        """A copy whose numerators carry no autograd history (tensors are shared, not cloned)."""
        return DraftLossStats(self.numerators.detach(), self.counts, self.weights)

    def __repr__(self) -> str:
        return (
            f"DraftLossStats(numerators={self.numerators.tolist()}, "
            f"counts={self.counts.tolist()}, weights={self.weights.tolist()})"
        )


def _check_fields(numerators: object, counts: object, weights: object) -> None:
    named = (("numerators", numerators), ("counts", counts), ("weights", weights))
    for name, value in named:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"DraftLossStats: {name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype not in _STATS_DTYPES:
            raise TypeError(f"DraftLossStats: {name} must be float32 (or float64), got dtype {value.dtype}")
        if value.dim() != 1:
            raise ValueError(
                f"DraftLossStats: {name} must be 1-D (one entry per bin), got shape {tuple(value.shape)}"
            )
    assert isinstance(numerators, torch.Tensor)
    assert isinstance(counts, torch.Tensor) and isinstance(weights, torch.Tensor)
    lengths = {
        name: int(value.shape[0])
        for name, value in zip(("numerators", "counts", "weights"), (numerators, counts, weights))
    }
    if len(set(lengths.values())) != 1:
        raise ValueError(
            f"DraftLossStats: numerators, counts and weights must have one length, got {lengths}"
        )
    if lengths["numerators"] < 1:
        raise ValueError("DraftLossStats: need at least one bin, got length 0")
    dtypes = {numerators.dtype, counts.dtype, weights.dtype}
    if len(dtypes) != 1:
        raise TypeError(
            f"DraftLossStats: numerators, counts and weights must share one dtype, got "
            f"{numerators.dtype}, {counts.dtype}, {weights.dtype}"
        )
    devices = {numerators.device, counts.device, weights.device}
    if len(devices) != 1:
        raise ValueError(
            f"DraftLossStats: numerators, counts and weights must be on one device, got "
            f"{numerators.device}, {counts.device}, {weights.device}"
        )
    for name, value in (("counts", counts), ("weights", weights)):
        if value.requires_grad:
            raise ValueError(f"DraftLossStats: {name} must not require grad (only numerators carry history)")
        if not bool(torch.isfinite(value).all()) or bool((value < 0).any()):
            raise ValueError(f"DraftLossStats: {name} must be finite and non-negative, got {value.tolist()}")


def _check_normalization_counts(counts: object, numerators: torch.Tensor) -> None:
    if not isinstance(counts, torch.Tensor):
        raise TypeError(
            f"normalized: normalization_counts must be a torch.Tensor, got {type(counts).__name__}"
        )
    if counts.dtype == torch.bool or counts.is_complex():
        raise TypeError(f"normalized: normalization_counts must be real numbers, got dtype {counts.dtype}")
    if tuple(counts.shape) != tuple(numerators.shape):
        raise ValueError(
            f"normalized: normalization_counts must have shape {tuple(numerators.shape)} (one per bin), "
            f"got {tuple(counts.shape)}"
        )
    if counts.device != numerators.device:
        raise ValueError(
            f"normalized: normalization_counts must be on {numerators.device}, got {counts.device}"
        )
