"""A plain float64, single-rank, full-vocabulary soft cross-entropy, owned by the tests.

Deliberately naive: one ``log_softmax`` over the whole vocabulary, a Python
loop over bins, autograd for the gradient. It shares no code with
``draft_loss`` so that agreement between the two means something.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ReferenceStats:
    numerators: torch.Tensor  # [num_bins] float64
    counts: torch.Tensor  # [num_bins] float64
    weights: torch.Tensor  # [num_bins] float64

    def normalized(self, counts: torch.Tensor | None = None) -> torch.Tensor:
        counts = self.counts if counts is None else counts.to(torch.float64)
        denominator = float((self.weights * counts).sum())
        if denominator == 0.0:
            return torch.zeros((), dtype=torch.float64)
        return (self.weights * self.numerators).sum() / denominator


def token_cross_entropy(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """``-sum_v softmax(z)_v * log_softmax(s)_v`` per token, in float64, ``[..., V] -> [...]``."""
    log_q = torch.log_softmax(student.to(torch.float64), dim=-1)
    p = torch.softmax(teacher.to(torch.float64), dim=-1)
    # 0 * log_q where the teacher has probability 0 (a -inf teacher logit).
    return -torch.where(p > 0, p * log_q, torch.zeros_like(log_q)).sum(dim=-1)


def reference_stats(
    student: torch.Tensor,
    teacher: torch.Tensor,
    mask: torch.Tensor,
    bin_ids: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    num_bins: int | None = None,
) -> ReferenceStats:
    """Binned statistics; ``student`` may require grad (float64 autograd flows through)."""
    ce = token_cross_entropy(student, teacher).reshape(-1)
    mask64 = mask.reshape(-1).to(torch.float64)
    bins = (
        torch.zeros_like(mask64, dtype=torch.int64)
        if bin_ids is None
        else bin_ids.reshape(-1).to(torch.int64)
    )
    if num_bins is None:
        num_bins = len(weights) if weights is not None else (int(bins.max()) + 1 if bins.numel() else 1)
    numerators = []
    counts = []
    for b in range(num_bins):
        selected = (bins == b) & (mask64 != 0)
        numerators.append((mask64[selected] * ce[selected]).sum())
        counts.append(mask64[bins == b].sum())
    w = torch.ones(num_bins, dtype=torch.float64) if weights is None else weights.to(torch.float64)
    return ReferenceStats(torch.stack(numerators), torch.stack(counts).detach(), w)


def reference_gradient(
    student: torch.Tensor,
    teacher: torch.Tensor,
    mask: torch.Tensor,
    upstream: torch.Tensor,
    bin_ids: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """d(sum_b upstream_b * numerators_b)/d(student) by float64 autograd."""
    s = student.detach().to(torch.float64).requires_grad_(True)
    stats = reference_stats(s, teacher, mask, bin_ids, weights, num_bins=len(upstream))
    (grad,) = torch.autograd.grad((upstream.to(torch.float64) * stats.numerators).sum(), s, allow_unused=True)
    return torch.zeros_like(s) if grad is None else grad
