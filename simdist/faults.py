"""Deterministic fault injection: crash, timeout, abort, corrupt, delay.

A ``FaultPlan`` is a tuple of ``Fault`` rules. Each rule picks ranks (by global
rank or by layout coordinates), calls (by op name, group axis, and either the
n-th matching call on that rank or a group sequence number) and an effect.
Plans add up (``plan_a + plan_b``) and can be drawn from a seed.
"""

from __future__ import annotations

import random
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ._backend.ops import OPS as _OP_TABLE
from ._checks import is_int, is_number
from .errors import SimulationError
from .layout import AXES, GROUP_NAMES, Layout

KINDS = ("crash", "timeout", "abort", "corrupt", "delay")
CORRUPT_MODES = ("nan", "inf", "sign", "bitflip")
# The op names simdist's process group records (what a fault's ``op`` matches).
OPS = tuple(_OP_TABLE)
# Ops that carry no data of the rank's own: nothing for a corrupt fault to damage.
_SENDS_NOTHING = tuple(name for name, spec in _OP_TABLE.items() if not spec.sent)

# What a real NCCL watchdog timeout or communicator abort raises.
BackendError: type[Exception] = getattr(dist, "DistBackendError", RuntimeError)


class InjectedFault(SimulationError):
    """Raised in a rank by a ``crash`` fault."""


class UnfiredFaultPlanWarning(UserWarning):
    """A run's ``FaultPlan`` had rules and none of them matched a call: the run
    tested a clean world, not the fault it was meant to."""


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
        if self.kind == "corrupt" and self.op in _SENDS_NOTHING:
            raise ValueError(
                f"a corrupt fault needs a call that sends data; {self.op!r} sends none "
                f"(corrupt the matching send instead)"
            )
        if self.group is not None and self.group not in GROUP_NAMES:
            raise ValueError(f"fault group must be one of {GROUP_NAMES}, got {self.group!r}")
        if not isinstance(self.nth, int) or self.nth < 1:
            raise ValueError(f"fault nth counts calls from 1, got {self.nth!r}")
        if self.seq is not None and (not isinstance(self.seq, int) or self.seq < 0):
            raise ValueError(f"fault seq must be a non-negative int, got {self.seq!r}")
        if self.mode not in CORRUPT_MODES:
            raise ValueError(f"corrupt mode must be one of {CORRUPT_MODES}, got {self.mode!r}")
        if not is_number(self.seconds) or not self.seconds >= 0:
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

    def picks_call(self, op: str, group: Any, seq: int) -> bool:
        """Whether a call matches; ``group`` is the communicator (its ``axes``).
        A corrupt fault never matches a call that carries none of its rank's
        data (a barrier, a recv: corrupt the matching send)."""
        if self.op is not None and op != self.op:
            return False
        if self.kind == "corrupt" and op in _SENDS_NOTHING:
            return False
        if self.group is not None and self.group not in group.axes:
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
        """``count`` faults drawn deterministically from ``seed``.

        Only valid faults are drawn from ``kinds`` x ``ops``: a corrupt fault
        only on an op that sends data (never ``barrier`` or ``recv``), so every
        seed gives a plan ``run`` accepts; ``ValueError`` when no pair is valid.
        """
        rng = random.Random(seed)
        kinds, ops = tuple(kinds), tuple(ops)
        if not kinds or not ops:
            raise ValueError(
                f"FaultPlan.random needs at least one kind and one op, got kinds={kinds} ops={ops}"
            )
        valid = {k: tuple(o for o in ops if not (k == "corrupt" and o in _SENDS_NOTHING)) for k in kinds}
        usable = tuple(k for k in kinds if valid[k])
        if not usable:
            raise ValueError(
                f"FaultPlan.random: no valid fault among kinds={kinds} ops={ops} "
                f"(a corrupt fault needs an op that sends data, not {_SENDS_NOTHING})"
            )
        # A Layout's world_size is always set once it is built (__post_init__).
        size = int(world.world_size or 0) if isinstance(world, Layout) else int(world)
        faults = []
        for _ in range(count):
            # Drawn in the order plans always were (a seed's valid plan stays
            # the same); an invalid pair is redrawn among the valid ones.
            kind = rng.choice(kinds)
            rank = rng.randrange(size)
            op = rng.choice(ops)
            if not valid.get(kind):
                kind = rng.choice(usable)
            if op not in valid[kind]:
                op = rng.choice(valid[kind])
            faults.append(
                Fault(kind, rank=rank, op=op, nth=rng.randint(1, max_nth), mode=rng.choice(CORRUPT_MODES))
            )
        return cls(tuple(faults))


