"""The simdist ``ProcessGroup``: torch.distributed calls -> rendezvous calls.

Each method validates its arguments, builds the call's fingerprint and payload
(keys from ``payload``) and dispatches to the op's row of the ops table; what
the op does lives there. Each rank thread owns its own ``SimProcessGroup``
objects (c10d creates one per rank per group), so a group object always knows
its rank, even when a collective is issued from an autograd thread.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from datetime import timedelta
from time import perf_counter_ns
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import GroupName

from .. import _sanitizer, stacks
from .._core.records import Call, GroupInfo
from .._core.scheduler import Scheduler
from .._isolation import profiler as _profiler
from .._isolation.c10d_state import scoped_name
from ..errors import UnsupportedOperationError
from ..reduction import check_reduce_op
from . import ddp_logging as _ddp_logging  # noqa: F401  # registers its patch
from . import kernels as K
from .buffers import bump, detached
from .coalesced import Coalesced
from .current import _check_caller, _current, _refused
from .dispatch import Completion
from .monitored import monitored_barrier
from .ops import OPS, SPARSE, OpSpec, Whole
from .p2p import PointToPoint
from .payload import IN, IN_SPLITS, INS, OUT, OUT_FLAT, OUT_SPLITS, OUTS, TS, T
from .profiled import as_one_call
from .profiled import record as record_profiled
from .refused import Refusals
from .shadow import modes_active, show
from .timeouts import seconds_of
from .validation import group_sized, member_list, one, root_in_group, root_list, same_dtype, shape
from .work import SimWork, all_of
from .world_hooks import WorldHooks

BACKEND_NAME = "simdist"

Fingerprint = tuple[tuple[str, Any], ...]


_BITWISE = ("BAND", "BOR", "BXOR")
_REDUCE_OPS = (dist.ReduceOp, dist.ReduceOp.RedOpType)


def _one_list(tensors: Any) -> list[torch.Tensor]:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _reduce_options(kind: Any, op: Any) -> Any:
    opts = kind()
    opts.reduceOp = op if op is not None else dist.ReduceOp.SUM
    return opts


def c10d_default_timeout() -> timedelta:
    return dist.distributed_c10d.default_pg_timeout


class SimProcessGroup(Coalesced, PointToPoint, Refusals, dist.ProcessGroup):
    """One rank's handle on one simulated communicator.

    The collectives override c10d's Backend API (lists of tensors and an
    options object), not the Python overloads the stubs describe: hence the
    ``override`` ignores on them.
    """

    def __init__(self, world: WorldHooks, rank: int, group: GroupInfo) -> None:
        super().__init__(group.ranks.index(rank), len(group.ranks))  # type: ignore[call-arg]  # c10d's (rank, size) constructor is missing from torch's stub
        self._world = world
        self._scheduler: Scheduler = world.scheduler
        self._global_rank = rank
        self._group_rank = group.ranks.index(rank)  # rank() is a pybind call; this is hot
        self._info = group
        self._seq = 0
        self._name = GroupName(group.name)
        self._desc = "undefined"
        self._backend_name = BACKEND_NAME
        self.timeout: float | None = None  # an explicit timeout= of the group, in seconds

    # c10d stores names in the C++ backend, which a Python group does not have.
    # The name c10d resolves groups by (functional collectives, DTensor) is
    # unique to this run and rank; see c10d_state.
    def _set_group_name(self, name: str) -> None:
        self._name = GroupName(scoped_name(name))

    @property
    def group_name(self) -> GroupName:
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc
        if desc and desc not in ("undefined", "default_pg"):
            self._world.label_group(self._info.name, desc)

    @property
    def group_desc(self) -> str:
        return self._desc

    # c10d's C++ side (DDP's logger) reads getBackendName() and, for "gloo",
    # looks up a gloo backend this group does not have: it keeps the true
    # name. Python code reads _get_backend_name(): the name the program asked for.
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return self._backend_name

    def name(self) -> str:
        """``pg.name()`` as c10d answers it: the backend asked for ("gloo"),
        or "custom" for a group asked for as simdist (a registered backend)."""
        return "custom" if self._backend_name == BACKEND_NAME else self._backend_name

    def _get_backend(self, device: Any) -> SimProcessGroup:  # type: ignore[override]  # c10d's stub returns its Backend type
        """c10d's backend for a device: a simdist group serves every device itself."""
        return self

    @staticmethod
    def create_device(hostname: str = "", interface: str = "", lazy_init: bool | None = None) -> Any:
        """gloo's ``create_device``, which code calls on the backend of a
        gloo group: torch's own (simdist's transport needs no device)."""
        kwargs: dict[str, Any] = {"hostname": hostname, "interface": interface}
        if lazy_init is not None:
            kwargs["lazy_init"] = lazy_init
        return dist.ProcessGroupGloo.create_device(**kwargs)

    def model_timeout(self, seconds: float) -> None:
        """The group was made with an explicit ``timeout=``: its waits time out as
        gloo's do, the moment they can never complete (see ``timeouts``)."""
        self.timeout = seconds
        self._options()._timeout = timedelta(seconds=seconds)

    def set_timeout(self, timeout: timedelta) -> None:
        """c10d's ``pg.set_timeout``: the group's later waits time out after it."""
        self.model_timeout(timeout.total_seconds())

    def _set_default_timeout(self, timeout: timedelta) -> None:
        self.model_timeout(timeout.total_seconds())

    def _options(self) -> Any:
        opts = self.__dict__.get("options")
        if opts is None:
            # gloo's options object, as a gloo backend's ``options`` holds it
            # (its ``_timeout`` is the group's); a plain namespace without gloo.
            kind = getattr(dist, "ProcessGroupGloo", None)
            opts = kind._Options() if kind is not None else types.SimpleNamespace()
            opts._timeout = c10d_default_timeout()
            self.__dict__["options"] = opts
        return opts

    @property
    def options(self) -> Any:
        return self._options()

    @options.setter
    def options(self, value: Any) -> None:
        self.__dict__["options"] = value

    def report_backend_as(self, name: str) -> None:
        """The backend name the program asked for ("gloo"), reported instead of "simdist"."""
        self._backend_name = name
        if name.lower() == "nccl":
            self.asked_for_nccl()

    def asked_for_nccl(self) -> None:
        """The program asked for NCCL: the sanitizer holds the group to NCCL's ordering rule."""
        self._info.nccl = True

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
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
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
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
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
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "broadcast", tensors, opts)
        t = one(tensors, "broadcast")
        K.require_dense(t, "broadcast", "tensor")
        root = opts.rootRank if opts is not None else 0
        root_in_group(root, self.size(), "broadcast")
        fp = (("shape", shape(t)), ("dtype", t.dtype), ("root", root))
        return self._collective(OPS["broadcast"], fp, {T: t}, [t], root=root, opts=opts)

    def reduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:  # type: ignore[override]  # c10d's Backend API, not the stub's overloads
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
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
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "allgather", output_lists, inputs, opts)
        t = one(inputs, "all_gather")
        outs = member_list(
            "all_gather", "tensor_list", output_lists, self.size(), "tensor", t, list_first=True
        )
        fp = (("dtype", t.dtype),)
        return self._collective(OPS["all_gather"], fp, {T: t, OUTS: outs}, outs, opts=opts)

    def allgather_coalesced(
        self,
        output_lists: Sequence[Sequence[torch.Tensor]],
        inputs: Sequence[torch.Tensor],
        opts: Any = None,
    ) -> SimWork:
        """``all_gather_coalesced`` (deprecated in torch): ``output_lists[r][i]``
        receives input ``i`` of group rank ``r``, as gloo fills it. One
        all_gather per input, waited for as one call."""
        n = self.size()
        if len(output_lists) != n:
            raise ValueError(
                f"all_gather_coalesced: output_tensor_lists has {len(output_lists)} lists, "
                f"expected group size {n}"
            )
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise ValueError(
                    f"all_gather_coalesced: output_tensor_lists[{r}] has {len(outs)} tensors, "
                    f"expected one per input tensor ({len(inputs)})"
                )
        with as_one_call(self, "all_gather", inputs, perf_counter_ns() if _profiler.active else 0):
            works: list[dist.Work] = [
                self.allgather([[outs[i] for outs in output_lists]], [t], opts) for i, t in enumerate(inputs)
            ]
        return all_of(self._scheduler, self._global_rank, works, [t for outs in output_lists for t in outs])

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "all_gather_single", output, input, opts)
        return self._all_gather_single(output, input, opts)

    def _all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        """``all_gather_single`` past the modes (a coalesced call shows them one op for all)."""
        same_dtype("all_gather_into_tensor", "output_tensor", output, "input_tensor", input)
        group_sized("all_gather_into_tensor", "output_tensor", output, "input", input, self.size())
        out_flat = _flat_or_blocks(output, "all_gather_into_tensor", "output_tensor", self.size())
        fp = (("shape", shape(input)), ("dtype", input.dtype))
        payload = {IN: input, OUT_FLAT: out_flat}
        return self._collective(OPS["all_gather_into_tensor"], fp, payload, [output], opts=opts)

    def reduce_scatter(  # type: ignore[override]  # c10d's Backend API, not the stub's overloads
        self, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]], opts: Any = None
    ) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
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

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "reduce_scatter_single", output, input, opts)
        return self._reduce_scatter_single(output, input, opts)

    def _reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> SimWork:
        """``reduce_scatter_single`` past the modes (a coalesced call shows them one op for all)."""
        same_dtype("reduce_scatter_tensor", "output", output, "input", input)
        group_sized("reduce_scatter_tensor", "input", input, "output", output, self.size())
        red = self._reduce_op(opts, output.dtype, "reduce_scatter_tensor")
        in_flat = input if K.dense(input) else K.flat(input, "reduce_scatter_tensor input")
        out_flat = (
            output.view(-1) if output.is_contiguous() else _dense(output, "reduce_scatter_tensor output")
        )
        fp = (("shape", shape(output)), ("dtype", output.dtype), ("reduce_op", red))
        payload = {IN: in_flat, OUT: out_flat}
        return self._collective(OPS["reduce_scatter_tensor"], fp, payload, [output], red, opts=opts)

    def gather(  # type: ignore[override]  # c10d's Backend API, not the stub's overloads
        self, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
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
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
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
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
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

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(
                self,
                "all_to_all_single",
                output,
                input,
                list(output_split_sizes),
                list(input_split_sizes),
                opts,
            )
        n = self.size()
        K.require_dense(output, "all_to_all_single", "output")
        K.require_dense(input, "all_to_all_single", "input")
        out_splits = K.check_splits(
            output_split_sizes,
            output.shape[0] if output.dim() else 0,
            n,
            "all_to_all_single output_split_sizes",
        )
        in_splits = K.check_splits(
            input_split_sizes, input.shape[0] if input.dim() else 0, n, "all_to_all_single input_split_sizes"
        )
        if output.shape[1:] != input.shape[1:]:
            raise ValueError(
                f"all_to_all_single: output and input must agree beyond dim 0, got "
                f"{list(output.shape)} and {list(input.shape)}"
            )
        fp = (("row_shape", shape(input)[1:]), ("dtype", input.dtype))
        payload = {OUT: output, IN: input, OUT_SPLITS: out_splits, IN_SPLITS: in_splits}
        return self._collective(OPS["all_to_all_single"], fp, payload, [output], opts=opts)

    def barrier(self, opts: Any = None) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "barrier", opts)
        earlier = _sanitizer.in_flight_on(self._global_rank, self._info.name)
        work = self._collective(OPS["barrier"], (), {}, [], opts=opts)
        work.completes = earlier
        seconds = seconds_of(getattr(opts, "timeout", None))
        if seconds is not None:
            work.timeout = seconds
        return work

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        monitored_barrier(self, timeout, wait_all_ranks)


def _dense(t: torch.Tensor, what: str) -> torch.Tensor:
    """A channels-last tensor as it is (gloo and NCCL take one); else ``flat``'s refusal."""
    if not K.dense(t):
        K.flat(t, what)
    return t


def _flat_or_blocks(output: torch.Tensor, op: str, what: str, size: int) -> torch.Tensor:
    """A contiguous output as a flat view; a channels-last one as it is, its
    slots being blocks of dim 0 (refused when dim 0 does not split so)."""
    if output.is_contiguous():
        return output.view(-1)
    _dense(output, f"{op} {what}")
    if output.shape[0] % size:
        raise ValueError(
            f"{op}: a channels-last {what} must split into {size} slots along dim 0, got shape {list(output.shape)}"
        )
    return output
