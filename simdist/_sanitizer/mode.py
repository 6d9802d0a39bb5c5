"""The per-rank TorchDispatchMode: every op of the rank, checked against its calls in flight.

It is on a thread's stack only while the rank has something in flight
(``book.sync``), so synchronous code never meets it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import stacks
from ..errors import AsyncRaceError
from .accesses import WRITE, accesses
from .footprint import footprint, overlaps
from .inflight import IN, InFlight, race_message

# Collectives and their plumbing: simdist checks its own calls' buffers
# itself, and a wait must go through (it is what ends the race).
_PASS_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_dtensor", "profiler"})
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_NO_DISPATCH = torch._C._disabled_torch_dispatch_impl  # what Tensor (and a subclass not overriding it) has


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

    simdist_own_mode = True  # not shown simdist's collectives (other_modes_active)

    def __init__(self, entries: dict[int, InFlight], rank: int) -> None:
        super().__init__()
        # The rank's book's calls in flight (that very dict) and its rank: not
        # the book, which holds this mode (no cycle for the collector).
        self.entries = entries
        self.rank = rank

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Off while torch.compile traces (a mode dynamo cannot trace through
        # makes it skip every frame: fullgraph=True then fails), on again
        # while the compiled code runs, whose ops it checks as any others.
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        entries = self.entries
        if entries and not here.quiet and func.namespace not in _PASS_NAMESPACES:
            dispatching = [t for t in types if not _plain_type(t)] if types else types
            if not dispatching:
                checked_ops[0] += 1
                # A snapshot: a helper thread of the rank may end a call meanwhile.
                _check(self.rank, tuple(entries.values()), func, args, kwargs)
            elif not _fake(dispatching):
                # A subclass with a dispatch of its own (DTensor,
                # AsyncCollectiveTensor, a user's wrapper): it runs with this
                # mode still on the stack, so the ops it runs on the tensors
                # holding its values come back here and are checked.
                return NotImplemented
            # Fake tensors hold no memory to race on; the fake mode below
            # this one (DTensor's sharding propagation, torch.compile's
            # tracing) computes them. Handing them back would leave the op
            # with no handler: a fake tensor declines while its mode is on.
        here.dispatching += 1
        try:
            return func(*args, **kwargs)
        finally:
            here.dispatching -= 1


def _fake(types: Any) -> bool:
    module = sys.modules.get("torch._subclasses.fake_tensor")  # not imported: no fake tensor exists
    fake = getattr(module, "FakeTensor", None)
    return fake is not None and any(issubclass(t, fake) for t in types)


def _plain_type(kind: type) -> bool:
    """Whether a tensor of this type holds its values in its own storage: plain
    tensors and every subclass without a dispatch of its own (``nn.Parameter``
    and its subclasses, ``as_subclass`` types). The mode hands the ops of a
    subclass with one back, and its inner tensors come back plain."""
    return kind in _PLAIN or getattr(kind, "__torch_dispatch__", None) is _NO_DISPATCH


def _check(rank: int, entries: Iterable[InFlight], func: Any, args: Any, kwargs: Any) -> None:
    for tensor, access in accesses(func, args, kwargs):
        kind = type(tensor)
        if kind not in _PLAIN and getattr(kind, "__torch_dispatch__", None) is not _NO_DISPATCH:
            continue  # not _plain_type (inlined: every op with calls in flight comes here)
        mine = None
        for entry in entries:
            for fp, role in entry.buffers:
                if role == IN and access != WRITE:
                    continue
                if mine is None:
                    mine = footprint(tensor)
                if overlaps(mine, fp):
                    op = str(func.overloadpacket)
                    site = stacks.call_site(2, outside_dispatch=True)
                    raise AsyncRaceError(race_message(rank, op, site, access, entry, role))
