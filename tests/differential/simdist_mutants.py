"""A catalogue of bugs planted in simdist's ops, to measure what the differential campaign catches.

Each mutant monkeypatches one of simdist's op functions and returns a
callable that undoes the patch. Every function a mutant patches is named in
``TARGETS`` (one table: when the ops move, e.g. into ``simdist/_backend/``,
retarget here) and resolved by name when the mutant is applied; a name that
no longer resolves raises ``MutantTargetError`` saying which entry to update.

``SIMDIST_MUTANT=<name>`` makes ``conftest.py`` apply one for a whole
session (campaign workers inherit it); ``applied(name)`` is the same as a
context manager.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

Undo = Callable[[], None]
ENV_VAR = "SIMDIST_MUTANT"

# Every patch target, "module:attribute.path". Retarget here when functions move.
TARGETS: dict[str, str] = {
    "check_reduce_op": "simdist._backend.process_group:check_reduce_op",
    "reduce_into": "simdist._backend.kernels:reduce_into",
    "copy_into": "simdist._backend.kernels:copy_into",
    "all_to_all_single": "simdist._backend.kernels:all_to_all_single",
    "deliver": "simdist._backend.p2p:deliver",
    "rank_order": "simdist.reduction:RankOrder.reduce_into",
    "allreduce": "simdist._backend.process_group:SimProcessGroup.allreduce",
    "broadcast": "simdist._backend.process_group:SimProcessGroup.broadcast",
    "reduce": "simdist._backend.process_group:SimProcessGroup.reduce",
    "allgather": "simdist._backend.process_group:SimProcessGroup.allgather",
    "all_gather_single": "simdist._backend.process_group:SimProcessGroup.all_gather_single",
    "reduce_scatter": "simdist._backend.process_group:SimProcessGroup.reduce_scatter",
    "reduce_scatter_single": "simdist._backend.process_group:SimProcessGroup.reduce_scatter_single",
    "gather": "simdist._backend.process_group:SimProcessGroup.gather",
    "scatter": "simdist._backend.process_group:SimProcessGroup.scatter",
    "alltoall": "simdist._backend.process_group:SimProcessGroup.alltoall",
    "peer": "simdist._backend.process_group:SimProcessGroup._peer",
    "join_collective": "simdist._core.scheduler:Scheduler.join_collective",
}


class MutantTargetError(LookupError):
    """A patch target of ``TARGETS`` no longer resolves (the function moved or was renamed)."""


def resolve(key: str) -> tuple[Any, str, Any]:
    """(owner, attribute, current value) of ``TARGETS[key]``."""
    if key not in TARGETS:
        raise MutantTargetError(f"no patch target {key!r} in TARGETS; known: {', '.join(sorted(TARGETS))}")
    module_name, _, path = TARGETS[key].partition(":")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise MutantTargetError(
            f"patch target {key!r} = {TARGETS[key]!r}: module {module_name!r} cannot be imported ({exc}); "
            f"update TARGETS[{key!r}] in tests/differential/simdist_mutants.py to where it lives now"
        ) from exc
    *parents, attribute = path.split(".")
    for part in parents:
        owner = getattr(owner, part, None)
        if owner is None:
            break
    if owner is None or not hasattr(owner, attribute):
        raise MutantTargetError(
            f"patch target {key!r} = {TARGETS[key]!r} does not resolve ({path!r} is not in "
            f"{module_name!r}); update TARGETS[{key!r}] in tests/differential/simdist_mutants.py"
        )
    return owner, attribute, getattr(owner, attribute)


def _patch(**replacements: Callable[[Any], Any]) -> Undo:
    """For each ``key=make``: set the target to ``make(original)``; return the undo."""
    resolved = [(resolve(key), make) for key, make in replacements.items()]
    for (owner, attribute, original), make in resolved:
        setattr(owner, attribute, make(original))

    def undo() -> None:
        for (owner, attribute, original), _ in reversed(resolved):
            setattr(owner, attribute, original)

    return undo


MUTANTS: dict[str, Callable[[], Undo]] = {}
FAMILIES: dict[str, str] = {}


def _mutant(family: str) -> Callable[[Callable[[], Undo]], Callable[[], Undo]]:
    def register(fn: Callable[[], Undo]) -> Callable[[], Undo]:
        MUTANTS[fn.__name__] = fn
        FAMILIES[fn.__name__] = family
        return fn

    return register


def apply(name: str) -> Undo:
    if name not in MUTANTS:
        raise ValueError(f"unknown simdist mutant {name!r}; expected one of {', '.join(sorted(MUTANTS))}")
    return MUTANTS[name]()


@contextlib.contextmanager
def applied(name: str) -> Iterator[None]:
    undo = apply(name)
    try:
        yield
    finally:
        undo()


def apply_from_environment() -> Undo | None:
    name = os.environ.get(ENV_VAR)
    return apply(name) if name else None


# ------------------------------------------------------------------ reduce ops


def _reduce_op_computed_as(wrong: dict[str, str]) -> Undo:
    def make(original: Callable[..., str]) -> Callable[..., str]:
        def check_reduce_op(op: object, dtype: torch.dtype, collective: str) -> str:
            name = original(op, dtype, collective)
            return wrong.get(name, name)

        return check_reduce_op

    return _patch(check_reduce_op=make)


@_mutant("reduce ops")
def max_as_min() -> Undo:
    """MAX is computed as MIN (a swapped entry in an op table)."""
    return _reduce_op_computed_as({"MAX": "MIN"})


@_mutant("reduce ops")
def product_as_sum() -> Undo:
    """PRODUCT is computed as SUM."""
    return _reduce_op_computed_as({"PRODUCT": "SUM"})


@_mutant("reduce ops")
def avg_not_divided() -> Undo:
    """AVG forgets to divide by the group size (computed as SUM)."""
    return _reduce_op_computed_as({"AVG": "SUM"})


@_mutant("reduce ops")
def bxor_as_bor() -> Undo:
    """BXOR is computed as BOR."""
    return _reduce_op_computed_as({"BXOR": "BOR"})


# ------------------------------------------------- which member gets what


def _calls_reordered(ops: tuple[str, ...] | None, order: Callable[[list[Any], list[int]], list[int]]) -> Undo:
    """Every completion of ``ops`` (None: all) sees the members' calls in
    ``order(calls, arrival)`` instead of group-rank order."""
    arrivals: dict[tuple[str, int], list[int]] = {}

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def join_collective(self: Any, group: Any, seq: int, call: Any, complete: Any, verify: Any) -> Any:
            key = (group.name, seq)
            arrivals.setdefault(key, []).append(call.group_rank)
            if ops is not None and call.op not in ops:
                return original(self, group, seq, call, complete, verify)

            def reordered(calls: list[Any]) -> None:
                complete([calls[i] for i in order(calls, arrivals.pop(key, list(range(len(calls)))))])

            return original(self, group, seq, call, reordered, verify)

        return join_collective

    return _patch(join_collective=make)


def _by_global_rank(calls: list[Any], arrival: list[int]) -> list[int]:
    n = len(calls)
    return sorted(range(n), key=lambda i: (calls[i].rank % n, calls[i].rank))


@_mutant("ordering")
def results_in_arrival_order() -> Undo:
    """Members' contributions are taken in the order they arrived, not by group rank."""
    return _calls_reordered(None, lambda calls, arrival: arrival)


