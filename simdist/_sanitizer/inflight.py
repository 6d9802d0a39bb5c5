"""What one rank has in flight (its async calls not yet waited, and their
buffers), and what the sanitizer says of one: a race, or a Work never waited.

An entry is made when a Work is created for an asynchronous call (cheaply:
the Work and what it waits on; a call c10d waits for at once makes none, see
``synchronous``) and its buffers are looked up only when an operation is
checked against it.
"""

from __future__ import annotations

from typing import Any

import torch

from .._core.records import P2POp, PendingCollective
from .accesses import WRITE
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


_WAITS = (
    "Work.wait(), Work.get_future().wait(), is_completed() returning True, "
    "or for a functional collective wait_tensor() or a first use of its AsyncCollectiveTensor"
)


def _verb(op: str, access: str) -> str:
    name = op.split(".")[0]
    if name.startswith("resize") or name.endswith("resize_"):
        return "resizes"
    return "writes" if access == WRITE else "reads"


def race_message(rank: int, op: str, site: str, access: str, entry: InFlight, role: str) -> str:
    verb = _verb(op, access)
    if role == OUT:
        whose = "a buffer the call writes"
        if access == WRITE:
            real = (
                "On NCCL the collective's kernel and this op write the same memory in an undefined order "
                "(on the communicator's stream vs. the compute stream); on gloo it is a data race with "
                "the worker thread that writes the result"
            )
        else:
            real = (
                "On NCCL this reads stale or partial data (the result lands on the communicator's "
                "stream whenever the kernel gets there); on gloo it is a data race with the worker "
                "thread that writes the result"
            )
    else:
        whose = "a buffer the call reads"
        real = (
            "On NCCL the collective may send the old value, the new one or a mix of both (its kernel "
            "reads the memory on the communicator's stream later); on gloo it is a data race with "
            "the worker thread that reads it"
        )
    return (
        f"rank {rank}: {op} at {site} {verb} {whose}, while its {entry.describe()} "
        f"(issued at {entry.site}) is still in flight: the call was issued asynchronously and "
        f"not waited yet. {real}. Wait for the call first ({_WAITS})."
    )


def unwaited_message(rank: int, entry: InFlight, returned: bool) -> str:
    tail = " and the rank returned its buffers" if returned else ""
    return (
        f"rank {rank} ended with its {entry.describe()} (issued at {entry.site}) never waited{tail}: "
        f"on NCCL or gloo its buffers may still be written or read after the rank moves on, so "
        f"their values differ from rank to rank. Wait for it ({_WAITS})."
    )
