"""The ops table: one completion function per op and what each op does to its buffers.

A completion receives the members' ``Call`` objects in group-rank order, after
their fingerprints were compared, and writes every member's outputs; it runs on
the thread of the last member to arrive. ``OpSpec`` is everything the rest of
simdist needs to know about an op (which payload keys it writes or only reads,
what a rank contributes, how gloo moves autograd's version counter), so adding
a collective means adding its completion and its row here, and its method on
the process group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import torch

from .._core.records import Call, GroupInfo
from ..errors import CollectiveMismatchError
from . import kernels as K

# -- the payload keys --------------------------------------------------------------------
# A payload maps these keys to the tensors one rank passed to one collective
# (detached aliases of them). Each op's ``OpSpec`` says which keys it writes,
# which it only reads and which carry the rank's contribution, so no other
# module repeats the strings or guesses an op's buffer roles.

T: Final = "t"  # the one tensor of all_reduce, broadcast, reduce (read and written), gathers (read)
TS: Final = "ts"  # the tensors of all_reduce_coalesced
IN: Final = "in"  # one input tensor (flattened where the op works on flat memory)
INS: Final = "ins"  # a list of inputs (reduce_scatter, scatter's root, all_to_all)
OUT: Final = "out"  # one output tensor
OUT_FLAT: Final = "out_flat"  # all_gather_into_tensor's output, flattened
OUTS: Final = "outs"  # a list of outputs (all_gather, gather's root, all_to_all)
OUT_SPLITS: Final = "out_splits"  # all_to_all_single's row counts (not tensors)
IN_SPLITS: Final = "in_splits"
SPARSE: Final = "sparse"  # a sparse all_reduce's tensor (a ``Whole``)


class OpArgs:
    """What every member passes alike (compared by the fingerprint), for the
    completion of ``spec`` (``process_group.Completion`` is the one kind made)."""

    __slots__ = ("group", "model", "red", "root", "seq", "spec")

    def __init__(self, spec: OpSpec, group: GroupInfo, seq: int, model: Any, red: str, root: int) -> None:
        self.spec = spec
        self.group = group
        self.seq = seq
        self.model = model  # the world's reduction-order model
        self.red = red
        self.root = root

    @property
    def key(self) -> str:
        """The reduction model's key for this call (shuffled orders are seeded by it)."""
        return f"{self.group.name}/{self.seq}"


Complete = Callable[[list[Call], OpArgs], None]


@dataclass(frozen=True)
class OpSpec:
    """One op's row of the table.

    ``written``/``read``/``updated``: payload keys the op only writes, only
    reads, or reads and overwrites (overlap checks). ``sent``: the keys holding what a rank contributes (a
    corrupt fault damages the first present); ``sent_is_output``: that
    contribution is overwritten by the result anyway, so it is damaged in place.
    ``version_bumps``: how many times gloo (torch 2.13) moves autograd's version
    counter of each tensor the call returns (its outputs), measured op by op
    (``bumps_per_member``: that many per group member, one copy per slot).
    ``avg_bumps``: how many more with reduce op AVG (gloo computes AVG as SUM,
    then divides the result in place with a torch op autograd sees).
    """

    name: str
    complete: Complete
    written: frozenset[str] = frozenset()
    read: frozenset[str] = frozenset()
    updated: frozenset[str] = frozenset()
    sent: tuple[str, ...] = ()
    sent_is_output: bool = False
    version_bumps: int = 0
    bumps_per_member: bool = False  # version_bumps times the group size
    avg_bumps: int = 0


# -- completions ------------------------------------------------------------------


def _all_reduce(calls: list[Call], a: OpArgs) -> None:
    ts = [c.payload[T] for c in calls]
    K.reduce_into(a.model, ts[0], ts, a.red, a.key)
    for x in ts[1:]:
        x.copy_(ts[0])


