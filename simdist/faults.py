"""Deterministic fault injection: crash, timeout, abort, corrupt, delay.

A ``FaultPlan`` is a tuple of ``Fault`` rules. Each rule picks ranks (by global
rank or by layout coordinates), calls (by op name, group axis, and either the
n-th matching call on that rank or a group sequence number) and an effect.
Plans add up (``plan_a + plan_b``) and can be drawn from a seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ._checks import is_int
from .errors import SimulationError, UnsupportedOperationError
from .layout import AXES, COMPOSITE_AXES, Layout

KINDS = ("crash", "timeout", "abort", "corrupt", "delay")
CORRUPT_MODES = ("nan", "inf", "sign", "bitflip")
# The op names simdist's process group records (what a fault's ``op`` matches).
OPS = (
    "all_reduce",
    "all_reduce_coalesced",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "send",
    "recv",
)
_GROUP_AXES = AXES + tuple(COMPOSITE_AXES) + ("world",)

# What a real NCCL watchdog timeout or communicator abort raises.
BackendError: type[Exception] = getattr(dist, "DistBackendError", RuntimeError)


class InjectedFault(SimulationError):
    """Raised in a rank by a ``crash`` fault."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None = None
    where: tuple[tuple[str, int], ...] = ()
    op: str | None = None
    group: str | None = None
    nth: int = 1
    seq: int | None = None
    mode: str = "nan"
    seconds: float = 0.05

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind must be one of {KINDS}, got {self.kind!r}")
        if self.rank is not None and not is_int(self.rank, 0):
            raise ValueError(f"fault rank must be a non-negative int, got {self.rank!r}")
        for axis, index in self.where:
            if axis not in AXES or not isinstance(index, int) or index < 0:
                raise ValueError(
                    f"fault coordinates must be axis=index with axis in {AXES}, got {axis}={index!r}"
                )
        if self.op is not None and self.op not in OPS:
            raise ValueError(f"fault op must be one of {OPS} (or None for any op), got {self.op!r}")
        if self.kind == "corrupt" and self.op in ("barrier", "recv"):
            raise ValueError(
                f"a corrupt fault needs a call that sends data; {self.op!r} sends none "
                f"(corrupt the matching send instead)"
            )
        if self.group is not None and self.group not in _GROUP_AXES:
            raise ValueError(f"fault group must be one of {_GROUP_AXES}, got {self.group!r}")
        if not isinstance(self.nth, int) or self.nth < 1:
            raise ValueError(f"fault nth counts calls from 1, got {self.nth!r}")
        if self.seq is not None and (not isinstance(self.seq, int) or self.seq < 0):
            raise ValueError(f"fault seq must be a non-negative int, got {self.seq!r}")
        if self.mode not in CORRUPT_MODES:
            raise ValueError(f"corrupt mode must be one of {CORRUPT_MODES}, got {self.mode!r}")
        if (
            isinstance(self.seconds, bool)
            or not isinstance(self.seconds, (int, float))
            or not self.seconds >= 0
        ):
            raise ValueError(f"delay seconds must be >= 0, got {self.seconds!r}")

    def check_world(self, layout: Layout | None, world_size: int) -> None:
        """Refuse a fault that could never fire in this world (a typo would
        otherwise make a fault test pass vacuously)."""
        if self.rank is not None and self.rank >= world_size:
            raise ValueError(
                f"fault {self.describe()}: rank {self.rank} is outside the world of size {world_size}"
            )
        if self.where:
            if layout is None:
                raise ValueError(
                    f"fault {self.describe()} selects ranks by coordinates, but the world has no layout"
                )
            for axis, index in self.where:
                if index >= getattr(layout, axis):
                    raise ValueError(f"fault {self.describe()}: {axis}={index} is outside {layout}")
        if layout is None and self.group not in (None, "world"):
            raise ValueError(
                f"fault {self.describe()}: a flat world has no {self.group!r} group, only 'world'"
            )

    def picks_rank(self, rank: int, layout: Layout | None) -> bool:
        if self.rank is not None and rank != self.rank:
            return False
        if self.where:
            if layout is None:
                raise ValueError(
                    f"fault {self.describe()} selects ranks by coordinates, but the world has no layout"
                )
            c = layout.coords(rank)._asdict()
            return all(c[a] == i for a, i in self.where)
        return True

    def picks_call(self, op: str, group_label: str, seq: int) -> bool:
        if self.op is not None and op != self.op:
            return False
        if self.group is not None and self.group not in group_label.split(" ", 1)[0].split("/"):
            return False
        return self.seq is None or seq == self.seq

    def describe(self) -> str:
        who = (
            f"rank {self.rank}"
            if self.rank is not None
            else (" ".join(f"{a}={i}" for a, i in self.where) or "every rank")
        )
        when = f"seq {self.seq}" if self.seq is not None else f"call #{self.nth}"
        return f"{self.kind} {who} at {when} of {self.op or 'any op'} on {self.group or 'any group'}"


