"""Members of one collective that share memory, and completing a call (``Completion``).

Rank threads can pass one memory to a collective (a tensor handed to every rank
through ``args``, a module-level tensor); no cluster can. Where that can change
the outcome (which member's write lands last) ``BufferOverlapError`` names both
buffers; where it cannot (DTensor broadcasting a module-level tensor into
itself), the call is completed on private copies of the shared memory and the
results written back (docs/never-hang.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._core.records import Call
from ..errors import BufferOverlapError
from .ops import OPS, OpArgs

Entry = tuple[int, int, int, int, bool, str, torch.Tensor]


def _entries(call: Any) -> list[Entry]:
    """(device, first byte, end byte, member, written, name, tensor) per buffer.

    Runs on every collective, so it does as little Python as it can.
    """
    out = []
    member = call.group_rank
    spec = OPS[call.op]
    written_keys, read_keys, updated_keys = spec.written, spec.read, spec.updated
    for key, value in call.payload.items():
        if key in updated_keys or key in written_keys:
            written = True
        elif key in read_keys:
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


def _offsets(t: torch.Tensor) -> torch.Tensor:
    idx = torch.full((), int(t.storage_offset()), dtype=torch.int64)
    for n, s in zip(t.shape, t.stride()):
        idx = idx.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * s
    return idx.reshape(-1)


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
    return bool(torch.isin(_offsets(a), _offsets(b)).any())


def _by_address(entry: Entry) -> tuple[int, int]:
    return entry[0], entry[1]


def find_clash(calls: Sequence[Any]) -> tuple[Entry, Entry] | None:
    """The first two buffers of different members that share memory, at least
    one of them written by the collective; None when members are disjoint."""
    if len(calls) < 2:
        return None  # only buffers of different members can clash
    entries = [e for c in calls for e in _entries(c)]
    entries.sort(key=_by_address)
    last = len(entries) - 1
    for i in range(last):
        dev, _lo, hi, member, written, _name, t = entries[i]
        nxt = entries[i + 1]
        if nxt[0] != dev or nxt[1] >= hi:
            continue  # sorted by start: nothing later can overlap this one either
        for entry2 in entries[i + 1 :]:
            dev2, lo2, _hi2, member2, written2, _name2, t2 = entry2
            if dev2 != dev or lo2 >= hi:
                break
            if member2 == member or not (written or written2) or not _really_overlap(t, t2):
                continue
            return entries[i], entry2
    return None


def clash_error(
    op: str, group: Any, seq: int, calls: Sequence[Any], clash: tuple[Entry, Entry]
) -> BufferOverlapError:
    (_, _, _, member, written, name, _), (_, _, _, member2, written2, name2, _) = clash
    a, b = calls[member], calls[member2]
    role = lambda w: "output" if w else "input"  # noqa: E731
    return BufferOverlapError(
        f"{op} on {group.describe()} seq {seq}: rank {a.rank}'s {role(written)} {name!r} "
        f"(at {a.site}) and rank {b.rank}'s {role(written2)} {name2!r} (at {b.site}) share "
        f"memory. On a cluster every rank has its own memory, so this cannot happen there "
        f"and here the result would depend on thread timing: give each rank its own "
        f"tensor (a tensor passed through run(args=...) or kept in a global is shared "
        f"by every rank thread)"
    )


# -- completing a call whose members share memory, as a cluster would ---------------

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _on(storage: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t``'s view (shape, strides, offset) over another storage of the same size."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        storage.untyped_storage(), t.storage_offset(), t.shape, t.stride()
    )


def _mark(cover: torch.Tensor, t: torch.Tensor) -> bool:
    """Set the bytes ``t`` spans in the byte mask ``cover``; False if it cannot tell."""
    view = _on(cover, t)
    if view.is_complex():
        view = torch.view_as_real(view)
    size = view.element_size()
    if size not in _INT_OF_SIZE:
        return False
    as_int = torch.empty(0, dtype=_INT_OF_SIZE[size], device=t.device).set_(
        cover.untyped_storage(), view.storage_offset(), view.shape, view.stride()
    )
    as_int.fill_(-1)
    return True


Buffer = tuple[str, "int | None", torch.Tensor, bool, bool]


def _buffers(call: Any) -> list[Buffer]:
    """(key, index in a list or None, tensor, read, written) for each buffer of a call."""
    spec = OPS[call.op]
    out: list[Buffer] = []
    for key, value in call.payload.items():
        read = key in spec.read or key in spec.updated
        written = key in spec.written or key in spec.updated
        if not (read or written):
            continue
        if isinstance(value, torch.Tensor):
            out.append((key, None, value, read, written))
        else:
            out.extend((key, i, t, read, written) for i, t in enumerate(value))
    return out


def _storage(t: torch.Tensor) -> tuple[int, int]:
    return t.get_device(), t.untyped_storage().data_ptr()


def _whole(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s whole storage, as a flat uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class _Member:
    """One member's private copies of the shared storages, and which bytes of
    each it reads and writes."""

    def __init__(self) -> None:
        self.private: dict[tuple[int, int], torch.Tensor] = {}
        self.reads: dict[tuple[int, int], torch.Tensor] = {}
        self.writes: dict[tuple[int, int], torch.Tensor] = {}

    def take(self, skey: tuple[int, int], t: torch.Tensor, read: bool, written: bool) -> torch.Tensor | None:
        """``t`` moved to this member's private copy; None when its bytes cannot be told."""
        if skey not in self.private:
            whole = _whole(t)
            self.private[skey] = whole.clone()
            self.reads[skey] = torch.zeros_like(whole)
            self.writes[skey] = torch.zeros_like(whole)
        if (read and not _mark(self.reads[skey], t)) or (written and not _mark(self.writes[skey], t)):
            return None
        return _on(self.private[skey], t)


