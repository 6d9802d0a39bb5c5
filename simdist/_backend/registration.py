"""Registering the simdist backend with c10d, and what a group needs from its world."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .._core.records import Call, GroupInfo, P2POp
from .._core.scheduler import Scheduler
from .current import current_world
from .process_group import BACKEND_NAME, SimProcessGroup


class WorldHooks:
    """What a group needs from its world (implemented by ``world.World``)."""

    scheduler: Scheduler
    reduction: Any

    def register_group(self, name: str, ranks: tuple[int, ...], rank: int) -> GroupInfo:
        raise NotImplementedError

    def label_group(self, name: str, label: str) -> None: ...
    def before_call(self, call: Call, group: GroupInfo, seq: int) -> None: ...
    def before_p2p(self, op: P2POp) -> None: ...
    def verify(self, group: GroupInfo, seq: int, calls: list[Call]) -> None: ...


def _create(backend_opts: Any, pg_options: Any) -> SimProcessGroup:
    world, rank = current_world()
    ranks = list(backend_opts.global_ranks_in_group) or list(range(world.scheduler.world_size))
    info = world.register_group(str(backend_opts.group_id), tuple(ranks), rank)
    return SimProcessGroup(world, rank, info)


def register_backend() -> None:
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