def _coords(rank: int | Mapping[str, int] | None) -> tuple[int | None, tuple[tuple[str, int], ...]]:
    if rank is None or isinstance(rank, int):
        return rank, ()
    return None, tuple(sorted(dict(rank).items()))


@dataclass(frozen=True)
class FaultPlan:
    faults: tuple[Fault, ...] = ()

    def __add__(self, other: FaultPlan) -> FaultPlan:
        if not isinstance(other, FaultPlan):
            return NotImplemented
        return FaultPlan(self.faults + other.faults)

    def __bool__(self) -> bool:
        return bool(self.faults)

    @classmethod
    def _one(cls, kind: str, rank: Any, **kw: Any) -> FaultPlan:
        r, where = _coords(rank)
        return cls((Fault(kind, rank=r, where=where, **kw),))

    @classmethod
    def crash(
        cls,
        rank: int | Mapping[str, int],
        *,
        op: str | None = None,
        group: str | None = None,
        nth: int = 1,
        seq: int | None = None,
    ) -> FaultPlan:
        """Raise ``InjectedFault`` in ``rank`` at its nth matching call."""
        return cls._one("crash", rank, op=op, group=group, nth=nth, seq=seq)

    @classmethod
    def timeout(
        cls,
        rank: int | Mapping[str, int],
        *,
        op: str | None = None,
        group: str | None = None,
        nth: int = 1,
        seq: int | None = None,
    ) -> FaultPlan:
        """The call never completes on ``rank``: every member gets a backend error."""
        return cls._one("timeout", rank, op=op, group=group, nth=nth, seq=seq)

    @classmethod
    def abort(
        cls,
        rank: int | Mapping[str, int] | None = None,
        *,
        op: str | None = None,
        group: str | None = None,
        nth: int = 1,
        seq: int | None = None,
    ) -> FaultPlan:
        """Abort the communicator: pending and later calls on it fail on all members."""
        return cls._one("abort", rank, op=op, group=group, nth=nth, seq=seq)

    @classmethod
    def corrupt(
        cls,
        rank: int | Mapping[str, int],
        *,
        mode: str = "nan",
        op: str | None = None,
        group: str | None = None,
        nth: int = 1,
        seq: int | None = None,
    ) -> FaultPlan:
        """Corrupt ``rank``'s contribution: NaN, Inf, a sign flip or a bit flip."""
        return cls._one("corrupt", rank, op=op, group=group, nth=nth, seq=seq, mode=mode)

    @classmethod
    def delay(
        cls,
        rank: int | Mapping[str, int],
        seconds: float = 0.05,
        *,
        op: str | None = None,
        group: str | None = None,
        nth: int = 1,
        seq: int | None = None,
    ) -> FaultPlan:
        """Hold ``rank`` back before the call, to expose arrival-order assumptions."""
        return cls._one("delay", rank, op=op, group=group, nth=nth, seq=seq, seconds=seconds)

    @classmethod
    def random(
        cls,
        seed: int,
        world: Layout | int,
        *,
        count: int = 1,
        kinds: Iterable[str] = KINDS,
        ops: Iterable[str] = ("all_reduce",),
        max_nth: int = 3,
    ) -> FaultPlan:
        """``count`` faults drawn deterministically from ``seed``."""
        rng = random.Random(seed)
        kinds, ops = tuple(kinds), tuple(ops)
        if not kinds or not ops:
            raise ValueError(
                f"FaultPlan.random needs at least one kind and one op, got kinds={kinds} ops={ops}"
            )
        size = world.world_size if isinstance(world, Layout) else int(world)
        faults = tuple(
            Fault(
                rng.choice(kinds),
                rank=rng.randrange(size),
                op=rng.choice(ops),
                nth=rng.randint(1, max_nth),
                mode=rng.choice(CORRUPT_MODES),
            )
            for _ in range(count)
        )
        return cls(faults)