class FaultState:
    """A plan applied to one world: counts each rule's matches per rank."""

    def __init__(self, plan: FaultPlan, layout: Layout | None, world_size: int) -> None:
        for fault in plan.faults:
            fault.check_world(layout, world_size)
        self.plan = plan
        self.layout = layout
        self._counts: dict[tuple[int, int], int] = {}
        self.fired: list[str] = []
        # (op, group label) of every call checked, for the never-fired report.
        self._calls: dict[tuple[str, str], int] = {}
        # A rank's helper threads (pool workers) call alongside its main thread
        # and alongside other ranks (concurrent mode): each count is read and
        # written under this lock, or a lost count moves or skips the nth call.
        self._lock = threading.Lock()

    def due(self, rank: int, op: str, group: Any, seq: int) -> list[Fault]:
        key = (op, getattr(group, "label", "?"))
        hits = []
        with self._lock:
            self._calls[key] = self._calls.get(key, 0) + 1
            for i, f in enumerate(self.plan.faults):
                if not (f.picks_rank(rank, self.layout) and f.picks_call(op, group, seq)):
                    continue
                if f.seq is not None:
                    hits.append(f)
                    continue
                n = self._counts.get((i, rank), 0) + 1
                self._counts[(i, rank)] = n
                if n == f.nth:
                    hits.append(f)
        return hits

    def fired_at(self, rank: int, fault: Fault, op: str, group: Any, seq: int) -> None:
        """A fault ``due`` returned took effect (a corrupt one: it changed a bit)."""
        with self._lock:
            self.fired.append(f"rank {rank}: {fault.describe()} -> {op} on {group.describe()} seq {seq}")

    @property
    def never_fired(self) -> bool:
        """The plan had rules and none of them matched a call."""
        return bool(self.plan.faults) and not self.fired

    def unfired_message(self) -> str:
        rules = "; ".join(f.describe() for f in self.plan.faults)
        calls = ", ".join(f"{op} on {label} x{n}" for (op, label), n in sorted(self._calls.items()))
        return (
            f"the FaultPlan matched no call, so none of its {len(self.plan.faults)} rule(s) fired and "
            f"the run tested a clean world, not a fault: {rules}. The run's calls (all ranks): "
            f"{calls or 'none'}. Check each rule's op, group, rank and nth/seq against them."
        )


_unfired_listeners: list[Callable[[FaultState], None]] = []
_listeners_lock = threading.Lock()


def on_unfired(listener: Callable[[FaultState], None]) -> Callable[[], None]:
    """Call ``listener(state)`` whenever a run ends with a plan that never fired
    (the fuzz campaign counts such cases); returns a callable that removes it."""
    with _listeners_lock:
        _unfired_listeners.append(listener)

    def remove() -> None:
        with _listeners_lock:
            if listener in _unfired_listeners:
                _unfired_listeners.remove(listener)

    return remove


def report_unfired(state: FaultState | None) -> None:
    """At a run's end: warn (``UnfiredFaultPlanWarning``) when its plan never fired."""
    if state is None or not state.never_fired:
        return
    with _listeners_lock:
        listeners = list(_unfired_listeners)
    for listener in listeners:
        listener(state)
    warnings.warn(UnfiredFaultPlanWarning(state.unfired_message()), stacklevel=_caller_level())


def _caller_level() -> int:
    """The stack level of the first frame outside simdist (the user's call of run)."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "simdist":
        frame = frame.f_back  # type: ignore[assignment]  # f_back may be None; the loop checks it
        level += 1
    return level
