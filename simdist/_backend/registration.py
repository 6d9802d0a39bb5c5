"""Registering the simdist backend with c10d: its factory builds a rank's group."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .current import current_world
from .process_group import BACKEND_NAME, SimProcessGroup


def _create(backend_opts: Any, pg_options: Any) -> SimProcessGroup:
    world, rank = current_world()
    ranks = list(backend_opts.global_ranks_in_group) or list(range(world.scheduler.world_size))
    info = world.register_group(str(backend_opts.group_id), tuple(ranks), rank)
    return SimProcessGroup(world, rank, info)


def register_backend() -> None:
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
