"""The end of a step: per-group grad norms, clipping, and a transactional optimizer step.

Everything after the last collective that can fail runs before the ranks
agree to commit: one rank failing there must not leave the others with an
applied step that a retry would apply twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import grads as _grads  # group_grad_norms looked up at call time: tests replace it
from ..grads import clip_by_group_norms, drop_main_grads, main_grad
from . import groups as _groups  # world_group looked up at call time: benchmarks replace it
from .agreement import fail_together
from .groups import ParallelGroups
from .probe import Probe, prefixed, reach
from .sgd import MomentumSGD, PreparedStep


class StepAbortedError(RuntimeError):
    """This rank was fine, but another rank failed the step before it was committed."""


@dataclass
class StepResult:
    """What one rank saw of a step, enough to compare two runs tensor by tensor."""

    grads: dict[str, torch.Tensor]  # fp32 main grads after scaling and correction, before clipping
    params: dict[str, torch.Tensor]  # fp32 parameters after the optimizer step
    grad_norms: dict[str, float]  # per group, identical on every rank
    clip_coefficients: dict[str, float]
    metrics: dict[str, float]  # METRIC_NAMES, identical on every rank
    skipped: bool = False  # non-finite grad norm: no optimizer step


@dataclass(frozen=True)
class Commit:
    """How the step ended: its grad norms and clip coefficients, and whether it was skipped."""

    grad_norms: dict[str, float]
    clip_coefficients: dict[str, float]
    skipped: bool


def commit_step(
    params: dict[str, torch.nn.Parameter],
    master: dict[str, torch.Tensor],
    optimizer: MomentumSGD,
    groups: ParallelGroups,
    max_norms: dict[str, float],
    probe: Probe | None,
    prefix: str,
) -> Commit:
    """Norms, clipping and the optimizer step, applied on every rank or on none.

    A step whose grad norm is not finite is skipped on every rank alike (the
    norms are identical everywhere); its gradients are left for the caller to
    drop. Raises this rank's own failure, or StepAbortedError when only
    another rank failed.
    """
    tensors = list(params.values())
    norms_t = _grads.group_grad_norms(
        tensors, tp_group=groups.tp, pp_group=groups.pp, agree_group=_groups.world_group()
    )
    norms = {name: float(value) for name, value in norms_t.items()}
    failure: BaseException | None = None
    skipped, coefficients = False, {n: 1.0 for n in norms}
    prepared: PreparedStep | None = None
    try:
        reach(probe, f"{prefix}:after_grad_norms")
        skipped = not all(math.isfinite(v) for v in norms.values())
        if not skipped:
            coefficients = clip_by_group_norms(tensors, norms_t, max_norms)
            grads = {name: main_grad(p) for name, p in params.items()}
            prepared = optimizer.prepare(master, grads, probe=prefixed(probe, prefix))
    except Exception as error:  # re-raised below, after the agreement
        failure = error
    another = StepAbortedError(
        "CotrainWorker.train_step: another rank failed before committing the optimizer step; "
        "no rank applied it, retry the step"
    )
    fail_together(failure, another)
    if prepared is not None:
        optimizer.commit(master, prepared)
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(master[name].to(p.dtype))
        drop_main_grads(tensors)
    return Commit(norms, coefficients, skipped=prepared is None)
