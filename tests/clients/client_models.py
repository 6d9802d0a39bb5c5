"""Small models and float64 references shared by the client tests."""

from __future__ import annotations

import itertools

import torch
from torch import nn


def mlp(
    seed: int, dims: tuple[int, ...] = (8, 16, 16, 4), dtype: torch.dtype = torch.float64
) -> nn.Sequential:
    """The same weights on every rank and in the reference (seeded here, not by the rank)."""
    gen = torch.Generator().manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        lin = nn.Linear(a, b, dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(b, a, generator=gen, dtype=dtype) / a**0.5)
            lin.bias.copy_(torch.randn(b, generator=gen, dtype=dtype) * 0.1)
        layers.append(lin)
        if i < len(dims) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def batch(
    seed: int, rows: int, dims: tuple[int, int], dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(rows, dims[0], generator=gen, dtype=dtype),
        torch.randn(rows, dims[1], generator=gen, dtype=dtype),
    )


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_close_dicts(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], **tol: float) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=lambda m, n=name: f"{n}: {m}", **tol)
