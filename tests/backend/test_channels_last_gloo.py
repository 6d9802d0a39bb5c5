"""Channels-last tensors in ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` are taken as gloo takes them (issue 28, point 10):
gloo and NCCL read and write a dense tensor's memory as one flat buffer, so a
channels-last input or output is accepted, its slots being chunks of its
memory. simdist refused them ("must be contiguous"). The reference is a real
gloo world run on the same program."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist.launch import run_processes

pytestmark = pytest.mark.gloo

WORLD = 2
LAYOUTS = list(itertools.product([False, True], repeat=2))  # (input channels-last, output channels-last)


def _layout(t: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if channels_last else t.contiguous()


def program(ctx: Any) -> list[list[float]]:
    rank = dist.get_rank()
    out: list[list[float]] = []
    for in_cl, out_cl in LAYOUTS:
        base = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2) + 100 * rank
        gathered = _layout(torch.zeros(2 * WORLD, 3, 2, 2), out_cl)
        dist.all_gather_into_tensor(gathered, _layout(base, in_cl))
        out.append(gathered.flatten().tolist())
        out.append(gathered.flatten(0).contiguous().view(-1).tolist())
        big = torch.arange(2 * WORLD * 3 * 2 * 2, dtype=torch.float32).reshape(2 * WORLD, 3, 2, 2) * (
            rank + 1
        )
        scattered = _layout(torch.zeros(2, 3, 2, 2), out_cl)
        dist.reduce_scatter_tensor(scattered, _layout(big, in_cl))
        out.append(scattered.flatten().tolist())
        out.append([float(scattered.is_contiguous(memory_format=torch.channels_last))])
    return out


def test_channels_last_gather_and_reduce_scatter_match_gloo() -> None:
    gloo = run_processes(program, world_size=WORLD, timeout=120.0)
    sim = simdist.run(program, world_size=WORLD, timeout=120.0)
    assert sim == gloo
