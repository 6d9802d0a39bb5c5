"""What a step reports: its losses and token counts, identical on every rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

METRIC_NAMES: tuple[str, ...] = (
    "policy_loss",
    "draft_loss",
    "policy_tokens",
    "draft_tokens",
    "draft_weighted_tokens",
)


def step_metrics(
    *,
    policy_sum: float,
    policy_count: float,
    numerators: torch.Tensor,
    counts: torch.Tensor,
    weights: torch.Tensor,
) -> dict[str, float]:
    """METRIC_NAMES from the DP x CP-global sums; a loss without tokens is 0, never NaN."""
    weighted_count = float((weights * counts).sum())
    weighted_sum = float((weights * numerators).sum())
    return {
        "policy_loss": policy_sum / policy_count if policy_count > 0 else 0.0,
        "draft_loss": weighted_sum / weighted_count if weighted_count > 0 else 0.0,
        "policy_tokens": policy_count,
        "draft_tokens": float(counts.sum()),
        "draft_weighted_tokens": weighted_count,
    }


def share_metrics(
    metrics: dict[str, float] | None,
    pp_group: dist.ProcessGroup | None,
    tp_group: dist.ProcessGroup | None = None,
) -> dict[str, float]:
    """Metrics live on the last stage; every rank takes those of its TP rank 0.

    The last stage's TP ranks each hold their own DP x CP sums, and those agree
    only to the last bit: each TP rank's DP x CP group is a group of its own,
    which a backend may sum in its own order. So one rank fills the vector and
    every rank joins a PP and a TP all-reduce of it: a sum of one value and
    zeros is exact in any order, and every rank reports the same bits.
    """
    vector = torch.zeros(len(METRIC_NAMES), dtype=torch.float64)
    reporting = tp_group is None or dist.get_rank(tp_group) == 0
    if metrics is not None and reporting:
        vector = torch.tensor([metrics[name] for name in METRIC_NAMES], dtype=torch.float64)
    for group in (pp_group, tp_group):
        if group is not None:
            dist.all_reduce(vector, op=dist.ReduceOp.SUM, group=group)
    return {name: float(vector[i]) for i, name in enumerate(METRIC_NAMES)}
