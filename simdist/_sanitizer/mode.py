"""The per-rank TorchDispatchMode: every op of the rank, checked against its calls in flight.

It is on a thread's stack only while the rank has something in flight
(``book.sync``), so synchronous code never meets it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import stacks
from ..errors import AsyncRaceError
from .accesses import WRITE, accesses
from .footprint import footprint, overlaps
from .inflight import IN, InFlight
from .report import race_message

# Collectives and their plumbing: simdist checks its own calls' buffers
# itself, and a wait must go through (it is what ends the race).
_PASS_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_dtensor", "profiler"})
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class ThreadState(threading.local):
    """Per thread: inside simdist's own tensor work, inside the mode's own dispatch."""

    quiet = 0
    dispatching = 0
    pinned = False  # a helper thread: the mode stays for its whole life


here = ThreadState()

# Ops checked against calls in flight, process-wide (tests read its growth to
# know the sanitizer was active over real client code, not merely on).
checked_ops = [0]


class SanitizerMode(TorchDispatchMode):
    """One rank's mode (see the module's docstring)."""

    def __init__(self, book: Any) -> None:
        super().__init__()
        self.book = book

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        entries: dict[int, InFlight] = self.book.entries
        if entries and not here.quiet and func.namespace not in _PASS_NAMESPACES:
            for t in types:
                if t not in _PLAIN:
                    # A tensor subclass (DTensor, AsyncCollectiveTensor): let it
                    # run; the plain ops it runs come back here.
                    return NotImplemented
            checked_ops[0] += 1
            # A snapshot: a helper thread of the rank may end a call meanwhile.
            _check(self.book.rank, tuple(entries.values()), func, args, kwargs)
        here.dispatching += 1
        try:
            return func(*args, **kwargs)
        finally:
            here.dispatching -= 1


def _check(rank: int, entries: Iterable[InFlight], func: Any, args: Any, kwargs: Any) -> None:
    for tensor, access in accesses(func, args, kwargs):
        if type(tensor) not in _PLAIN:
            continue
        mine = None
        for entry in entries:
            for fp, role in entry.buffers:
                if role == IN and access != WRITE:
                    continue
                if mine is None:
                    mine = footprint(tensor)
                if overlaps(mine, fp):
                    op = str(func.overloadpacket)
                    site = stacks.call_site(2)
                    raise AsyncRaceError(race_message(rank, op, site, access, entry, role))
