"""Rank layouts: global ranks <-> (tp, cp, dp, pp) coordinates, and group rank lists.

Megatron's order: tp varies fastest, then cp, then dp, then pp, so
``rank = tp + TP * (cp + CP * (dp + DP * pp))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ._checks import is_int

AXES: tuple[str, ...] = ("tp", "cp", "dp", "pp")
# Composite groups: the axes that vary inside one group.
COMPOSITE_AXES: dict[str, tuple[str, ...]] = {
    "dp_cp": ("cp", "dp"),
    "mp": ("tp", "pp"),
}
GROUP_NAMES: tuple[str, ...] = AXES + tuple(COMPOSITE_AXES) + ("world",)


class Coords(NamedTuple):
    """A rank's position along each axis of a ``Layout`` (``ctx.coords``, ``Layout.coords(rank)``)."""

    tp: int
    cp: int
    dp: int
    pp: int


@dataclass(frozen=True)
class Layout:
    """A DP/PP/TP/CP layout. ``world_size`` may be given to have it checked."""

    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    world_size: int | None = None

    def __post_init__(self) -> None:
        for axis in AXES:
            size = getattr(self, axis)
            if not is_int(size, 1):
                raise ValueError(f"Layout.{axis} must be a positive int, got {size!r} ({self._describe()})")
        product = self.tp * self.cp * self.dp * self.pp
        if self.world_size is None:
            object.__setattr__(self, "world_size", product)
        elif not is_int(self.world_size) or self.world_size != product:
            raise ValueError(
                f"dp({self.dp}) * cp({self.cp}) * tp({self.tp}) * pp({self.pp}) "
                f"= {product} != world_size({self.world_size!r})"
            )

    def _describe(self) -> str:
        return ", ".join(f"{a}={getattr(self, a)!r}" for a in AXES)

    # Properties instead of scattered `> 1` tests in user code.
    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    def sizes(self) -> dict[str, int]:
        return {axis: getattr(self, axis) for axis in AXES}

    def coords(self, rank: int) -> Coords:
        """The (tp, cp, dp, pp) coordinates of a global rank."""
        self._check_rank(rank)
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        dp, pp = rest % self.dp, rest // self.dp
        return Coords(tp=tp, cp=cp, dp=dp, pp=pp)

    def rank_of(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """The global rank at the given coordinates (missing axes are 0)."""
        given = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
        for axis, index in given.items():
            size = getattr(self, axis)
            if not is_int(index, 0, size):
                raise ValueError(f"{axis} index must be an int in [0, {size}), got {index!r}")
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def group_ranks(self, axis: str) -> list[list[int]]:
        """Rank lists of every group along ``axis``, each sorted, ordered by first rank.

        ``axis`` is one of "tp", "cp", "dp", "pp", "dp_cp", "mp" (tp x pp) or
        "world".
        """
        # Each group once, from its lowest rank: O(world) in all (every rank of
        # a Megatron-style program may list every group). An unknown axis is
        # refused by group_of, on rank 0.
        groups: list[list[int]] = []
        placed = bytearray(self.world_size)  # type: ignore[arg-type]  # set by __post_init__
        for rank in range(self.world_size):  # type: ignore[arg-type]  # set by __post_init__
            if not placed[rank]:
                ranks = self.group_of(axis, rank)
                for r in ranks:
                    placed[r] = 1
                groups.append(ranks)
        return groups

    def group_of(self, axis: str, rank: int) -> list[int]:
        """The ranks of the ``axis`` group that contains ``rank``, sorted.

        Computed from ``rank``'s coordinates in O(group size), not by listing
        every group: each rank of a 4096-rank world calls this for each axis.
        """
        self._check_rank(rank)
        if axis == "world":
            return list(range(self.world_size))  # type: ignore[arg-type]  # set by __post_init__
        if axis in AXES:
            varying: tuple[str, ...] = (axis,)
        elif axis in COMPOSITE_AXES:
            varying = COMPOSITE_AXES[axis]
        else:
            raise ValueError(f"unknown layout axis {axis!r}; expected one of {', '.join(GROUP_NAMES)}")
        # Rank = sum of coordinate * stride (Megatron order); members differ
        # from ``rank`` only in the varying axes' terms.
        coords = self.coords(rank)._asdict()
        stride, strides = 1, {}
        for a in AXES:
            strides[a] = stride
            stride *= getattr(self, a)
        ranks = [rank - sum(coords[a] * strides[a] for a in varying)]
        for a in varying:
            ranks = [r + i * strides[a] for r in ranks for i in range(getattr(self, a))]
        return sorted(ranks)

    def _check_rank(self, rank: int) -> None:
        if not is_int(rank, 0, self.world_size):
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {rank!r}")

    def __str__(self) -> str:
        return f"Layout(tp={self.tp}, cp={self.cp}, dp={self.dp}, pp={self.pp})"
