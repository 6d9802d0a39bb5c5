"""The reference model's parameters: where each one lives, their initial values, a rank's shards."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..grads import tag_parameter
from .config import CotrainConfig


@dataclass(frozen=True)
class ParameterPlacement:
    """Where one parameter of the full model lives."""

    group: str  # "policy" or "draft"
    shard_dim: int | None  # dim split over TP ranks; None: replicated
    stage: str  # PP placement: "first", "last" or "layer:<i>"


def parameter_placements(config: CotrainConfig) -> dict[str, ParameterPlacement]:
    """Every parameter of the full model: its group, TP shard dim and PP placement."""
    place = ParameterPlacement
    out: dict[str, ParameterPlacement] = {"embedding.weight": place("policy", None, "first")}
    for i in range(config.num_layers):
        where = f"layer:{i}"
        out[f"layers.{i}.fc1.weight"] = place("policy", 0, where)
        out[f"layers.{i}.fc1.bias"] = place("policy", 0, where)
        out[f"layers.{i}.fc2.weight"] = place("policy", 1, where)
        out[f"layers.{i}.fc2.bias"] = place("policy", None, where)
    out["output.weight"] = place("policy", 0, "last")
    out["draft.embedding.weight"] = place("draft", None, "last")
    out["draft.fc.weight"] = place("draft", None, "last")
    out["draft.fc.bias"] = place("draft", None, "last")
    out["draft.head.weight"] = place("draft", 0, "last")
    return out


def full_initial_parameters(config: CotrainConfig) -> dict[str, torch.Tensor]:
    """The unsharded initial parameters in float64, a pure function of the config.

    Fresh tensors on every call (callers may change them); the values are
    drawn once per model shape, seed and scale: every rank of a job, and every
    worker a test builds, starts from the same ones.
    """
    drawn = _initial_parameters(
        config.vocab_size,
        config.hidden_size,
        config.ffn_size,
        config.num_layers,
        config.seed,
        config.init_std,
    )
    return {name: value.clone() for name, value in drawn.items()}


@functools.lru_cache(maxsize=16)
def _initial_parameters(
    V: int, H: int, F: int, num_layers: int, seed: int, init_std: float
) -> dict[str, torch.Tensor]:
    # Never handed out: full_initial_parameters returns copies.
    shapes: dict[str, tuple[int, ...]] = {"embedding.weight": (V, H)}
    for i in range(num_layers):
        shapes |= {
            f"layers.{i}.fc1.weight": (F, H),
            f"layers.{i}.fc1.bias": (F,),
            f"layers.{i}.fc2.weight": (H, F),
            f"layers.{i}.fc2.bias": (H,),
        }
    shapes |= {
        "output.weight": (V, H),
        "draft.embedding.weight": (V, H),
        "draft.fc.weight": (H, 2 * H),
        "draft.fc.bias": (H,),
        "draft.head.weight": (V, H),
    }
    generator = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(shape, generator=generator, dtype=torch.float64) * init_std
        for name, shape in shapes.items()
    }


def tp_shard_range(size: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """``[start, stop)`` of TP rank ``tp_rank``'s shard of a dimension of ``size``.

    Shards may differ in size, as real vocabularies (50257 over 4 ranks) make
    them: the first ``size % tp_size`` ranks hold one more row, as
    ``torch.tensor_split`` splits (for a size that divides, the even split).
    """
    base, extra = divmod(size, tp_size)
    start = tp_rank * base + min(tp_rank, extra)
    return start, start + base + (1 if tp_rank < extra else 0)


def layers_of_stage(num_layers: int, stage: int, num_stages: int) -> range:
    """Contiguous layers of one PP stage; earlier stages take the remainder."""
    base, extra = divmod(num_layers, num_stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def rank_parameters(
    config: CotrainConfig, stages: set[str], tp_rank: int, tp_size: int
) -> dict[str, torch.nn.Parameter]:
    """This rank's tagged parameters: those placed on ``stages``, each cut to its TP shard."""
    full = full_initial_parameters(config)
    params: dict[str, torch.nn.Parameter] = {}
    for name, placement in parameter_placements(config).items():
        if placement.stage not in stages:
            continue
        value = full[name]
        if placement.shard_dim is not None:
            start, stop = tp_shard_range(value.shape[placement.shard_dim], tp_rank, tp_size)
            value = value.narrow(placement.shard_dim, start, stop - start)
        param = torch.nn.Parameter(value.to(config.dtype).contiguous())
        tag_parameter(param, placement.group, tensor_parallel=placement.shard_dim is not None)
        params[name] = param
    return params
