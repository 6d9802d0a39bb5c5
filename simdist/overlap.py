"""Members of one collective must not share memory.

On a cluster every rank owns its buffers, so two ranks can never pass the same
memory to one collective. Rank threads can (a tensor handed to every rank
through ``args``, a module-level scratch buffer), and the result then depends
on which member's write lands last: silent wrong numbers. This check finds any
memory written by one member and read or written by another, and names both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .errors import BufferOverlapError

# Payload keys a collective writes, and those it only reads. "t" is written
# (all_reduce, broadcast, reduce) except by the gathers, which only read it.
_WRITTEN = ("out", "out_flat", "outs", "t", "ts")
_READ = ("in", "ins")
_READ_T_OPS = frozenset({"all_gather", "gather"})


def _entries(call: Any) -> list[tuple[int, int, int, int, bool, str, torch.Tensor]]:
    """(device, first byte, end byte, member, written, name, tensor) per buffer.

    Runs on every collective, so it does as little Python as it can.
    """
    out = []
    member = call.group_rank
    for key, value in call.payload.items():
        if key in _WRITTEN:
            written = not (key == "t" and call.op in _READ_T_OPS)
        elif key in _READ:
            written = False
        else:
            continue
        if isinstance(value, torch.Tensor):
            items: Any = ((key, value),)
        else:
            items = ((f"{key}[{i}]", t) for i, t in enumerate(value))
        for name, t in items:
            lo = t.data_ptr()
            if t.is_contiguous():
                hi = lo + t.nbytes
            elif t.numel():
                hi = lo + (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()
            else:
                hi = lo
            if hi > lo:
                out.append((t.get_device(), lo, hi, member, written, name, t))
    return out


def _really_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact test for two tensors whose address ranges intersect (strided views
    of one buffer, such as two columns of a matrix, interleave without sharing)."""
    if a.is_contiguous() and b.is_contiguous():
        return True
    if (
        a.element_size() != b.element_size()
        or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    ):
        return True  # conservative

    def offsets(t: torch.Tensor) -> torch.Tensor:
        idx = torch.full((), t.storage_offset(), dtype=torch.int64)
        for n, s in zip(t.shape, t.stride()):
            idx = idx.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * s
        return idx.reshape(-1)

    return bool(torch.isin(offsets(a), offsets(b)).any())


def _by_address(entry: tuple[Any, ...]) -> tuple[int, int]:
    return entry[0], entry[1]


def check_members_disjoint(op: str, group: Any, seq: int, calls: Sequence[Any]) -> None:
    """Raise ``BufferOverlapError`` when two members' buffers share memory and
    at least one of them is written by the collective.

    ``group`` is the communicator (its ``describe()`` names it in the error):
    the label is only rendered when there is an error to report.
    """
    if len(calls) < 2:
        return  # only buffers of different members can clash
    entries = [e for c in calls for e in _entries(c)]
    entries.sort(key=_by_address)
    last = len(entries) - 1
    for i in range(last):
        dev, lo, hi, member, written, name, t = entries[i]
        nxt = entries[i + 1]
        if nxt[0] != dev or nxt[1] >= hi:
            continue  # sorted by start: nothing later can overlap this one either
        for dev2, lo2, hi2, member2, written2, name2, t2 in entries[i + 1 :]:
            if dev2 != dev or lo2 >= hi:
                break
            if member2 == member or not (written or written2) or not _really_overlap(t, t2):
                continue
            a, b = calls[member], calls[member2]
            role = lambda w: "output" if w else "input"  # noqa: E731
            raise BufferOverlapError(
                f"{op} on {group.describe()} seq {seq}: rank {a.rank}'s {role(written)} {name!r} "
                f"(at {a.site}) and rank {b.rank}'s {role(written2)} {name2!r} (at {b.site}) share "
                f"memory. On a cluster every rank has its own memory, so this cannot happen there "
                f"and here the result would depend on thread timing: give each rank its own "
                f"tensor (a tensor passed through run(args=...) or kept in a global is shared "
                f"by every rank thread)"
            )