# Ops whose contribution is also the output buffer, overwritten by the result,
# or (send) already simdist's own snapshot: damaging it in place is the same as
# damaging it on the wire.
_IN_PLACE_OPS = frozenset({"all_reduce", "all_reduce_coalesced", "reduce", "send"})


def corrupt_contribution(op: str, payload: dict[str, Any], mode: str) -> None:
    """Damage what a rank contributes to a call, leaving the caller's input
    buffer intact unless the op overwrites it anyway."""
    for key in ("t", "in", "ins", "ts"):
        if key not in payload:
            continue
        value = payload[key]
        tensors = list(value) if isinstance(value, (list, tuple)) else [value]
        if op not in _IN_PLACE_OPS:
            tensors = [t.clone() for t in tensors]
            payload[key] = tensors if isinstance(value, (list, tuple)) else tensors[0]
        for t in tensors:
            corrupt_(t, mode)
        return


def corrupt_(t: torch.Tensor, mode: str) -> None:
    """Damage the first element of ``t`` in place."""
    if t.numel() == 0:
        return
    # A one-element view of element [0, ..., 0] whatever the strides
    # (reshape would copy a non-contiguous tensor, and the damage would be lost).
    first = t.as_strided((1,), (1,))
    if mode in ("nan", "inf"):
        if not t.dtype.is_floating_point:
            raise UnsupportedOperationError(f"corrupt mode {mode!r} needs a floating tensor, got {t.dtype}")
        first.fill_(float("nan") if mode == "nan" else float("inf"))
    elif mode == "sign":
        if t.dtype == torch.bool:
            first.logical_not_()
        else:
            first.neg_()
    else:  # bitflip: the top exponent bit for floats, the lowest bit for integers
        if t.dtype == torch.bool:
            first.logical_not_()
        elif t.dtype.is_floating_point:
            bits = {
                torch.float64: torch.int64,
                torch.float32: torch.int32,
                torch.float16: torch.int16,
                torch.bfloat16: torch.int16,
            }[t.dtype]
            # Bit width-2 is the exponent's top bit: flipping it turns a normal
            # number into a huge or tiny one, like a real memory bit flip.
            first.view(bits).bitwise_xor_(1 << (torch.finfo(t.dtype).bits - 2))
        else:
            first.bitwise_xor_(1)


class FaultState:
    """A plan applied to one world: counts each rule's matches per rank."""

    def __init__(self, plan: FaultPlan, layout: Layout | None, world_size: int) -> None:
        for fault in plan.faults:
            fault.check_world(layout, world_size)
        self.plan = plan
        self.layout = layout
        self._counts: dict[tuple[int, int], int] = {}
        self.fired: list[str] = []

    def due(self, rank: int, op: str, group_label: str, seq: int) -> list[Fault]:
        hits = []
        for i, f in enumerate(self.plan.faults):
            if not (f.picks_rank(rank, self.layout) and f.picks_call(op, group_label, seq)):
                continue
            if f.seq is not None:
                hits.append(f)
                continue
            n = self._counts.get((i, rank), 0) + 1  # only this rank's thread writes this key
            self._counts[(i, rank)] = n
            if n == f.nth:
                hits.append(f)
        for f in hits:
            self.fired.append(f"rank {rank}: {f.describe()} -> {op} on {group_label} seq {seq}")
        return hits
