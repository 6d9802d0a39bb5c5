"""Registering the simdist backend with c10d: its factory builds a rank's group."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .current import current_world
from .process_group import BACKEND_NAME, SimProcessGroup


def _create(backend_opts: Any, pg_options: Any) -> SimProcessGroup:
    world, rank = current_world()
    # No ranks listed: the world group, whose ranks tuple the world keeps once
    # (built per rank, it cost O(world) each: O(world^2) for a run's start).
    given = backend_opts.global_ranks_in_group
    ranks = tuple(given) if given else world.all_ranks
    info = world.register_group(str(backend_opts.group_id), ranks, rank)
    return SimProcessGroup(world, rank, info)


def register_backend() -> None:
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
