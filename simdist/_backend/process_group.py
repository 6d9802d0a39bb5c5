"""The simdist ``ProcessGroup``: torch.distributed calls -> rendezvous calls.

Each method validates its arguments, builds the call's fingerprint and payload
(keys from ``ops``) and dispatches to the op's row of the ops table; what
the op does lives there. Each rank thread owns its own ``SimProcessGroup``
objects (c10d creates one per rank per group), so a group object always knows
its rank, even when a collective is issued from an autograd thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _increment_version
from torch.distributed.distributed_c10d import GroupName

from .. import _sanitizer, stacks
from .._core.records import Call, GroupInfo
from .._core.scheduler import Scheduler
from .._isolation import profiler as _profiler
from ..errors import UnsupportedOperationError
from ..reduction import check_reduce_op
from . import ddp_logging as _ddp_logging  # noqa: F401  # registers its patch
from . import kernels as K
from .coalesced import Coalesced
from .current import _check_caller, _current, _refused
from .group import BACKEND_NAME, GroupIdentity
from .ops import INS, OPS, OUT, OUTS, SPARSE, TS, OpSpec, T, Whole
from .overlap import Completion
from .p2p import PointToPoint
from .profiled import record as record_profiled
from .shadow import show
from .timeouts import seconds_of
from .validation import member_list, one, root_in_group, root_list, same_dtype, shape
from .work import SimWork
from .world_hooks import WorldHooks

Fingerprint = tuple[tuple[str, Any], ...]


_BITWISE = ("BAND", "BOR", "BXOR")
_REDUCE_OPS = (dist.ReduceOp, dist.ReduceOp.RedOpType)


def _one_list(tensors: Any) -> list[torch.Tensor]:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _reduce_options(kind: Any, op: Any) -> Any:
    opts = kind()
    opts.reduceOp = op if op is not None else dist.ReduceOp.SUM
    return opts


# -- how a call holds the rank's buffers: as autograd-blind aliases, with the
# version-counter moves gloo makes ------------------------------------------------------


def detached(payload: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Detached aliases of every tensor in a payload, and whether any of them
    is an inference tensor.

    A real backend writes results straight into the tensors' memory, unseen by
    autograd: a Parameter can be broadcast into and a non-leaf keeps its
    grad_fn. ``.data`` aliases share that memory but neither the autograd
    history nor the version counter (``detach()`` would share the counter);
    the counter moves only where gloo moves it (``OpSpec.version_bumps``).
    """
    out: dict[str, Any] = {}
    inference = False
    for key, value in payload.items():
        if isinstance(value, torch.Tensor):
            out[key] = value.data
            inference = inference or value.is_inference()
        elif isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            out[key] = [t.data for t in value]
            inference = inference or any(t.is_inference() for t in value)
        else:
            out[key] = value
    return out, inference


def bump(result: list[torch.Tensor], times: int) -> None:
    """Move the outputs' version counters as gloo's kernels do (they write
    some outputs through tensor copies autograd sees). Inference tensors have
    no counter and are skipped by torch."""
    for _ in range(times):
        _increment_version(result)


