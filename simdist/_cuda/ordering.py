"""CUDA's stream ordering rules on emulated devices (part of the collective sanitizer).

An emulated rank runs every kernel in program order, so the values never
race; this module applies CSAN's rule (docs/cuda.md) to what the program
asked for, and raises ``AsyncRaceError`` naming both accesses, deterministically.

Each stream counts its kernels (``seq``) and keeps, per other stream, the
last kernel of it known to have happened before its own next one (a vector
clock, ``seen``); the host keeps one too (what it synchronised with), which
every stream's next kernel inherits. Memory is tracked per storage, as CSAN
does. A collective runs on its group's communicator stream, which first
waits for the current stream's work at the call.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from .. import stacks
from ..errors import AsyncRaceError

_ids = itertools.count(1_000_000)  # communicator streams (emulated streams count from 1)


class Clock:
    """A stream's kernel count and what it has seen of the others."""

    __slots__ = ("id", "seen", "seq")

    def __init__(self, ident: int) -> None:
        self.id = ident
        self.seq = 0
        self.seen: dict[int, int] = {}

    def learn(self, other: Clock | dict[int, int], up_to: tuple[int, int] | None = None) -> None:
        """Everything ``other`` has seen (and ``up_to``: a stream and kernel) happened before."""
        seen = other.seen if isinstance(other, Clock) else other
        mine = self.seen
        for stream, seq in seen.items():
            if mine.get(stream, 0) < seq:
                mine[stream] = seq
        if up_to is not None and mine.get(up_to[0], 0) < up_to[1]:
            mine[up_to[0]] = up_to[1]


