"""What one rank has in flight: its async calls not yet waited, and their buffers.

An entry is made when a Work is created for an asynchronous call (cheaply:
the Work and what it waits on; a call c10d waits for at once makes none, see
``synchronous``) and its buffers are looked up only when an operation is
checked against it.
"""

from __future__ import annotations

from typing import Any

import torch

from .._core.records import P2POp, PendingCollective
from .footprint import Footprint, footprint

# A buffer's role in its call: the backend writes it ("out": any access
# races) or only reads it ("in": a write races).
OUT = "out"
IN = "in"


class InFlight:
    """One async call of one rank, issued and not yet waited."""

    __slots__ = ("_buffers", "rank", "waitable", "work")

    def __init__(self, work: Any, rank: int, waitable: Any) -> None:
        self.work = work
        self.rank = rank
        self.waitable = waitable
        self._buffers: list[tuple[Footprint, str]] | None = None

    @property
    def buffers(self) -> list[tuple[Footprint, str]]:
        if self._buffers is None:
            self._buffers = [(footprint(t), role) for t, role in _buffers_of(self)]
        return self._buffers

    @property
    def site(self) -> str:
        call = self._call()
        if call is not None:
            return str(call.site)
        return str(getattr(self.waitable, "site", "<unknown>"))

    def describe(self) -> str:
        """The call, its group and its sequence number (or peer and tag)."""
        w = self.waitable
        if isinstance(w, PendingCollective):
            call = self._call()
            op = call.op if call is not None else "collective"
            return f"{op} on group {w.group.describe()} seq {w.seq}"
        if isinstance(w, P2POp):
            what = "isend to" if w.kind == "send" else "irecv from"
            return f"{what} rank {w.peer} (tag {w.tag}) on group {w.group.describe()}"
        return "async call"

    @property
    def group_name(self) -> str | None:
        group = getattr(self.waitable, "group", None)
        return None if group is None else str(group.name)

    def _call(self) -> Any:
        w = self.waitable
        if isinstance(w, PendingCollective):
            for call in w.calls.values():
                if call.rank == self.rank:
                    return call
        return None


def _buffers_of(entry: InFlight) -> list[tuple[torch.Tensor, str]]:
    w = entry.waitable
    if isinstance(w, P2POp):
        # A send's own buffer (simdist copies it at the call, which a real
        # backend does not: the user's tensor is what must stay untouched).
        if w.kind == "send":
            return [(t, IN) for t in entry.work._result]
        return [(w.tensor, OUT)]
    call = entry._call()
    if call is None:
        return []
    from .._backend.ops import OPS  # the ops table says which payload keys the op writes

    spec = OPS[call.op]
    # A broadcast's root only sends: its buffer is read, as any input.
    root_only_reads = call.op == "broadcast" and dict(call.fingerprint).get("root") == call.group_rank
    out: list[tuple[torch.Tensor, str]] = []
    for key, value in call.payload.items():
        if root_only_reads:
            role = IN
        elif key in spec.written or key in spec.updated:
            role = OUT
        elif key in spec.read:
            role = IN
        else:
            continue
        tensors = value if isinstance(value, list) else [value]
        out.extend((t, role) for t in tensors if isinstance(t, torch.Tensor))
    return out