class SimProcessGroup(GroupIdentity, Coalesced, PointToPoint, dist.ProcessGroup):
    """One rank's handle on one simulated communicator.

    The collectives override c10d's Backend API (lists of tensors and an
    options object), not the Python overloads the stubs describe: hence the
    ``override`` ignores on them.
    """

    def __init__(self, world: WorldHooks, rank: int, group: GroupInfo) -> None:
        ranks = group.ranks
        # (The world group lists every rank in order: no O(world) search per rank.)
        group_rank = rank if rank < len(ranks) and ranks[rank] == rank else ranks.index(rank)
        super().__init__(group_rank, len(ranks))  # type: ignore[call-arg]  # c10d's (rank, size) constructor is missing from torch's stub
        self._world = world
        self._scheduler: Scheduler = world.scheduler
        self._global_rank = rank
        self._group_rank = group_rank  # rank() is a pybind call; this is hot
        self._info = group
        self._seq = 0
        self._name = GroupName(group.name)
        self._desc = "undefined"
        self._backend_name = BACKEND_NAME
        self.timeout: float | None = None  # an explicit timeout= of the group, in seconds

    @property
    def info(self) -> GroupInfo:
        return self._info

    def __repr__(self) -> str:
        return f"SimProcessGroup({self.info.describe()}, rank={self._global_rank})"

    # -- plumbing -----------------------------------------------------------

    def _collective(
        self,
        spec: OpSpec,
        fingerprint: Fingerprint,
        payload: dict[str, Any],
        result: list[torch.Tensor],
        red: str = "SUM",
        root: int = 0,
        opts: Any = None,
    ) -> SimWork:
        # The hot path of every collective: kept flat on purpose (each Python
        # call costs about as much as the bookkeeping it would hide). ``opts``:
        # the caller's options, which say whether c10d waits for the call at once.
        op = spec.name
        started = perf_counter_ns() if _profiler.active else 0  # some rank profiles (profiled)
        if _current.world is not self._world or _current.rank != self._global_rank:
            _check_caller(self._scheduler, self._global_rank, op)
        seq = self._seq
        self._seq = seq + 1
        info = self._info
        world = self._world
        aliases, inference = detached(payload)
        call = Call(
            op,
            self._global_rank,
            self._group_rank,
            (("op", op),) + fingerprint,
            stacks.call_site(3),
            aliases,
            inference,
        )
        world.before_call(call, info, seq)
        done = Completion(spec, info, seq, world.reduction, red, root)
        # The completion's tensor work is the backend's, not the rank's.
        pending = _sanitizer.quietly(self._scheduler.join_collective, info, seq, call, done, world.verify)
        bumps = spec.version_bumps * (len(info.ranks) if spec.bumps_per_member else 1)
        if red == "AVG":
            bumps += spec.avg_bumps
        if bumps:
            bump(result, bumps)
        work = SimWork(
            self._scheduler, self._global_rank, pending, result, _sanitizer.synchronous_collective(opts)
        )
        if self.timeout is not None:
            work.timeout = self.timeout
        if opts is not None:
            # an op's own timeout (AllreduceOptions.timeout) outranks the group's
            seconds = seconds_of(getattr(opts, "timeout", None))
            if seconds is not None:
                work.timeout = seconds
        if started:
            record_profiled(self, op, payload, started)
        return work

    def _reduce_op(self, opts: Any, dtype: torch.dtype, op: str) -> str:
        try:
            red = check_reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, dtype, op)
            if red in _BITWISE and self._info.nccl:
                # NCCL has no bitwise reductions (ProcessGroupNCCL's own words).
                raise UnsupportedOperationError(f"{op}: Cannot use ReduceOp.{red} with NCCL")
            return red
        except UnsupportedOperationError as exc:
            raise _refused(exc)  # noqa: B904 (the same error, re-raised once it is noted world-wide)

    # -- collectives ----------------------------------------------------------

    def allreduce(self, tensors: Sequence[torch.Tensor], opts: Any = None, op: Any = None) -> SimWork:  # type: ignore[override]  # c10d's Backend API, not the stub's overloads
        if isinstance(tensors, torch.Tensor) or op is not None or isinstance(opts, _REDUCE_OPS):
            # the binding's convenience forms: allreduce(tensor, op=SUM), allreduce(tensors, op)
            tensors, opts = (
                _one_list(tensors),
                _reduce_options(dist.AllreduceOptions, op if op is not None else opts),
            )
        show(self, "allreduce", tensors, opts)
        t = one(tensors, "all_reduce")
        if t.is_sparse:
            return self._allreduce_sparse(t, opts)
        K.require_dense(t, "all_reduce", "tensor")
        red = self._reduce_op(opts or dist.AllreduceOptions(), t.dtype, "all_reduce")
        fp = (("shape", shape(t)), ("dtype", t.dtype), ("reduce_op", red))
        return self._collective(OPS["all_reduce"], fp, {T: t}, [t], red, opts=opts)

    def _allreduce_sparse(self, t: torch.Tensor, opts: Any) -> SimWork:
        red = self._reduce_op(opts or dist.AllreduceOptions(), t.dtype, "all_reduce")
        if red != "SUM":
            # gloo's words and type; NCCL has no sparse all_reduce at all
            raise _refused(
                UnsupportedOperationError(
                    "ProcessGroupGloo::allreduce: unsupported reduction operation (allreduce of "
                    f"sparse tensors only works with ReduceOp.SUM), got ReduceOp.{red}"
                )
            )
        fp = (("shape", shape(t)), ("dtype", t.dtype), ("layout", "sparse_coo"), ("reduce_op", red))
        return self._collective(OPS["all_reduce_sparse"], fp, {SPARSE: Whole(t)}, [t], red, opts=opts)

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        show(self, "allreduce_coalesced", tensors, opts)
        red = self._reduce_op(opts, tensors[0].dtype, "all_reduce_coalesced") if tensors else "SUM"
        fp = tuple((f"t{i}", (shape(t), t.dtype)) for i, t in enumerate(tensors))
        spec = OPS["all_reduce_coalesced"]
        payload = {TS: list(tensors)}
        work = self._collective(spec, fp + (("reduce_op", red),), payload, list(tensors), red, opts=opts)
        if red == "AVG" and len(tensors) == 1:
            # gloo's flat buffer of a single tensor is that tensor itself, so
            # AVG's in-place division shows on its counter too (measured).
            bump(list(tensors), 1)
        return work

    def broadcast(  # type: ignore[override]  # c10d's Backend API, not the stub's overloads
        self, tensors: Sequence[torch.Tensor], opts: Any = None, root: int | None = None
    ) -> SimWork:
        if isinstance(tensors, torch.Tensor) or root is not None or isinstance(opts, int):
            # the binding's convenience form: broadcast(tensor, root)
            bopts = dist.BroadcastOptions()
            bopts.rootRank = root if root is not None else (opts or 0)
            tensors, opts = _one_list(tensors), bopts
        show(self, "broadcast", tensors, opts)
        t = one(tensors, "broadcast")
        K.require_dense(t, "broadcast", "tensor")
        root = opts.rootRank if opts is not None else 0
        root_in_group(root, self.size(), "broadcast")
        fp = (("shape", shape(t)), ("dtype", t.dtype), ("root", root))
        return self._collective(OPS["broadcast"], fp, {T: t}, [t], root=root, opts=opts)

    def reduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:  # type: ignore[override]  # c10d's Backend API, not the stub's overloads
        show(self, "reduce", tensors, opts)
        t = one(tensors, "reduce")
        K.require_dense(t, "reduce", "tensor")
        red = self._reduce_op(opts, t.dtype, "reduce")
        root = opts.rootRank
        root_in_group(root, self.size(), "reduce")
        fp = (("shape", shape(t)), ("dtype", t.dtype), ("reduce_op", red), ("root", root))
        return self._collective(OPS["reduce"], fp, {T: t}, [t], red, root, opts)

    def allgather(  # type: ignore[override]  # c10d's Backend API, not the stub's overloads
        self, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        show(self, "allgather", output_lists, inputs, opts)
        t = one(inputs, "all_gather")
        outs = member_list(
            "all_gather", "tensor_list", output_lists, self.size(), "tensor", t, list_first=True
        )
        fp = (("dtype", t.dtype),)
        return self._collective(OPS["all_gather"], fp, {T: t, OUTS: outs}, outs, opts=opts)

    def reduce_scatter(  # type: ignore[override]  # c10d's Backend API, not the stub's overloads
        self, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]], opts: Any = None
    ) -> SimWork:
        show(self, "reduce_scatter", outputs, input_lists, opts)
        out = one(outputs, "reduce_scatter")
        K.require_dense(out, "reduce_scatter", "output")
        ins = member_list(
            "reduce_scatter",
            "input_list",
            input_lists,
            self.size(),
            "output",
            out,
            list_first=False,
        )
        # Entry r is reduced into member r's output, so entries may differ in
        # shape from member to member (gloo and NCCL take it): this rank's
        # own entry has its output's shape, and every member lists the same
        # shapes (the fingerprint holds them all).
        mine = ins[self._group_rank]
        if mine.shape != out.shape:
            raise ValueError(
                f"reduce_scatter: input_list[{self._group_rank}] has shape {list(mine.shape)}, "
                f"expected the output shape {list(out.shape)}"
            )
        red = self._reduce_op(opts, out.dtype, "reduce_scatter")
        fp = (("shapes", tuple(shape(t) for t in ins)), ("dtype", out.dtype), ("reduce_op", red))
        return self._collective(OPS["reduce_scatter"], fp, {OUT: out, INS: ins}, [out], red, opts=opts)

    def gather(  # type: ignore[override]  # c10d's Backend API, not the stub's overloads
        self, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        show(self, "gather", output_lists, inputs, opts)
        t = one(inputs, "gather")
        if t.is_complex():
            raise _refused(
                UnsupportedOperationError(
                    f"gather: complex dtype {t.dtype} is not supported (gloo refuses it: 'Invalid scalar "
                    f"type'); gather torch.view_as_real(tensor) instead"
                )
            )
        root = opts.rootRank
        outs = root_list("gather", root, self._group_rank, self.size(), "gather_list", output_lists, t, True)
        fp = (("dtype", t.dtype), ("root", root))
        return self._collective(OPS["gather"], fp, {T: t, OUTS: outs}, outs, root=root, opts=opts)

    def scatter(  # type: ignore[override]  # c10d's Backend API, not the stub's overloads
        self, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]], opts: Any = None
    ) -> SimWork:
        show(self, "scatter", outputs, input_lists, opts)
        out = one(outputs, "scatter")
        K.require_dense(out, "scatter", "tensor")
        root = opts.rootRank
        ins = root_list(
            "scatter",
            root,
            self._group_rank,
            self.size(),
            "scatter_list",
            input_lists,
            out,
            False,
            dense=True,
        )
        fp = (("dtype", out.dtype), ("root", root))
        return self._collective(OPS["scatter"], fp, {OUT: out, INS: ins}, [out], root=root, opts=opts)

    def alltoall(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        show(self, "alltoall", outputs, inputs, opts)
        n = self.size()
        if len(outputs) != n or len(inputs) != n:
            raise ValueError(
                f"all_to_all: expected {n} output and input tensors (the group size), "
                f"got {len(outputs)} and {len(inputs)}"
            )
        for i, t in enumerate(list(outputs) + list(inputs)):
            what = f"output_tensor_list[{i}]" if i < n else f"input_tensor_list[{i - n}]"
            same_dtype("all_to_all", what, t, "input_tensor_list[0]", inputs[0])
        dtypes = {t.dtype for t in list(outputs) + list(inputs)}
        fp = (("dtypes", tuple(sorted(map(str, dtypes)))),)
        payload = {OUTS: list(outputs), INS: list(inputs)}
        return self._collective(OPS["all_to_all"], fp, payload, list(outputs), opts=opts)

    def barrier(self, opts: Any = None) -> SimWork:
        show(self, "barrier", opts)
        earlier = _sanitizer.in_flight_on(self._global_rank, self._info.name)
        work = self._collective(OPS["barrier"], (), {}, [], opts=opts)
        work.completes = earlier  # (its timeout= is the op's own, set by _collective)
        return work

    # -- what a simulated communicator does not have ------------------------------
    # Each refusal is noted world-wide (``_refused``), so a body that catches the
    # error and falls back still fails the run.

    def _start_coalescing(self, device: Any) -> None:
        raise _refused(UnsupportedOperationError("coalescing managers are not supported by simdist"))
