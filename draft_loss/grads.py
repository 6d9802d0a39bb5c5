"""Main gradients of a co-trained policy and draft: tags, scaling, norms, clipping.

Parameters carry two tags (Megatron-style attributes): their group, "policy"
or "draft", and whether they are sharded over tensor parallelism (each TP rank
holds a different slice) or replicated (every TP rank holds the same values).
Gradients are accumulated into an fp32 ``main_grad`` per parameter, and each
main grad remembers the count it was normalised by, so the draft correction
can check that it runs on policy-normalised gradients.

The order of one step is part of the contract:
``scale_gradients`` -> ``DraftStepState.correct_main_grads`` ->
``group_grad_norms`` -> ``clip_by_group_norms`` -> optimizer step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist

__all__ = [
    "GROUPS",
    "GradientOrderError",
    "accumulate_main_grads",
    "clip_by_group_norms",
    "group_grad_norms",
    "is_tensor_parallel",
    "main_grad_denominator",
    "parameter_group",
    "scale_gradients",
    "set_main_grad_denominator",
    "tag_parameter",
    "zero_main_grads",
]

GROUPS: tuple[str, ...] = ("policy", "draft")

# Attribute names on parameters (plain attributes survive DDP wrapping and
# need no side table keyed by tensor identity).
_GROUP_ATTR = "draft_loss_group"
_TP_ATTR = "tensor_model_parallel"
_DENOMINATOR_ATTR = "main_grad_denominator"
_MAIN_GRAD_ATTR = "main_grad"  # Megatron's name, where its optimizers look


class GradientOrderError(RuntimeError):
    """A gradient transformation ran before the one it must follow."""


# ------------------------------------------------------------------- tagging


def tag_parameter(param: torch.nn.Parameter, group: str, *, tensor_parallel: bool) -> torch.nn.Parameter:
    """Marks ``param`` as belonging to ``group`` and as TP-sharded or TP-replicated."""
    if not isinstance(param, torch.Tensor):
        raise TypeError(f"tag_parameter: param must be a tensor, got {type(param).__name__}")
    if group not in GROUPS:
        raise ValueError(f"tag_parameter: group must be one of {GROUPS}, got {group!r}")
    if not isinstance(tensor_parallel, bool):
        raise TypeError(
            f"tag_parameter: tensor_parallel must be a bool, got {type(tensor_parallel).__name__}"
        )
    setattr(param, _GROUP_ATTR, group)
    setattr(param, _TP_ATTR, tensor_parallel)
    return param


def parameter_group(param: torch.Tensor) -> str:
    group = getattr(param, _GROUP_ATTR, None)
    if group is None:
        raise ValueError(
            f"parameter of shape {tuple(param.shape)} has no group tag; call "
            "tag_parameter(p, 'policy' | 'draft', tensor_parallel=...) on every trained parameter"
        )
    return group


def is_tensor_parallel(param: torch.Tensor) -> bool:
    parameter_group(param)  # an untagged parameter is an error, not "replicated"
    return bool(getattr(param, _TP_ATTR))


# ----------------------------------------------------------- main gradients


def zero_main_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """Fresh fp32 main grads (raw, not yet normalised) and no autograd grads."""
    for p in params:
        setattr(p, _MAIN_GRAD_ATTR, torch.zeros(p.shape, dtype=torch.float32, device=p.device))
        setattr(p, _DENOMINATOR_ATTR, None)
        p.grad = None


def accumulate_main_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """Adds each ``.grad`` (one microbatch's backward) to its fp32 main grad.

    Accumulating in fp32 keeps a bf16 split step close to the monolithic one:
    adding bf16 microbatch gradients in bf16 would round at every addition.
    """
    for p in params:
        main = _main_grad(p, "accumulate_main_grads")
        if main_grad_denominator(p) is not None:
            raise GradientOrderError(
                "accumulate_main_grads: this main grad was already normalised; zero_main_grads "
                "starts a new step"
            )
        if p.grad is not None:
            main.add_(p.grad.to(torch.float32))
            p.grad = None


def main_grad(param: torch.Tensor) -> torch.Tensor:
    """The fp32 main grad ``zero_main_grads`` attached to ``param`` (AttributeError without one)."""
    value: torch.Tensor = getattr(param, _MAIN_GRAD_ATTR)
    return value


def drop_main_grads(params: Iterable[torch.Tensor]) -> None:
    """Removes the main grads (the step was applied or dropped); parameters without one are fine."""
    for p in params:
        if hasattr(p, _MAIN_GRAD_ATTR):
            delattr(p, _MAIN_GRAD_ATTR)


def main_grad_denominator(param: torch.Tensor) -> float | None:
    """The count the main grad was last normalised by, None while it is a raw sum."""
    return getattr(param, _DENOMINATOR_ATTR, None)


def set_main_grad_denominator(param: torch.Tensor, count: float) -> None:
    setattr(param, _DENOMINATOR_ATTR, float(count))


def scale_gradients(params: Iterable[torch.nn.Parameter], policy_count: float | torch.Tensor) -> None:
    """Normalises every raw main grad by the DP-global policy token count ``n``.

    Multiplies by ``1/n``, or by 0 when ``n`` is 0 (no token contributed, so
    the gradient is 0 by definition; multiplying rather than zeroing keeps a
    non-finite raw gradient visible to the grad-norm guard).
    """
    count = _as_count(policy_count, "scale_gradients: policy_count")
    scale = 1.0 / count if count > 0 else 0.0
    for p in params:
        main = _main_grad(p, "scale_gradients")
        if main_grad_denominator(p) is not None:
            raise GradientOrderError(
                f"scale_gradients: a main grad was already normalised (by {main_grad_denominator(p)}); "
                "scaling twice would divide by the count twice"
            )
        main.mul_(scale)
        set_main_grad_denominator(p, count)


# --------------------------------------------------------------- grad norms


def group_grad_norms(
    params: Iterable[torch.nn.Parameter],
    *,
    tp_group: dist.ProcessGroup | None,
    pp_group: dist.ProcessGroup | None,
    agree_group: dist.ProcessGroup | None = None,
) -> dict[str, torch.Tensor]:
    """L2 norm of each group's main grads over the whole model, identical on every rank.

    Sums of squares are taken in float64: TP-sharded parameters count on every
    TP rank, replicated ones on TP rank 0 only (every TP rank holds the same
    values, so counting them everywhere would multiply them by the TP size).
    One all-reduce over TP, then one over PP, both joined by every rank, also
    by stages that own no parameter of a group: they add zeros, which keeps
    the collective symmetric. Non-finite norms are returned as they are.

    Main grads must be identical across DP and CP (already all-reduced over
    DP x CP; parameters are replicated over CP), so the result is identical
    on every rank without a DP or CP collective, which would count them again.

    Identical up to the last bit only if every TP and PP group adds in the
    same order. Different groups may not (NCCL picks rings per communicator;
    simdist's ``shuffled`` model orders each group its own way), and then DP
    replicas or TP columns clip by coefficients a bit apart and drift. Pass
    ``agree_group`` (the whole world) for one more MAX all-reduce of the two
    norms that makes them bitwise identical on its members.
    """
    params = list(params)
    device = params[0].device if params else torch.device("cpu")
    counts_replicated = tp_group is None or dist.get_rank(tp_group) == 0
    squares = torch.zeros(len(GROUPS), dtype=torch.float64, device=device)
    for p in params:
        group = parameter_group(p)
        if not is_tensor_parallel(p) and not counts_replicated:
            continue
        main = _main_grad(p, "group_grad_norms")
        squares[GROUPS.index(group)] += main.to(torch.float64).pow(2).sum()
    for group_handle in (tp_group, pp_group):
        if group_handle is not None:
            dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=group_handle)
    if agree_group is not None:
        dist.all_reduce(squares, op=dist.ReduceOp.MAX, group=agree_group)
    return {name: squares[i].sqrt() for i, name in enumerate(GROUPS)}


def clip_by_group_norms(
    params: Iterable[torch.nn.Parameter],
    norms: Mapping[str, torch.Tensor],
    max_norms: Mapping[str, float],
    eps: float = 1e-6,
) -> dict[str, float]:
    """Scales each group's main grads by ``min(1, max_norm / (norm + eps))``.

    Groups absent from ``max_norms`` are not clipped. A non-finite norm leaves
    its gradients untouched (coefficient 1): the step must be skipped, and the
    norm reported as it is, not hidden by a NaN coefficient.
    """
    unknown = sorted(set(max_norms) - set(GROUPS))
    if unknown:
        raise ValueError(f"clip_by_group_norms: unknown group(s) {unknown} in max_norms; expected {GROUPS}")
    coefficients: dict[str, float] = {}
    for name in GROUPS:
        coefficient = 1.0
        if name in max_norms:
            max_norm = float(max_norms[name])
            if not max_norm > 0:
                raise ValueError(f"clip_by_group_norms: max_norms[{name!r}] must be > 0, got {max_norm}")
            norm = float(norms[name])
            if math.isfinite(norm):
                coefficient = min(1.0, max_norm / (norm + eps))
        coefficients[name] = coefficient
    for p in params:
        coefficient = coefficients[parameter_group(p)]
        if coefficient != 1.0:
            _main_grad(p, "clip_by_group_norms").mul_(coefficient)
    return coefficients


# ------------------------------------------------------------------ helpers


def _main_grad(param: torch.Tensor, what: str) -> torch.Tensor:
    main = getattr(param, _MAIN_GRAD_ATTR, None)
    if main is None:
        raise GradientOrderError(
            f"{what}: parameter of shape {tuple(param.shape)} has no main_grad; call zero_main_grads "
            "at the start of the step"
        )
    return main


def _as_count(value: float | torch.Tensor, what: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{what} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        value = float(value.item())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number or a 1-element tensor, got {type(value).__name__}")
    count = float(value)
    if not math.isfinite(count) or count < 0:
        raise ValueError(f"{what} must be finite and >= 0, got {count}")
    return count