@_mutant("group vs global rank")
def reduce_scatter_chunk_by_global_rank() -> Undo:
    """reduce_scatter_tensor gives each member the chunk of its global rank (mod n), not its group rank."""
    return _calls_reordered(("reduce_scatter_tensor",), _by_global_rank)


@_mutant("group vs global rank")
def all_gather_slot_by_global_rank() -> Undo:
    """all_gather_into_tensor places each input at its global rank's slot (mod n)."""
    return _calls_reordered(("all_gather_into_tensor",), _by_global_rank)


def _root_as_global(method: str) -> Undo:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def rooted(self: Any, *args: Any) -> Any:
            opts = args[-1]  # c10d passes the options last, positionally
            if opts is not None:
                # The group rank is taken for a global rank, folded into the group.
                opts.rootRank = self.info.ranks[opts.rootRank] % self.size()
            return original(self, *args)

        return rooted

    return _patch(**{method: make})


@_mutant("group vs global rank")
def broadcast_root_as_global_rank() -> Undo:
    """broadcast's root group rank is used as a global rank (folded into the group)."""
    return _root_as_global("broadcast")


@_mutant("group vs global rank")
def scatter_root_as_global_rank() -> Undo:
    """scatter's root group rank is used as a global rank (folded into the group)."""
    return _root_as_global("scatter")


@_mutant("p2p")
def p2p_peer_as_global_rank() -> Undo:
    """send/recv take the peer's group rank for its global rank."""

    def make(original: Callable[..., int]) -> Callable[..., int]:
        def peer(self: Any, group_rank: int, op: str, arg: str) -> int:
            original(self, group_rank, op, arg)  # keep its argument checks
            return group_rank

        return peer

    return _patch(peer=make)


@_mutant("all_to_all")
def all_to_all_single_output_offsets_from_input() -> Undo:
    """all_to_all_single writes each block at the input's offsets (right only when splits are even)."""

    def make(original: Callable[..., None]) -> Callable[..., None]:
        def all_to_all_single(outs: Any, ins: Any, out_splits: Any, in_splits: Any, ranks: Any) -> None:
            n = len(outs)
            for j in range(n):
                for i in range(n):
                    rows = in_splits[i][j]
                    if rows == 0:
                        continue
                    start = sum(in_splits[j][:i])  # the bug: the receiver's own input offsets
                    start = min(start, outs[j].shape[0] - rows)
                    outs[j].narrow(0, start, rows).copy_(ins[i].narrow(0, sum(in_splits[i][:j]), rows))

        return all_to_all_single

    return _patch(all_to_all_single=make)


# ------------------------------------------------------------ views, aliasing


@_mutant("aliasing")
def reduce_into_ignores_aliasing() -> Undo:
    """Reductions write the output before reading an input that aliases it (no temporary)."""

    def make(original: Callable[..., None]) -> Callable[..., None]:
        def reduce_into(model: Any, out: torch.Tensor, inputs: Any, op: str, key: str) -> None:
            model.reduce_into(out, inputs, op, key)

        return reduce_into

    return _patch(reduce_into=make)


@_mutant("views")
def strided_outputs_written_to_a_copy() -> Undo:
    """Gathers write a non-contiguous output through ``.contiguous()``: the write is lost."""

    def make(original: Callable[..., None]) -> Callable[..., None]:
        def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
            original(dst.contiguous(), src)

        return copy_into

    return _patch(copy_into=make)


@_mutant("version counters")
def all_reduce_bumps_version() -> Undo:
    """all_reduce moves its tensor's autograd version counter (gloo's does not)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def allreduce(self: Any, tensors: Any, opts: Any = None) -> Any:
            torch.autograd.graph.increment_version(tensors[0])
            return original(self, tensors, opts)

        return allreduce

    return _patch(allreduce=make)
