"""The process groups of one rank of the reference model, and the checks that they fit the job."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

AXES = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class ParallelGroups:
    """Process groups of this rank; None means the axis is absent (size 1).

    ``dp_cp`` is the group of the DP and CP ranks holding one TP/PP shard of
    the model (Megatron's data-parallel group with context parallelism); it is
    needed only when both dp and cp have more than one rank (otherwise it is
    the one that has).
    """

    tp: dist.ProcessGroup | None = None
    cp: dist.ProcessGroup | None = None
    dp: dist.ProcessGroup | None = None
    pp: dist.ProcessGroup | None = None
    dp_cp: dist.ProcessGroup | None = None

    def data_parallel(self) -> dist.ProcessGroup | None:
        """The group counts and gradients are summed over: DP x CP."""
        if self.dp_cp is not None:
            return self.dp_cp
        if self.cp is None:
            return self.dp
        if self.dp is None:
            return self.cp
        raise ValueError(
            f"ParallelGroups: dp ({self.size('dp')} ranks) and cp ({self.size('cp')} ranks) are both "
            "present, so the dp_cp group (their product) must be given too"
        )

    def rank(self, axis: str) -> int:
        group = getattr(self, axis)
        return 0 if group is None else dist.get_rank(group)

    def size(self, axis: str) -> int:
        group = getattr(self, axis)
        return 1 if group is None else dist.get_world_size(group)

    def coordinates(self) -> dict[str, tuple[int, int]]:
        """``{axis: (rank, size)}`` of this rank on every axis."""
        return {axis: (self.rank(axis), self.size(axis)) for axis in AXES}


def world_group() -> dist.ProcessGroup | None:
    """Every rank of the job, or None for a single process without torch.distributed."""
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def check_groups_fit_the_job(groups: ParallelGroups) -> None:
    """The DP x CP group is the product of dp and cp, and tp x cp x dp x pp ranks make up the whole world."""
    data_size = groups.size("dp") * groups.size("cp")
    data_group = groups.data_parallel()
    if (1 if data_group is None else dist.get_world_size(data_group)) != data_size:
        raise ValueError(
            f"CotrainWorker: the dp_cp group must have dp x cp = {groups.size('dp')} x {groups.size('cp')} "
            f"= {data_size} ranks, got {dist.get_world_size(data_group) if data_group is not None else 1}"
        )
    world = world_group()
    model_size = data_size * groups.size("tp") * groups.size("pp")
    if world is not None and dist.get_world_size(world) != model_size:
        # The commit agreement and the grad-norm agreement are world
        # collectives: ranks without a worker would never join them.
        raise ValueError(
            f"CotrainWorker: every rank of the job must run a worker: tp x cp x dp x pp = "
            f"{groups.size('tp')} x {groups.size('cp')} x {groups.size('dp')} x {groups.size('pp')} "
            f"= {model_size}, but the world has {dist.get_world_size(world)} ranks"
        )
