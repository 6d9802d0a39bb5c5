"""One rank's sanitizer state (its calls in flight and its mode, kept in step)
and the world's record of the order ranks issued calls on two groups in.

The mode goes to the bottom of the thread's dispatch-mode stack: a user's
mode entered with ``with`` pops whatever is on top when it exits, so the
sanitizer's own must never be the top one it finds. Below the others it also
sees the ops they finally run, not the ones they rewrite.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch._C import _get_dispatch_stack_at, _len_torch_dispatch_stack
from torch._C import _pop_torch_dispatch_stack as _pop
from torch._C import _push_on_torch_dispatch_stack as _push

from .._core.records import PendingCollective
from ..errors import AsyncRaceError, UnwaitedWorkWarning
from .footprint import footprint, overlaps
from .inflight import InFlight, unwaited_message
from .mode import SanitizerMode, _plain_type, here


def on_stack(mode: Any) -> bool:
    return any(_get_dispatch_stack_at(i) is mode for i in range(_len_torch_dispatch_stack()))


def push_bottom(mode: Any) -> None:
    above = []
    while _len_torch_dispatch_stack():
        above.append(_pop(None))
    _push(mode)
    for other in reversed(above):
        _push(other)


def remove(mode: Any) -> None:
    """Take ``mode`` off the stack wherever it is (a no-op when absent)."""
    above = []
    while _len_torch_dispatch_stack():
        top = _pop(None)
        if top is mode:
            break
        above.append(top)
    for other in reversed(above):
        _push(other)


Instance = tuple[str, int]  # (group name, sequence number)


class GroupOrder:
    """NCCL's cross-communicator hazard: async calls on two groups issued in opposite orders.

    Rank 0 issues an async call on group A, then one on B with A still in flight;
    rank 1, a member of both, issues B's then A's. gloo completes both; on NCCL
    each communicator's kernel waits on its own stream for every member, and the
    two ranks' streams can each block on the call the other issued second: a
    hang. Checked for every pair of groups when the run asks for it
    (``check_group_order=True``), and always for two groups the program asked for
    as NCCL (``new_group(backend="nccl")``, ``init_process_group("nccl")``; a
    device map such as "cpu:gloo,cuda:nccl" only with the option). Holds, for
    each pair of call instances one rank had in flight together, who issued
    them in that order.
    """

    def __init__(self, every_group: bool) -> None:
        self._every_group = every_group
        self._lock = threading.Lock()
        self._before: dict[tuple[Instance, Instance], tuple[int, str, str]] = {}

    def issued(self, rank: int, new: InFlight, in_flight: Iterable[InFlight]) -> None:
        group = new.waitable.group
        mine: Instance = (group.name, new.waitable.seq)
        for old in in_flight:
            old_group = getattr(old.waitable, "group", None)
            seq = getattr(old.waitable, "seq", None)
            if old_group is None or seq is None or old_group.name == group.name:
                continue
            if not (self._every_group or (group.nccl and old_group.nccl)):
                continue
            theirs: Instance = (old_group.name, seq)
            with self._lock:
                other = self._before.get((mine, theirs))
                if other is not None and other[0] != rank:
                    raise AsyncRaceError(_message(rank, old, new, other))
                self._before.setdefault((theirs, mine), (rank, old.describe(), new.describe()))


def _message(rank: int, first: InFlight, second: InFlight, other: tuple[int, str, Any]) -> str:
    peer, peer_first, peer_second = other
    return (
        f"rank {rank} issued its {second.describe()} (at {second.site}) while its "
        f"{first.describe()} (at {first.site}) was in flight, but rank {peer} issued them in the "
        f"opposite order ({peer_first}, then {peer_second}): on NCCL two communicators' kernels "
        f"can each wait for the rank that issued the other first, a hang that gloo does not show. "
        f"Issue collectives on different groups in the same order on every rank, or wait for the "
        f"first before issuing the second."
    )


class RankBook:
    """A rank's async calls not yet waited, in issue order, and its mode."""

    def __init__(self, rank: int, strict: bool, order: GroupOrder | None = None) -> None:
        self.rank = rank
        self.strict = strict
        self.order = order
        # id(work) -> its entry, in issue order; the entry holds the Work, so
        # the id cannot be reused while it is here.
        self.entries: dict[int, InFlight] = {}
        self.mode = SanitizerMode(self.entries, rank)
        self.helpers = False  # the rank has started a helper thread

    def issued(self, work: Any, waitable: Any, synchronous: bool = False) -> bool:
        """Put the call in flight; False when it need not be (see below)."""
        entries = self.entries
        entry = InFlight(work, self.rank, waitable)
        if entries and self.order is not None and isinstance(waitable, PendingCollective):
            self.order.issued(self.rank, entry, tuple(entries.values()))
        if synchronous and not self.helpers:
            # c10d waits for it before returning to the rank's code, and no
            # other thread of the rank runs: no op can race with it, so it
            # never goes in flight (it still counted for NCCL's group order,
            # above, when issued with others in flight).
            return False
        entries[id(work)] = entry
        self.sync()
        return True

    def waited(self, work: Any) -> None:
        entries = self.entries
        if entries.pop(id(work), None) is not None and not entries:
            self.sync()

    def sync(self) -> None:
        """The mode on this thread's stack exactly while something is in flight.

        Inside the mode's own dispatch it is off the stack and comes back by
        itself afterwards: nothing to do then (a mode left over with nothing
        in flight only passes ops through, until the next sync).
        """
        if here.dispatching or here.pinned:
            return
        mode = self.mode
        installed = on_stack(mode)
        if self.entries and not installed:
            push_bottom(mode)
        elif installed and not self.entries:
            remove(mode)

    def pin(self) -> None:
        """A helper thread of the rank: the mode for the thread's whole life.

        From now on the rank's synchronous calls go in flight too: a helper
        may touch their buffers while the rank waits for them.
        """
        self.helpers = True
        if not on_stack(self.mode):
            push_bottom(self.mode)
        here.pinned = True

    def unpin(self) -> None:
        """A helper thread's body is over: the mode leaves its stack before the
        thread ends. Left there, the thread's C++ thread-local dispatch stack
        would release the mode in its exit handlers, after Python has let the
        thread go; if the interpreter is finalising by then, taking the GIL
        ends the thread inside a destructor and the process aborts
        ("terminate called without an active exception")."""
        remove(self.mode)
        here.pinned = False

    def ended(self, result: Any) -> None:
        """The body returned ``result``: report what it never waited."""
        left = list(self.entries.values())
        self.entries.clear()  # (the mode holds this very dict)
        self.sync()
        if not left:
            return
        returned = _tensors(result)
        for entry in left:
            gave_back = any(overlaps(footprint(t), fp) for t in returned for fp, _role in entry.buffers)
            message = unwaited_message(self.rank, entry, gave_back)
            if self.strict:
                raise AsyncRaceError(message)
            warnings.warn(message, UnwaitedWorkWarning, stacklevel=1)

    def leave(self) -> None:
        """The rank thread's end, however it ends: nothing stays on its stack."""
        self.entries.clear()
        remove(self.mode)
        here.pinned = False


def _tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """Tensors holding memory in a returned value: in containers, dataclasses
    and plain objects a few levels deep, and inside wrapper subclasses (the
    tensors their ``__tensor_flatten__`` names)."""
    if isinstance(value, torch.Tensor):
        if _plain_type(type(value)):
            return [value]
        flatten = getattr(value, "__tensor_flatten__", None)
        if flatten is None or depth > 3:
            return []
        names, _ = flatten()
        return [t for name in names for t in _tensors(getattr(value, name, None), depth + 1)]
    if depth > 3 or value is None or isinstance(value, (str, bytes, int, float, bool, type)):
        return []
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    elif dataclasses.is_dataclass(value):
        items = [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    elif hasattr(value, "__dict__"):
        items = list(vars(value).values())  # a plain object holding the buffer
    else:
        return []
    out: list[torch.Tensor] = []
    for item in items:
        out.extend(_tensors(item, depth + 1))
    return out
