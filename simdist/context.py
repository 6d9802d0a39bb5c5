"""What a rank's body receives: its rank, layout coordinates and process groups.

The same ``RankContext`` is handed out by the simulated world (``simdist.run``)
and by real gloo/NCCL worlds (``simdist.launch``), so one body runs on both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .layout import AXES, COMPOSITE_AXES, Coords, Layout


@dataclass(frozen=True)
class Groups:
    """Process groups of one rank: ``world`` always, layout axes when a layout was given."""

    world: dist.ProcessGroup
    by_axis: dict[str, dist.ProcessGroup] = field(default_factory=dict)

    def __getattr__(self, name: str) -> dist.ProcessGroup:
        # Only reached when normal lookup fails: give a clear error for axes of a
        # flat world instead of a bare AttributeError.
        by_axis = self.__dict__.get("by_axis", {})
        if name in by_axis:
            return by_axis[name]
        if name in AXES or name in COMPOSITE_AXES:
            raise AttributeError(
                f"no {name!r} group: this world has no layout (run(..., world_size=N)); "
                f"pass layout=Layout(...) to get tp/cp/dp/pp groups"
            )
        raise AttributeError(name)

    def __getitem__(self, name: str) -> dist.ProcessGroup:
        if name == "world":
            return self.world
        return getattr(self, name)


@dataclass(frozen=True)
class RankContext:
    """Everything a rank's body needs to know about itself."""

    rank: int
    world_size: int
    layout: Layout | None
    device: torch.device
    groups: Groups
    attempt: int = 0  # 0 on the first run; run_with_retry counts retries from 1
    seed: int = 0
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def coords(self) -> Coords | None:
        """(tp, cp, dp, pp) of this rank, or None in a flat world."""
        return None if self.layout is None else self.layout.coords(self.rank)


def build_groups(layout: Layout | None) -> Groups:
    """Create this rank's layout groups with ``dist.new_group``.

    Only members call ``new_group`` (``use_local_synchronization=True``), so a
    64-rank world does not make every rank create every group. Axes with the
    same members (dp and dp_cp when cp == 1, say) share one group: c10d names
    such groups by a hash of their ranks, so a second one could not be created.
    """
    world = dist.group.WORLD
    assert world is not None, "build_groups needs an initialised default group"
    if layout is None:
        return Groups(world=world)
    rank = dist.get_rank()
    axes = AXES + tuple(COMPOSITE_AXES)
    members = {axis: tuple(layout.group_of(axis, rank)) for axis in axes}
    made: dict[tuple[int, ...], dist.ProcessGroup] = {}
    by_axis: dict[str, dist.ProcessGroup] = {}
    for axis in axes:
        ranks = members[axis]
        if ranks not in made:
            # The description names every axis sharing the group ("dp/dp_cp");
            # it is identical on all members, and reports use it.
            desc = "/".join(a for a in axes if members[a] == ranks)
            made[ranks] = dist.new_group(list(ranks), use_local_synchronization=True, group_desc=desc)
        by_axis[axis] = made[ranks]
    return Groups(world=world, by_axis=by_axis)
