"""One rank's sanitizer state: its calls in flight and its mode, kept in step."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from .._core.records import PendingCollective
from ..errors import AsyncRaceError, UnwaitedWorkWarning
from .footprint import footprint, overlaps
from .group_order import GroupOrder
from .inflight import InFlight
from .mode import SanitizerMode, _plain_type, here
from .report import unwaited_message
from .stack import on_stack, push_bottom, remove


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
        if synchronous and not self.helpers:
            # c10d waits for it before returning to the rank's code, and no
            # other thread of the rank runs: no op can race with it, so it
            # never goes in flight. It still counts for NCCL's group order
            # when it is issued with others in flight.
            if entries and self.order is not None and isinstance(waitable, PendingCollective):
                self.order.issued(self.rank, InFlight(work, self.rank, waitable), tuple(entries.values()))
            return False
        entry = InFlight(work, self.rank, waitable)
        if self.order is not None and entries and isinstance(waitable, PendingCollective):
            self.order.issued(self.rank, entry, tuple(entries.values()))
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