class Whole:
    """A tensor a completion must write as itself, not through a ``.data``
    alias: a sparse tensor's copy_ replaces its indices and values, which an
    alias would take alone."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _all_reduce_sparse(calls: list[Call], a: OpArgs) -> None:
    # gloo sums sparse COO tensors (SUM only) and gives every member the
    # coalesced sum in its own tensor, whose version counter moves once
    # (measured on torch 2.13).
    ts = [c.payload[SPARSE].tensor for c in calls]
    with torch.no_grad():
        total = ts[0].detach()
        for x in ts[1:]:
            total = total + x.detach()
        total = total.coalesce()
        for x in ts:
            x.copy_(total)


def _all_reduce_coalesced(calls: list[Call], a: OpArgs) -> None:
    # gloo packs every tensor into one buffer before it reduces and unpacks
    # after: a rank passing one tensor twice gets the sum once (PyTorch's
    # test_allreduce_coalesced_stress, on a real gloo world too), so every
    # input is read before any output is written.
    key = a.key
    n = len(calls[0].payload[TS])
    columns = [[c.payload[TS][i] for c in calls] for i in range(n)]
    results = []
    for i, ts in enumerate(columns):
        out = ts[0].clone()
        K.reduce_into(a.model, out, [out, *ts[1:]], a.red, f"{key}/{i}")
        results.append(out)
    for ts, out in zip(columns, results, strict=True):
        for x in ts:
            x.copy_(out)


def _broadcast(calls: list[Call], a: OpArgs) -> None:
    root = a.root
    src = calls[root].payload[T]
    for i, c in enumerate(calls):
        if i != root:
            c.payload[T].copy_(src)


def _reduce(calls: list[Call], a: OpArgs) -> None:
    ts = [c.payload[T] for c in calls]
    K.reduce_into(a.model, ts[a.root], ts, a.red, a.key)


def _gather_into(outs: list[torch.Tensor], calls: list[Call], ranks: tuple[int, ...], what: str) -> None:
    """Member j's tensor into ``outs[j]``; ``what`` names the list in a mismatch."""
    for j, o in enumerate(outs):
        src = calls[j].payload[T]
        if o.shape != src.shape:
            raise CollectiveMismatchError(
                f"{what}[{j}] has shape {list(o.shape)} but rank {ranks[j]} contributed {list(src.shape)}"
            )
        K.copy_into(o, src)


def _all_gather(calls: list[Call], a: OpArgs) -> None:
    for c in calls:
        _gather_into(c.payload[OUTS], calls, a.group.ranks, f"all_gather: rank {c.rank}'s tensor_list")


def _all_gather_into_tensor(calls: list[Call], a: OpArgs) -> None:
    # Slot by slot: a rank's input may be its own slot of the output
    # (FSDP2 gathers in place), which torch.cat(out=) refuses. Slots are in
    # logical order, as gloo fills a channels-last input or output.
    srcs = [K.logical_flat(c.payload[IN], "all_gather_into_tensor input_tensor") for c in calls]
    k = srcs[0].numel()
    for c in calls:
        out = c.payload[OUT_FLAT]
        if out.dim() == 1:
            for j, src in enumerate(srcs):
                K.copy_into(out.narrow(0, j * k, k), src)
        else:  # a channels-last output: its slots are blocks of dim 0
            rows = out.shape[0] // len(srcs)
            for j, src in enumerate(srcs):
                slot = out.narrow(0, j * rows, rows)
                K.copy_into(slot, src.view(slot.shape))


def _reduce_scatter(calls: list[Call], a: OpArgs) -> None:
    key = a.key
    for r, c in enumerate(calls):
        K.reduce_into(a.model, c.payload[OUT], [k.payload[INS][r] for k in calls], a.red, f"{key}/{r}")


def _reduce_scatter_tensor(calls: list[Call], a: OpArgs) -> None:
    key = a.key
    ins = [K.logical_flat(k.payload[IN], "reduce_scatter_tensor input") for k in calls]
    m = calls[0].payload[OUT].numel()
    for r, c in enumerate(calls):
        out = c.payload[OUT]
        # A channels-last output is written in logical order, through a flat copy.
        target = out if out.dim() == 1 else out.new_empty(m)
        parts = [x.narrow(0, r * m, m) for x in ins]
        K.reduce_into(a.model, target, parts, a.red, f"{key}/{r}")
        if target is not out:
            out.copy_(target.view(out.shape))