class RankOrder:
    """One rank's record of which stream last wrote and read each storage."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.host = Clock(0)
        self.streams: dict[int, Clock] = {}  # every stream the rank used, by id
        self.writes: dict[int, tuple[int, int, str]] = {}  # storage -> (stream, seq, what)
        self.reads: dict[int, dict[int, tuple[int, str]]] = {}  # storage -> stream -> (seq, what)
        # id(work) -> what its communicator stream had seen, and its own kernel
        self.collectives: dict[int, tuple[dict[int, int], tuple[int, int]]] = {}
        self.communicators: dict[str, Clock] = {}  # group -> its stream
        self.labels: dict[int, str] = {}  # stream id -> how messages name it
        # A free that broke the caching allocator's rule (memory.py): raised at
        # the rank's next kernel, collective or the end of its body.
        self.pending: AsyncRaceError | None = None

    def _happened(self, clock: Clock, stream: int, seq: int) -> bool:
        return stream == clock.id or clock.seen.get(stream, 0) >= seq or self.host.seen.get(stream, 0) >= seq

    def access(
        self, clock: Clock, accesses: list[tuple[int, bool]], what: str, name: Any, made: Sequence[int] = ()
    ) -> None:
        """A kernel on ``clock``'s stream touching storages (``(key, writes)``)
        and writing the new ones it ``made`` (whose memory may have held a freed
        tensor: their old records go)."""
        self.streams[clock.id] = clock
        if self.pending is not None:
            self.raise_pending()
        for key, writes in accesses:
            last = self.writes.get(key)
            if last is not None and not self._happened(clock, last[0], last[1]):
                raise _race(self.rank, what, name(clock.id), last[2], name(last[0]), writes, "wrote")
            if writes:
                for stream, (seq, earlier) in self.reads.get(key, {}).items():
                    if not self._happened(clock, stream, seq):
                        raise _race(self.rank, what, name(clock.id), earlier, name(stream), writes, "read")
        clock.seq += 1
        for key in made:
            self.writes[key] = (clock.id, clock.seq, what)
            self.reads.pop(key, None)
        for key, writes in accesses:
            if writes:
                self.writes[key] = (clock.id, clock.seq, what)
                self.reads.pop(key, None)
            else:
                self.reads.setdefault(key, {})[clock.id] = (clock.seq, what)

    def forget(self, key: int) -> None:
        """The memory at ``key`` was freed or given anew (a storage resized):
        what was done to it before says nothing of what lives there next."""
        self.writes.pop(key, None)
        self.reads.pop(key, None)

    def freed(self, key: int, made_on: Clock | None, kept_for: set[Clock]) -> None:
        """The storage at ``key``, made on ``made_on``'s stream, was freed: the
        caching allocator may give its memory to the next allocation on that
        stream at once, so every other stream's use of it must be ordered
        before, or before the work (at the free) of a stream the tensor was
        kept for with ``record_stream`` (the allocator waits for that)."""
        last = self.writes.pop(key, None)
        reads = self.reads.pop(key, None) or {}
        if made_on is None or self.pending is not None:
            return
        uses = [(last[0], last[1], last[2], "wrote")] if last is not None else []
        uses += [(stream, seq, what, "read") for stream, (seq, what) in reads.items()]
        for stream, seq, what, did in uses:
            if self._happened(made_on, stream, seq) or any(
                self._happened(kept, stream, seq) for kept in kept_for
            ):
                continue
            mine, theirs = self._label(made_on.id), self._label(stream)
            site = stacks.call_site(3)
            at = (
                f"at {site}"
                if site != "<unknown>"
                else "(no line of the program on the stack: as a body ended, or by the garbage collector)"
            )
            self.pending = AsyncRaceError(
                f"rank {self.rank}: a tensor made on {mine} was freed {at} while "
                f"{what} on {theirs} {did} its memory, with nothing ordering that use before the free: "
                f"the caching allocator may give the memory to the next allocation on {mine} while "
                f"{theirs} still uses it. Call tensor.record_stream() with that stream before the tensor "
                f"dies, or make {mine} wait for it first (wait_stream, an event, Work.wait on it) "
                "(CUDA's caching allocator rule, docs/cuda.md)"
            )
            return

    def _label(self, stream: int) -> str:
        return self.labels.get(stream, f"stream {stream:#x}")

    def raise_pending(self) -> None:
        found, self.pending = self.pending, None
        if found is not None:
            raise found

    def synchronize_host(self, clocks: list[Clock] | None = None) -> None:
        """The host waited for these streams' work (all the rank's: ``None``)."""
        for clock in self.streams.values() if clocks is None else clocks:
            self.host.learn(clock, (clock.id, clock.seq))

    def collective_issued(
        self, key: int, group: str, current: Clock, buffers: list[tuple[int, bool]], what: str, name: Any
    ) -> None:
        """A call on ``group``'s communicator stream (one per group, as NCCL has),
        which first waits for the current stream's work."""
        stream = self.communicators.get(group)
        if stream is None:
            stream = self.communicators[group] = Clock(next(_ids))
            self.labels[stream.id] = f"the communicator stream of group {group}"
        stream.learn(current, (current.id, current.seq))
        stream.learn(self.host)
        self.access(stream, buffers, what, name)
        self.collectives[key] = (dict(stream.seen), (stream.id, stream.seq))

    def collective_waited(self, key: int, current: Clock | None) -> None:
        """``Work.wait()``: the current stream waits for the call (the host, when ``current`` is None)."""
        done = self.collectives.pop(key, None)
        if done is not None:
            (self.host if current is None else current).learn(*done)


def _race(
    rank: int, now: str, now_stream: str, then: str, then_stream: str, writes: bool, did: str
) -> AsyncRaceError:
    doing = "writes" if writes else "reads"
    return AsyncRaceError(
        f"rank {rank}: {now} on {now_stream} {doing} memory that {then} on {then_stream} {did}, with "
        "nothing ordering the two streams (no wait_stream, no event waited, no synchronize, no Work.wait "
        "on this stream): on a GPU they may run in either order (CUDA's stream rules, as "
        "TORCH_CUDA_SANITIZER checks them)"
    )


def storage_key(tensor: torch.Tensor) -> int:
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0
