"""What the sanitizer says: a race, or a Work never waited."""

from __future__ import annotations

from .accesses import WRITE
from .inflight import OUT, InFlight

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