def _gather(calls: list[Call], a: OpArgs) -> None:
    _gather_into(calls[a.root].payload[OUTS], calls, a.group.ranks, "gather: root's gather_list")


def _scatter(calls: list[Call], a: OpArgs) -> None:
    ranks = a.group.ranks
    src = calls[a.root].payload[INS]
    for j, c in enumerate(calls):
        o = c.payload[OUT]
        if o.shape != src[j].shape:
            raise CollectiveMismatchError(
                f"scatter: rank {ranks[j]}'s output has shape {list(o.shape)} but the "
                f"root's scatter_list[{j}] has shape {list(src[j].shape)}"
            )
        K.copy_into(o, src[j])


def _all_to_all(calls: list[Call], a: OpArgs) -> None:
    ranks = a.group.ranks
    n = len(calls)
    for j, c in enumerate(calls):
        for i in range(n):
            o, src = c.payload[OUTS][i], calls[i].payload[INS][j]
            if o.shape != src.shape:
                raise CollectiveMismatchError(
                    f"all_to_all: rank {ranks[j]}'s output_tensor_list[{i}] has shape "
                    f"{list(o.shape)} but rank {ranks[i]} sends {list(src.shape)}"
                )
            o.copy_(src)


def _all_to_all_single(calls: list[Call], a: OpArgs) -> None:
    K.all_to_all_single(
        [c.payload[OUT] for c in calls],
        [c.payload[IN] for c in calls],
        [c.payload[OUT_SPLITS] for c in calls],
        [c.payload[IN_SPLITS] for c in calls],
        a.group.ranks,
    )


def _nothing(calls: list[Call], a: OpArgs) -> None:
    pass


# -- the table ------------------------------------------------------------------------

_W = frozenset


OPS: dict[str, OpSpec] = {
    s.name: s
    for s in (
        OpSpec("all_reduce", _all_reduce, updated=_W({T}), sent=(T,), sent_is_output=True, avg_bumps=1),
        OpSpec(
            "all_reduce_coalesced",
            _all_reduce_coalesced,
            updated=_W({TS}),
            sent=(TS,),
            sent_is_output=True,
            version_bumps=1,
        ),
        OpSpec("all_reduce_sparse", _all_reduce_sparse),
        OpSpec("broadcast", _broadcast, updated=_W({T}), sent=(T,)),
        # AVG's division runs on every member's tensor, the root's and the scratch ones.
        OpSpec("reduce", _reduce, updated=_W({T}), sent=(T,), sent_is_output=True, avg_bumps=1),
        OpSpec("all_gather", _all_gather, _W({OUTS}), _W({T}), sent=(T,), version_bumps=1),
        OpSpec(
            "all_gather_into_tensor",
            _all_gather_into_tensor,
            _W({OUT_FLAT}),
            _W({IN}),
            sent=(IN,),
            version_bumps=1,
            bumps_per_member=True,
        ),
        OpSpec(
            "reduce_scatter",
            _reduce_scatter,
            _W({OUT}),
            _W({INS}),
            sent=(INS,),
            version_bumps=1,
            avg_bumps=1,
        ),
        OpSpec(
            "reduce_scatter_tensor",
            _reduce_scatter_tensor,
            _W({OUT}),
            _W({IN}),
            sent=(IN,),
            version_bumps=1,
        ),
        OpSpec("gather", _gather, _W({OUTS}), _W({T}), sent=(T,), version_bumps=1),
        OpSpec("scatter", _scatter, _W({OUT}), _W({INS}), sent=(INS,)),
        OpSpec("all_to_all", _all_to_all, _W({OUTS}), _W({INS}), sent=(INS,), version_bumps=1),
        OpSpec("all_to_all_single", _all_to_all_single, _W({OUT}), _W({IN}), sent=(IN,)),
        OpSpec("barrier", _nothing),
        # Point to point: matched by the scheduler, delivered by p2p.deliver. A
        # send's payload is already simdist's own snapshot of the tensor.
        OpSpec("send", _nothing, sent=(T,), sent_is_output=True),
        OpSpec("recv", _nothing),
    )
}
