"""``ProcessGroupGloo(store, rank, size, options)`` built directly by a test,
as a simdist group: gloo's own Python API on it.

PyTorch's c10d tests make gloo groups by hand, not through
``init_process_group``: a real one in a rank thread would rendezvous over
TCP with peers that simdist runs one at a time, and wait out its timeout.
While ``torch_compat`` is installed, ``torch.distributed.ProcessGroupGloo``
called inside a rank builds a ``GlooGroup`` instead (anywhere else, and for
every class attribute, ``_Options``, ``create_device``, it is torch's own).

What gloo adds to the c10d Backend API a simdist group implements, done here
before a call goes on as one tensor a rank: the binding's convenience
overloads (``allreduce(tensor)``...), several tensors a rank (as gloo
combines them), and gloo's argument checks in gloo's words, raised on the
calling rank before anything is sent.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .._backend.current import current_world
from .._backend.process_group import SimProcessGroup
from .._backend.work import SimWork, all_of
from .._core import identity
from ..reduction import _combine_fn, op_name

_REAL = dist.ProcessGroupGloo

# A rank's direct constructions, in order: the n-th on every rank is one
# communicator (as gloo's groups pair up by the order a store sees them).
_made: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()


def _fail(op: str, message: str) -> RuntimeError:
    return RuntimeError(f"ProcessGroupGloo::{op}: {message}")


def _kind(t: torch.Tensor) -> str:
    return f"{t.device.type}:{t.dtype}"


def _check_same(op: str, tensors: Sequence[torch.Tensor], like: torch.Tensor | None = None) -> None:
    """gloo's assertTypeAndSizesMatch: every tensor of ``like``'s type and size."""
    if not tensors:
        return
    first = like if like is not None else tensors[0]
    for i, t in enumerate(tensors):
        if t.dtype != first.dtype or t.device.type != first.device.type:
            raise _fail(op, f"invalid tensor type at index {i} (expected {_kind(first)}, got {_kind(t)})")
        if t.shape != first.shape:
            raise _fail(
                op, f"invalid tensor size at index {i} (expected {list(first.shape)}, got {list(t.shape)})"
            )


def _check_root(op: str, root: int, size: int) -> None:
    if not 0 <= root < size:
        raise _fail(op, f"invalid root rank: {root}")


def _check_dense(op: str, tensors: Sequence[torch.Tensor]) -> None:
    for i, t in enumerate(tensors):
        if t.layout != torch.strided:
            raise _fail(op, f"invalid tensor layout at index {i}")


def _opts(kind: type, **fields: Any) -> Any:
    opts = kind()
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


class GlooGroup(SimProcessGroup):
    """A hand-built gloo group of the whole run: gloo's API over simdist's."""

    @classmethod
    def make(cls, store: Any, rank: int, size: int, options: Any = None, timeout: Any = None) -> GlooGroup:
        world, me = current_world()
        if size != world.scheduler.world_size or rank != me:
            raise ValueError(
                f"ProcessGroupGloo(store, rank={rank}, size={size}) in rank {me} of a simdist world of "
                f"{world.scheduler.world_size}: simdist builds hand-made gloo groups of the whole world, "
                f"each rank with its own rank"
            )
        counts = _made.setdefault(world, {})
        n = counts.get(me, 0)
        counts[me] = n + 1
        info = world.register_group(f"gloo-{n}", tuple(range(size)), me)
        group = cls(world, me, info)
        group.report_backend_as("gloo")
        seconds = _seconds(timeout if timeout is not None else getattr(options, "_timeout", None))
        if seconds is not None:
            group.model_timeout(seconds)
        group.options = options
        return group

    # -- the binding's overloads, one form each -------------------------------

    def allreduce(self, tensors: Any, opts: Any = None, op: Any = None) -> SimWork:  # type: ignore[override]  # gloo's overloads
        if isinstance(tensors, torch.Tensor):  # allreduce(tensor, op=SUM)
            tensors = [tensors]
        if op is not None:
            opts = op
        if opts is None or isinstance(opts, dist.ReduceOp | dist.ReduceOp.RedOpType):
            opts = _opts(dist.AllreduceOptions, reduceOp=opts if opts is not None else dist.ReduceOp.SUM)
        tensors = list(tensors)
        if not tensors:
            raise _fail("allreduce", "requires non-empty tensor list")
        layout = tensors[0].layout
        for i, t in enumerate(tensors):
            if t.layout != layout:
                raise _fail(
                    "allreduce", f"invalid tensor layout at index {i} (expected {layout}, got {t.layout})"
                )
        _check_same("allreduce", tensors)
        if layout == torch.sparse_coo:
            name = op_name(opts.reduceOp)
            if name != "SUM":
                raise _fail(
                    "allreduce",
                    "unsupported reduction operation (allreduce of sparse tensors only works with ReduceOp.SUM)",
                )
        elif layout != torch.strided:
            raise _fail("allreduce", "unsupported layout")
        if len(tensors) == 1:
            return super().allreduce(tensors, opts)
        if layout == torch.sparse_coo:
            local = sum(tensors[1:], tensors[0]).coalesce()
        else:
            name = op_name(opts.reduceOp)
            if name == "AVG":  # an average over the group of a rank's local sum would not be gloo's
                raise _fail("allreduce", f"unsupported reduction operation {name} for several tensors a rank")
            combine = _combine_fn(name, tensors[0].dtype)
            local = tensors[0].clone()
            for t in tensors[1:]:
                local = combine(local, t)
        return self._spread(super().allreduce([local], opts), [(t, local) for t in tensors], tensors)

    def broadcast(self, tensors: Any, opts: Any = None, root: int | None = None) -> SimWork:  # type: ignore[override]  # gloo's overloads
        if isinstance(tensors, torch.Tensor):  # broadcast(tensor, root)
            tensors = [tensors]
        if root is not None:
            opts = root
        if opts is None or isinstance(opts, int):
            opts = _opts(dist.BroadcastOptions, rootRank=opts or 0, rootTensor=0)
        tensors = list(tensors)
        _check_root("broadcast", opts.rootRank, self.size())
        if not 0 <= opts.rootTensor < len(tensors):
            raise _fail("broadcast", f"invalid root tensor: {opts.rootTensor}")
        _check_dense("broadcast", tensors)
        _check_same("broadcast", tensors)
        if len(tensors) == 1:
            return super().broadcast(tensors, opts)
        source = tensors[opts.rootTensor if self.rank() == opts.rootRank else 0]
        work = super().broadcast([source], _opts(dist.BroadcastOptions, rootRank=opts.rootRank, rootTensor=0))
        return self._spread(work, [(t, source) for t in tensors if t is not source], tensors)

    def reduce(self, tensors: Any, opts: Any = None, op: Any = None, root: int | None = None) -> SimWork:  # type: ignore[override]  # gloo's overloads
        if root is not None:
            opts = root
        if isinstance(tensors, torch.Tensor):  # reduce(tensor, root, op=SUM)
            tensors = [tensors]
            opts = _opts(
                dist.ReduceOptions,
                rootRank=opts or 0,
                rootTensor=0,
                reduceOp=op if op is not None else dist.ReduceOp.SUM,
            )
        if opts is None:
            opts = dist.ReduceOptions()
        tensors = list(tensors)
        _check_root("reduce", opts.rootRank, self.size())
        if not 0 <= opts.rootTensor < len(tensors):
            raise _fail("reduce", f"invalid root tensor: {opts.rootTensor}")
        if len(tensors) != 1:
            raise _fail("reduce", "requires a single-element tensor list")
        _check_dense("reduce", tensors)
        return super().reduce(tensors, opts)

    def allgather(self, output_lists: Any, inputs: Any, opts: Any = None) -> SimWork:
        if isinstance(inputs, torch.Tensor):  # allgather(outputs, tensor)
            inputs, output_lists = [inputs], [output_lists]
        inputs = list(inputs)
        output_lists = [list(outs) for outs in output_lists]
        if not inputs:
            raise _fail("allgather", "requires non-empty input tensor list")
        if len(inputs) != len(output_lists):
            raise _fail(
                "allgather",
                f"requires input/output tensor lists to have the same length, got {len(inputs)} and {len(output_lists)}",
            )
        expected = len(inputs) * self.size()
        for i, outs in enumerate(output_lists):
            if len(outs) != expected:
                raise _fail(
                    "allgather",
                    f"invalid output tensor list at index {i} (expected length {expected}, got {len(outs)})",
                )
        _check_dense("allgather", inputs)
        _check_same("allgather", inputs)
        for outs in output_lists:
            _check_same("allgather", outs, inputs[0])
        if len(inputs) == 1:
            return super().allgather(output_lists, inputs, opts)
        # gloo gathers every rank's inputs in order: rank r's input i lands
        # at r * n + i of every output list.
        n = len(inputs)
        stacked = torch.stack(inputs)
        gathered = [torch.empty_like(stacked) for _ in range(self.size())]
        work = super().allgather([gathered], [stacked], opts)
        copies = (
            (outs[r * n + i], block[i])
            for outs in output_lists
            for r, block in enumerate(gathered)
            for i in range(n)
        )
        return self._spread(work, copies, output_lists)  # gloo's future holds the output lists themselves

    def _spread(
        self, work: SimWork, copies: Iterable[tuple[torch.Tensor, torch.Tensor]], result: Any
    ) -> SimWork:
        """Once ``work`` (one call for several tensors a rank) is done, ``copies`` are made."""
        work.wait()
        for target, source in copies:
            target.copy_(source)
        return all_of(self._scheduler, self._global_rank, [work], result)

    def allgather_coalesced(self, output_lists: Any, inputs: Any, opts: Any = None) -> SimWork:
        inputs = list(inputs)
        if not inputs:
            raise _fail("allgather_coalesced", "requires non-empty input tensor list")
        if len(output_lists) != self.size():
            raise _fail("allgather_coalesced", "output lists should be equal to world size")
        for outs in output_lists:
            if len(outs) != len(inputs):
                raise _fail(
                    "allgather_coalesced",
                    f"invalid output size: (expected length {len(inputs)}, got {len(outs)})",
                )
            for i, (out, t) in enumerate(zip(outs, inputs, strict=True)):
                if out.shape != t.shape:
                    raise _fail(
                        "allgather_coalesced",
                        f"invalid size of output tensor at index {i} (expected length {list(t.shape)}, "
                        f"got {list(out.shape)})",
                    )
                if out.dtype != t.dtype or out.device.type != t.device.type:
                    raise _fail(
                        "allgather_coalesced",
                        f"invalid tensor type at index {i} (expected {_kind(t)}, got {_kind(out)})",
                    )
        _check_dense("allgather_coalesced", inputs)
        return super().allgather_coalesced(output_lists, inputs, opts)

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        tensors = list(tensors)
        if not tensors:
            raise _fail("allreduce_coalesced", "requires non-empty tensor list")
        for i, t in enumerate(tensors):
            if t.layout != tensors[0].layout:
                raise _fail("allreduce_coalesced", f"invalid tensor layout at index {i}")
        for t in tensors[1:]:
            if t.dtype != tensors[0].dtype:
                raise _fail("allreduce_coalesced", "tensors must all have the same type")
        if tensors[0].layout != torch.strided:
            raise _fail("allreduce_coalesced", "unsupported layout")
        return super().allreduce_coalesced(tensors, opts or dist.AllreduceCoalescedOptions())

    def gather(self, output_lists: Any, inputs: Any, opts: Any = None, root: int | None = None) -> SimWork:  # type: ignore[override]  # gloo's overloads
        inputs, output_lists, opts = self._rooted(
            "gather", dist.GatherOptions, inputs, output_lists, opts, root
        )
        return super().gather(output_lists, inputs, opts)

    def scatter(self, outputs: Any, input_lists: Any, opts: Any = None, root: int | None = None) -> SimWork:  # type: ignore[override]  # gloo's overloads
        outputs, input_lists, opts = self._rooted(
            "scatter", dist.ScatterOptions, outputs, input_lists, opts, root
        )
        return super().scatter(outputs, input_lists, opts)

    def _rooted(self, op: str, kind: type, mine: Any, lists: Any, opts: Any, root: int | None) -> Any:
        """gather's and scatter's overloads and checks, in gloo's words: one
        tensor of this rank's (``mine``), and on the root one list of a tensor
        a member (``lists``: gather's outputs, scatter's inputs), nothing elsewhere."""
        if root is not None:
            opts = root
        if isinstance(mine, torch.Tensor):  # gather(outputs, tensor, root), scatter(output, inputs, root)
            mine = [mine]
            lists = [lists] if self.rank() == (opts or 0) else []
            opts = _opts(kind, rootRank=opts or 0)
        opts = opts if opts is not None else kind()
        _check_root(op, opts.rootRank, self.size())
        mine = list(mine)
        own, role = ("input", "output") if op == "gather" else ("output", "input")
        if len(mine) != 1:
            raise _fail(op, f"requires a single-element {own} tensor list")
        _check_dense(op, mine)
        if self.rank() != opts.rootRank:
            if len(lists):
                raise _fail(op, f"requires empty {role} on non-root")
            return mine, lists, opts
        if len(lists) != 1:
            raise _fail(
                op, f"requires a single-element {role} list containing a list with {self.size()} tensors"
            )
        if len(lists[0]) != self.size():
            raise _fail(
                op,
                f"Incorrect {role} list size {len(lists[0])}. {role.capitalize()} list size should be "
                f"{self.size()}, same as size of the process group.",
            )
        _check_same(op, list(lists[0]), mine[0])
        return mine, lists, opts


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


class _GlooClass(type):
    """``ProcessGroupGloo`` as a test sees it: a GlooGroup when built inside
    a rank; torch's class for everything else."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if identity.me.world is not None:
            return GlooGroup.make(*args, **kwargs)
        return _REAL(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        return getattr(_REAL, name)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _REAL | GlooGroup)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _REAL | GlooGroup)


class ProcessGroupGloo(metaclass=_GlooClass):
    """Stands in for ``torch.distributed.ProcessGroupGloo`` while installed."""
