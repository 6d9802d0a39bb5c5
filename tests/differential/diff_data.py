"""Every rank's data for a differential program, the same in both worlds.

Values come from generators seeded by (program seed, rank, step, purpose), so
simdist's threads and gloo's processes build bitwise-identical inputs; shapes
that all ranks must agree on (uneven all_to_all sizes) use rank -1.
A tensor the call writes lives in a bigger buffer ("view"), the rest of which
holds a sentinel, so a write outside the view shows in the buffer.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
    "complex64": torch.complex64,
}
SENTINEL = 7


def generator(seed: int, rank: int, index: int, tag: str) -> torch.Generator:
    mixed = (seed * 1_000_003 + (rank + 1) * 7_919 + index * 104_729 + zlib.crc32(tag.encode())) % (2**63)
    return torch.Generator().manual_seed(mixed)


def values(gen: torch.Generator, shape: list[int], dtype: torch.dtype, kind: str) -> torch.Tensor:
    """Small integers (exact in every dtype, sums and products of six included)
    or normal floats; uint8 and bool stay non-negative."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if kind == "randn" and (dtype.is_floating_point or dtype.is_complex):
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    low = 0 if dtype == torch.uint8 else -3
    ints = torch.randint(low, 4, shape, generator=gen)
    if dtype.is_complex:
        return torch.complex(ints.double(), torch.randint(-3, 4, shape, generator=gen).double()).to(dtype)
    return ints.to(dtype)


def placed(data: torch.Tensor, view: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, tensor): ``tensor`` holds ``data`` and views ``buffer`` as asked."""
    shape = list(data.shape)
    fill = True if data.dtype == torch.bool else SENTINEL
    if view == "offset":
        buffer = torch.full((data.numel() + 3,), fill, dtype=data.dtype, device=data.device)
        tensor = buffer[3:].view(shape)
    elif view == "strided" and len(shape) >= 1:
        buffer = torch.full((*shape[:-1], 2 * shape[-1]), fill, dtype=data.dtype, device=data.device)
        tensor = buffer[..., ::2]
    elif view == "transposed" and len(shape) >= 2:
        buffer = torch.full((*shape[:-2], shape[-1], shape[-2]), fill, dtype=data.dtype, device=data.device)
        tensor = buffer.transpose(-1, -2)
    else:
        buffer = torch.empty(shape, dtype=data.dtype, device=data.device)
        tensor = buffer
    tensor.copy_(data)
    return buffer, tensor


def obj_for(seed: int, rank: int, index: int) -> dict[str, Any]:
    """A picklable per-rank object (object collectives)."""
    gen = generator(seed, rank, index, "object")
    n = int(torch.randint(0, 4, (1,), generator=gen))
    return {"rank": rank, "values": torch.randint(-9, 10, (n,), generator=gen).tolist(), "name": "r" * n}


def uneven_sizes(seed: int, index: int, n: int) -> list[list[int]]:
    """sizes[i][j]: rows rank i sends to rank j (0..2; the same on every rank)."""
    gen = generator(seed, -1, index, "uneven")
    return torch.randint(0, 3, (n, n), generator=gen).tolist()
