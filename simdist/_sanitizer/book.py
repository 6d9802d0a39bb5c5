"""One rank's sanitizer state: its calls in flight and its mode, kept in step."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .._core.records import PendingCollective
from ..errors import AsyncRaceError, UnwaitedWorkWarning
from .footprint import footprint, overlaps
from .group_order import GroupOrder
from .inflight import InFlight
from .mode import SanitizerMode, here
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
        self.mode = SanitizerMode(self)
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

    def ended(self, result: Any) -> None:
        """The body returned ``result``: report what it never waited."""
        left = list(self.entries.values())
        self.entries = {}
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
        self.entries = {}
        remove(self.mode)
        here.pinned = False


def _tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """Plain tensors in a returned value (containers a few levels deep)."""
    if isinstance(value, torch.Tensor):
        return [value] if type(value) in (torch.Tensor, torch.nn.Parameter) else []
    if depth > 3:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        out: list[torch.Tensor] = []
        for item in value:
            out.extend(_tensors(item, depth + 1))
        return out
    return []
