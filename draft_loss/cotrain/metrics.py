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


def share_metrics(metrics: dict[str, float] | None, pp_group: dist.ProcessGroup | None) -> dict[str, float]:
    """Metrics live on the last stage; every stage joins one PP all-reduce to report them."""
    vector = torch.zeros(len(METRIC_NAMES), dtype=torch.float64)
    if metrics is not None:
        vector = torch.tensor([metrics[name] for name in METRIC_NAMES], dtype=torch.float64)
    if pp_group is not None:
        dist.all_reduce(vector, op=dist.ReduceOp.SUM, group=pp_group)
    return {name: float(vector[i]) for i, name in enumerate(METRIC_NAMES)}
