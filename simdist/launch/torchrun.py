"""Under torchrun: the current process is one rank of a launched world."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .._run.options import resolve_world
from ..context import RankContext, build_groups
from ..layout import Layout

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """True when torchrun (or a similar launcher) has set this process's rank."""
    return all(name in os.environ for name in _TORCHRUN_VARS)


def run_torchrun_rank(
    fn: Callable[..., Any],
    *,
    layout: Layout | None = None,
    backend: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """Run ``fn(ctx, *args, **kwargs)`` as this process's rank of a torchrun job.

    The default group comes from the environment (``env://``); the layout's
    groups are built as in ``run_processes``. ``backend`` defaults to NCCL when
    CUDA is available, gloo otherwise. Returns this rank's result.
    """
    missing = [name for name in _TORCHRUN_VARS if name not in os.environ]
    if missing:
        raise RuntimeError(f"run_torchrun_rank needs torchrun's environment; missing {', '.join(missing)}")
    world_size = int(os.environ["WORLD_SIZE"])
    if layout is not None:
        resolve_world(layout, None)  # a Layout, or run's TypeError
        if layout.world_size != world_size:
            raise ValueError(f"{layout} has world size {layout.world_size}, torchrun started {world_size}")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend, init_method="env://")
    try:
        ctx = RankContext(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            layout=layout,
            device=device,
            groups=build_groups(layout),
            extras={"backend": backend},
        )
        return fn(ctx, *args, **(kwargs or {}))
    finally:
        if owns_group:
            dist.destroy_process_group()
