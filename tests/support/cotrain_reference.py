"""Single-rank float64 reference of one co-training step over the whole global batch.

Plain autograd on the unsharded model, full softmaxes, no microbatches, no
collectives and nothing from draft_loss: the distributed code under test must
reproduce these numbers, not the other way round. Only the initial parameter
values (an input) come from the code under test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class ReferenceResult:
    grads: dict[str, torch.Tensor]  # full, before clipping
    params: dict[str, torch.Tensor]  # full, after the optimizer step
    grad_norms: dict[str, float]
    clip_coefficients: dict[str, float]
    metrics: dict[str, float]
    momentum: dict[str, torch.Tensor] | None = None  # full SGD momentum buffers after the step


DRAFT_PREFIX = "draft."


def _shift_left(values: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(values)
    out[:, :-1] = values[:, 1:]
    return out


def reference_step(
    config,
    params: dict[str, torch.Tensor],
    tokens,
    mask,
    bin_ids,
    momentum: dict[str, torch.Tensor] | None = None,
    *,
    dtype: torch.dtype = torch.float64,
) -> ReferenceResult:
    """One step of ``config``'s model from ``params`` (full float64 tensors) on the global batch.

    ``momentum``: the SGD momentum buffers of earlier steps (None: the first step,
    whose buffer starts as the update itself). ``dtype``: the precision of every
    operation; float32 makes a shadow, the same maths rounded as the workers'
    float32 arithmetic rounds (in another order), whose distance from the
    float64 result is what float32 costs on this very case (see
    draft_runs.shadow_cost; bfloat16 makes the bfloat16 shadow)."""
    P = {name: value.detach().to(dtype).clone().requires_grad_(True) for name, value in params.items()}
    mask = mask.to(dtype)
    hidden = P["embedding.weight"][tokens]
    for i in range(config.num_layers):
        inner = torch.tanh(hidden @ P[f"layers.{i}.fc1.weight"].T + P[f"layers.{i}.fc1.bias"])
        hidden = hidden + inner @ P[f"layers.{i}.fc2.weight"].T + P[f"layers.{i}.fc2.bias"]
    logits = hidden @ P["output.weight"].T

    # Policy: position t predicts token t+1, trained where mask[t+1] is set.
    labels = _shift_left(tokens)
    policy_mask = _shift_left(mask)
    log_probs = torch.log_softmax(logits, dim=-1)
    ce = -log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    policy_count = float(policy_mask.sum())
    policy_sum = (ce * policy_mask).sum()
    policy_loss = policy_sum / policy_count if policy_count > 0 else policy_sum * 0.0

    # Draft: position t learns the policy's distribution at t+1.
    teacher = _shift_left(logits.detach())
    draft_in = torch.cat([hidden.detach(), P["draft.embedding.weight"][labels]], dim=-1)
    draft_hidden = torch.tanh(draft_in @ P["draft.fc.weight"].T + P["draft.fc.bias"])
    student = draft_hidden @ P["draft.head.weight"].T
    soft_ce = -(torch.softmax(teacher, dim=-1) * torch.log_softmax(student, dim=-1)).sum(-1)
    bins = _shift_left(bin_ids)
    weights = torch.tensor(config.bin_weights, dtype=dtype)
    numerators = torch.zeros(config.num_bins, dtype=dtype).index_add(
        0, bins.reshape(-1), (soft_ce * policy_mask).reshape(-1)
    )
    counts = torch.zeros(config.num_bins, dtype=dtype).index_add(0, bins.reshape(-1), policy_mask.reshape(-1))
    weighted_count = float((weights * counts).sum())
    weighted_sum = (weights * numerators).sum()
    draft_loss = weighted_sum / weighted_count if weighted_count > 0 else weighted_sum * 0.0

    loss = policy_loss + config.draft_loss_weight * draft_loss
    names = list(P)
    grads = torch.autograd.grad(loss, [P[n] for n in names], allow_unused=True)
    grad = {n: (g if g is not None else torch.zeros_like(P[n])).detach() for n, g in zip(names, grads)}

    norms = {"policy": 0.0, "draft": 0.0}
    for n, g in grad.items():
        norms["draft" if n.startswith(DRAFT_PREFIX) else "policy"] += float((g * g).sum())
    norms = {k: math.sqrt(v) for k, v in norms.items()}
    max_norms = {"policy": config.policy_max_grad_norm, "draft": config.draft_max_grad_norm}
    coefficients = {
        k: (1.0 if max_norms[k] is None else min(1.0, max_norms[k] / (norms[k] + 1e-6))) for k in norms
    }
    new_params, buffers = {}, {}
    for n, g in grad.items():
        clipped = g * coefficients["draft" if n.startswith(DRAFT_PREFIX) else "policy"]
        p = P[n].detach()
        update = clipped + config.weight_decay * p
        # The first SGD step's momentum buffer starts as the update itself.
        buffers[n] = update if momentum is None else config.momentum * momentum[n] + update
        new_params[n] = p - config.lr * buffers[n]
    metrics = {
        "policy_loss": float(policy_loss.detach()),
        "draft_loss": float(draft_loss.detach()),
        "policy_tokens": policy_count,
        "draft_tokens": float(counts.sum()),
        "draft_weighted_tokens": weighted_count,
    }
    return ReferenceResult(grad, new_params, norms, coefficients, metrics, buffers)