def _agree(a: _Member, b: _Member, skey: tuple[int, int], initial: torch.Tensor) -> bool:
    """On the bytes both members pass, they pass them in the same role and end
    with the same values; bytes they read are left as they were."""
    ra, wa, rb, wb = (m[skey].bool() for m in (a.reads, a.writes, b.reads, b.writes))
    both = (ra | wa) & (rb | wb)
    if not both.any():
        return True
    if (both & ((ra ^ rb) | (wa ^ wb))).any():
        return False  # one member's output over another's input: order decides
    if not torch.equal(a.private[skey][both], b.private[skey][both]):
        return False
    read = both & ra
    return torch.equal(a.private[skey][read], initial[read])


def complete_privately(calls: Sequence[Any], complete: Callable[[], None], error: BufferOverlapError) -> None:
    """Run ``complete`` with each member's shared buffers moved to private copies
    of their memory (as a cluster has them); write the results back when the
    sharing cannot have changed the outcome, else raise ``error``."""
    buffers = [_buffers(c) for c in calls]
    owners: dict[tuple[int, int], set[int]] = {}
    for m, items in enumerate(buffers):
        for _, _, t, _, _ in items:
            owners.setdefault(_storage(t), set()).add(m)
    shared = {k for k, members in owners.items() if len(members) > 1}
    if not shared:
        raise error  # the clash spans storages (views made from raw memory): cannot tell
    initial: dict[tuple[int, int], torch.Tensor] = {}
    members = [_Member() for _ in calls]
    moved: list[dict[str, Any]] = []
    for c, items, member in zip(calls, buffers, members):
        new = dict(c.payload)
        for key, index, t, read, written in items:
            skey = _storage(t)
            if skey not in shared:
                continue
            if skey not in initial:
                initial[skey] = _whole(t).clone()
            view = member.take(skey, t, read, written)
            if view is None:
                raise error
            if index is None:
                new[key] = view
            else:
                if new[key] is c.payload[key]:
                    new[key] = list(new[key])
                new[key][index] = view
        moved.append(new)
    originals = [c.payload for c in calls]
    try:
        for c, new in zip(calls, moved):
            c.payload = new
        complete()
    finally:
        for c, old in zip(calls, originals):
            c.payload = old
    for skey in shared:
        having = [m for m in members if skey in m.private]
        for i, a in enumerate(having):
            for b in having[i + 1 :]:
                if not _agree(a, b, skey, initial[skey]):
                    raise error
    for items, new in zip(buffers, moved):
        for key, index, t, _, written in items:
            src = new[key] if index is None else new[key][index]
            if written and src is not t:
                t.copy_(src)


class Completion(OpArgs):
    """The completion the scheduler runs once every member has joined: the op's
    function from the ops table, with the arguments every member agreed on
    (it is its own ``OpArgs``: one object per call on the hot path).

    Buffers shared between members complete as on a cluster when that cannot
    change the outcome, else fail (above). Inference tensors may only be
    written in inference mode, and the completing thread may belong to another
    rank than the tensor's owner.
    """

    __slots__ = ()

    def __call__(self, calls: list[Call]) -> None:
        for c in calls:
            if c.inference:
                with torch.inference_mode():
                    self._complete(calls)
                return
        self._complete(calls)

    def _complete(self, calls: list[Call]) -> None:
        clash = find_clash(calls)
        if clash is None:
            self.spec.complete(calls, self)
        else:
            error = clash_error(self.spec.name, self.group, self.seq, calls, clash)
            complete_privately(calls, lambda: self.spec.complete(calls, self), error)
        # What a fault does to a member's result, once the result is there.
        for c in calls:
            if c.landing is not None:
                c.landing()
