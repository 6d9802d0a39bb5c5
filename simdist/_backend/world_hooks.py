"""What a group needs from its world: the interface ``_run.world.World`` implements.

Its own module so that the process group, the rank readers (``current``) and
the c10d registration can all name it without importing one another.
"""

from __future__ import annotations

from typing import Any

from .._core.records import Call, GroupInfo, P2POp
from .._core.scheduler import Scheduler


class WorldHooks:
    """What a group needs from its world (implemented by ``world.World``)."""

    scheduler: Scheduler
    reduction: Any
    all_ranks: tuple[int, ...]  # the world group's ranks

    def register_group(self, name: str, ranks: tuple[int, ...], rank: int) -> GroupInfo:
        raise NotImplementedError

    def label_group(self, name: str, label: str) -> None: ...
    def before_call(self, call: Call, group: GroupInfo, seq: int) -> None: ...
    def before_p2p(self, op: P2POp) -> None: ...
    def verify(self, group: GroupInfo, seq: int, calls: list[Call]) -> None: ...
