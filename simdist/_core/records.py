"""What a rank can wait on, and the records matching builds.

A ``Waitable`` names the global ranks that must still act for it to complete
(``needed_ranks``): the wait-for graph of deadlock detection is built from
these alone, so every kind of wait says who can end it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import SimulationError, consequence_mark


class RankState(enum.Enum):
    RUNNING = "running"
    WAITING = "waiting"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(eq=False)
class GroupInfo:
    """A communicator: its c10d name, member global ranks (group-rank order), label.

    Shared by the members' group objects; the label is refined once c10d tells
    a group its description (e.g. "dp/dp_cp"), hence mutable.
    """

    name: str
    ranks: tuple[int, ...]
    label: str
    # The program asked for NCCL (``new_group(backend="nccl")``): the sanitizer
    # then holds its async calls to NCCL's cross-communicator ordering rule.
    nccl: bool = False

    def describe(self) -> str:
        return f"{self.label} {list(self.ranks)}"


class Call:
    """One rank's part of a collective (built on every call, hence slots)."""

    __slots__ = (
        "fingerprint",
        "group_rank",
        "inference",
        "injected",
        "landing",
        "op",
        "payload",
        "rank",
        "record",
        "site",
    )

    def __init__(
        self,
        op: str,
        rank: int,
        group_rank: int,
        fingerprint: tuple[tuple[str, Any], ...],
        site: str,
        payload: dict[str, Any],
        inference: bool = False,
    ) -> None:
        self.op = op
        self.rank = rank
        self.group_rank = group_rank
        self.fingerprint = fingerprint
        self.site = site
        self.payload = payload
        self.inference = inference  # an inference tensor is written: complete in inference mode
        self.record: Any = None  # the flight recorder's entry
        self.injected: BaseException | None = None  # a fault that fails the whole call
        # Run on what this rank receives once the call completes (a corrupt
        # fault on a rank that contributes nothing to the call).
        self.landing: Callable[[], None] | None = None


class Waitable:
    """Something a rank can wait on: a collective instance or a P2P operation."""

    done: bool = False
    error: SimulationError | BaseException | None = None
    # Main threads waiting on it right now (kept by ``Slots``): the deadlock
    # check's O(1) common case reads it.
    waiters: int = 0

    def needed_ranks(self) -> Sequence[int]:
        """Global ranks that must still act for this to complete."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class PendingCollective(Waitable):
    def __init__(self, group: GroupInfo, seq: int) -> None:
        self.group = group
        self.seq = seq
        self.calls: dict[int, Call] = {}
        self.done = False
        self.error = None
        self.completing = False

    def needed_ranks(self) -> Sequence[int]:
        if self.completing or self.done:
            return ()
        return [r for i, r in enumerate(self.group.ranks) if i not in self.calls]

    def describe(self) -> str:
        ops = sorted({c.op for c in self.calls.values()})
        return f"{'/'.join(ops)} on {self.group.describe()} seq {self.seq}"


@dataclass(eq=False)
class P2POp(Waitable):
    kind: str  # "send" or "recv"
    group: GroupInfo
    src: int  # global ranks
    dst: int
    tag: int
    tensor: Any
    site: str
    done: bool = False
    error: BaseException | None = None
    record: Any = None  # the flight recorder's entry

    @property
    def owner(self) -> int:
        """The rank that posted it."""
        return self.src if self.kind == "send" else self.dst

    @property
    def peer(self) -> int:
        return self.dst if self.kind == "send" else self.src

    def needed_ranks(self) -> Sequence[int]:
        if self.done:
            return ()
        return [self.dst if self.kind == "send" else self.src]

    def describe(self) -> str:
        if self.kind == "send":
            return f"send to rank {self.dst} (tag {self.tag}) on {self.group.describe()}"
        return f"recv from rank {self.src} (tag {self.tag}) on {self.group.describe()}"


class ThreadExit(Waitable):
    """A wait for threads of the waiter's own rank to end (a join of a helper
    thread, or a rank's end waiting for its helpers): only that rank's other
    threads can complete it."""

    def __init__(self, rank: int, what: str) -> None:
        self.rank = rank
        self.what = what
        self.done = False
        self.error = None

    def needed_ranks(self) -> Sequence[int]:
        return () if self.done else (self.rank,)

    def describe(self) -> str:
        return self.what


def consequence_origin(exc: BaseException, rank: int) -> int | None:
    """The failed rank ``exc`` is a consequence of, or None when ``rank``
    raised it on its own.

    simdist marks the errors it delivers because of another rank
    (``PeerFailedError``, a communicator aborted elsewhere) with
    ``errors.mark_consequence``; a body may wrap them (``raise X from err``) or raise
    while handling them, so the whole cause/context chain is searched.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        origin = consequence_mark(e)
        if origin is not None and origin != rank:
            return origin
        todo += [e.__cause__, e.__context__]
    return None


def copy_error(error: BaseException) -> BaseException:
    """A fresh instance per rank, so tracebacks of different threads don't mix."""
    try:
        fresh = type(error)(*error.args)
    except Exception:
        return error
    fresh.__cause__ = error.__cause__
    fresh.__dict__.update(getattr(error, "__dict__", {}))
    return fresh
