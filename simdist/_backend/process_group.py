"""The simdist ``ProcessGroup``: torch.distributed calls -> rendezvous calls.

Each method validates its arguments, builds the call's fingerprint and payload
(keys from ``payload``) and dispatches to the op's row of the ops table; what
the op does lives there. Each rank thread owns its own ``SimProcessGroup``
objects (c10d creates one per rank per group), so a group object always knows
its rank, even when a collective is issued from an autograd thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C import _increment_version

from .. import stacks
from .._core.records import Call, GroupInfo, P2POp
from .._core.scheduler import Scheduler
from .._isolation.c10d_state import scoped_name
from ..errors import UnsupportedOperationError
from ..reduction import check_reduce_op
from . import kernels as K
from .current import _check_caller, _current, _refused
from .dispatch import Completion
from .ops import OPS, OpSpec
from .p2p import deliver
from .payload import IN, IN_SPLITS, INS, OUT, OUT_FLAT, OUT_SPLITS, OUTS, TS, T
from .shadow import modes_active, show
from .work import SimWork, all_of

if TYPE_CHECKING:
    from .registration import WorldHooks

BACKEND_NAME = "simdist"

Fingerprint = tuple[tuple[str, Any], ...]


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _one(tensors: Sequence[Any], op: str) -> Any:
    if len(tensors) != 1:
        raise _refused(
            UnsupportedOperationError(f"{op}: simdist takes one tensor per rank per call, got {len(tensors)}")
        )
    return tensors[0]


def _same_dtype(op: str, name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    """gloo and NCCL refuse outputs and inputs of different dtypes; so does simdist
    (a silent cast would pass a test that fails on a cluster)."""
    if a.dtype != b.dtype:
        raise ValueError(
            f"{op}: {name_a} has dtype {a.dtype} but {name_b} has dtype {b.dtype}; real "
            f"backends (gloo, NCCL) refuse mixed dtypes: cast one of them"
        )


def _detached(payload: dict[str, Any]) -> tuple[dict[str, Any], bool]:
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


def _bump(result: list[torch.Tensor], times: int) -> None:
    """Move the outputs' version counters as gloo's kernels do (they write
    some outputs through tensor copies autograd sees). Inference tensors have
    no counter and are skipped by torch."""
    for _ in range(times):
        _increment_version(result)


class SimProcessGroup(dist.ProcessGroup):
    """One rank's handle on one simulated communicator.

    The collectives override c10d's Backend API (lists of tensors and an
    options object), not the Python overloads the stubs describe: hence the
    ``override`` ignores on them.
    """

    def __init__(self, world: WorldHooks, rank: int, group: GroupInfo) -> None:
        # c10d's Python constructor takes (rank, size); the stub lists only the store form.
        super().__init__(group.ranks.index(rank), len(group.ranks))  # type: ignore[call-arg]
        self._world = world
        self._scheduler: Scheduler = world.scheduler
        self._global_rank = rank
        self._group_rank = group.ranks.index(rank)  # rank() is a pybind call; this is hot
        self._info = group
        self._seq = 0
        self._name = group.name
        self._desc = "undefined"

    # c10d stores names in the C++ backend, which a Python group does not have.
    # The name c10d resolves groups by (functional collectives, DTensor) is
    # unique to this run and rank; see c10d_state.
    def _set_group_name(self, name: str) -> None:
        self._name = scoped_name(name)

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc
        if desc and desc not in ("undefined", "default_pg"):
            self._world.label_group(self._info.name, desc)

    @property
    def group_desc(self) -> str:
        return self._desc

    def getBackendName(self) -> str:
        return BACKEND_NAME

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
    ) -> SimWork:
        # The hot path of every collective: kept flat on purpose (each Python
        # call costs about as much as the bookkeeping it would hide).
        op = spec.name
        if _current.world is not self._world or _current.rank != self._global_rank:
            _check_caller(self._scheduler, self._global_rank, op)
        seq = self._seq
        self._seq = seq + 1
        info = self._info
        world = self._world
        detached, inference = _detached(payload)
        call = Call(
            op,
            self._global_rank,
            self._group_rank,
            (("op", op),) + fingerprint,
            stacks.call_site(3),
            detached,
            inference,
        )
        world.before_call(call, info, seq)
        done = Completion(spec, info, seq, world.reduction, red, root)
        pending = self._scheduler.join_collective(info, seq, call, done, world.verify)
        bumps = spec.version_bumps * (len(info.ranks) if spec.bumps_per_member else 1)
        if red == "AVG":
            bumps += spec.avg_bumps
        if bumps:
            _bump(result, bumps)
        return SimWork(self._scheduler, self._global_rank, pending, result)

    def _reduce_op(self, opts: Any, dtype: torch.dtype, op: str) -> str:
        try:
            return check_reduce_op(opts.reduceOp, dtype, op)
        except UnsupportedOperationError as exc:
            raise _refused(exc)  # noqa: B904 (the same error, re-raised once it is noted world-wide)

    def _check_root(self, root: int, op: str) -> None:
        if not 0 <= root < self.size():
            raise ValueError(f"{op}: root group rank {root} is outside the group of size {self.size()}")

    # -- collectives ----------------------------------------------------------

    def allreduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:  # type: ignore[override]
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "allreduce", tensors, opts)
        t = _one(tensors, "all_reduce")
        K.require_dense(t, "all_reduce", "tensor")
        red = self._reduce_op(opts or dist.AllreduceOptions(), t.dtype, "all_reduce")
        fp = (("shape", _shape(t)), ("dtype", t.dtype), ("reduce_op", red))
        return self._collective(OPS["all_reduce"], fp, {T: t}, [t], red)

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "allreduce_coalesced", tensors, opts)
        red = self._reduce_op(opts, tensors[0].dtype, "all_reduce_coalesced") if tensors else "SUM"
        fp = tuple((f"t{i}", (_shape(t), t.dtype)) for i, t in enumerate(tensors))
        spec = OPS["all_reduce_coalesced"]
        work = self._collective(spec, fp + (("reduce_op", red),), {TS: list(tensors)}, list(tensors), red)
        if red == "AVG" and len(tensors) == 1:
            # gloo's flat buffer of a single tensor is that tensor itself, so
            # AVG's in-place division shows on its counter too (measured).
            _bump(list(tensors), 1)
        return work

    def broadcast(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:  # type: ignore[override]
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "broadcast", tensors, opts)
        t = _one(tensors, "broadcast")
        K.require_dense(t, "broadcast", "tensor")
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "broadcast")
        fp = (("shape", _shape(t)), ("dtype", t.dtype), ("root", root))
        return self._collective(OPS["broadcast"], fp, {T: t}, [t], root=root)

    def reduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:  # type: ignore[override]
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "reduce", tensors, opts)
        t = _one(tensors, "reduce")
        K.require_dense(t, "reduce", "tensor")
        red = self._reduce_op(opts, t.dtype, "reduce")
        root = opts.rootRank
        self._check_root(root, "reduce")
        fp = (("shape", _shape(t)), ("dtype", t.dtype), ("reduce_op", red), ("root", root))
        return self._collective(OPS["reduce"], fp, {T: t}, [t], red, root)

    def allgather(  # type: ignore[override]
        self, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "allgather", output_lists, inputs, opts)
        t = _one(inputs, "all_gather")
        outs = list(_one(output_lists, "all_gather"))
        n = self.size()
        if len(outs) != n:
            raise ValueError(f"all_gather: tensor_list has {len(outs)} tensors, expected group size {n}")
        for j, o in enumerate(outs):
            _same_dtype("all_gather", f"tensor_list[{j}]", o, "tensor", t)
        return self._collective(OPS["all_gather"], (("dtype", t.dtype),), {T: t, OUTS: outs}, outs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "all_gather_single", output, input, opts)
        n = self.size()
        _same_dtype("all_gather_into_tensor", "output_tensor", output, "input_tensor", input)
        if output.numel() != n * input.numel():
            raise ValueError(
                f"all_gather_into_tensor: output_tensor has {output.numel()} elements, expected "
                f"group size {n} * input numel {input.numel()} = {n * input.numel()}"
            )
        out_flat = K.flat(output, "all_gather_into_tensor output_tensor")
        fp = (("shape", _shape(input)), ("dtype", input.dtype))
        payload = {IN: input, OUT_FLAT: out_flat}
        return self._collective(OPS["all_gather_into_tensor"], fp, payload, [output])

    def all_gather_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return all_of(self._scheduler, self._global_rank, works, list(outputs))

    def allgather_into_tensor_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        return self.all_gather_single_coalesced(outputs, inputs, opts)

    def reduce_scatter(  # type: ignore[override]
        self, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]], opts: Any = None
    ) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "reduce_scatter", outputs, input_lists, opts)
        out = _one(outputs, "reduce_scatter")
        K.require_dense(out, "reduce_scatter", "output")
        ins = list(_one(input_lists, "reduce_scatter"))
        n = self.size()
        if len(ins) != n:
            raise ValueError(f"reduce_scatter: input_list has {len(ins)} tensors, expected group size {n}")
        for i, x in enumerate(ins):
            _same_dtype("reduce_scatter", "output", out, f"input_list[{i}]", x)
            if x.shape != out.shape:
                raise ValueError(
                    f"reduce_scatter: input_list[{i}] has shape {list(x.shape)}, "
                    f"expected the output shape {list(out.shape)}"
                )
        red = self._reduce_op(opts, out.dtype, "reduce_scatter")
        fp = (("shape", _shape(out)), ("dtype", out.dtype), ("reduce_op", red))
        return self._collective(OPS["reduce_scatter"], fp, {OUT: out, INS: ins}, [out], red)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "reduce_scatter_single", output, input, opts)
        n = self.size()
        _same_dtype("reduce_scatter_tensor", "output", output, "input", input)
        if input.numel() != n * output.numel():
            raise ValueError(
                f"reduce_scatter_tensor: input has {input.numel()} elements, expected "
                f"group size {n} * output numel {output.numel()} = {n * output.numel()}"
            )
        red = self._reduce_op(opts, output.dtype, "reduce_scatter_tensor")
        in_flat = K.flat(input, "reduce_scatter_tensor input")
        out_flat = K.flat(output, "reduce_scatter_tensor output")
        fp = (("shape", _shape(output)), ("dtype", output.dtype), ("reduce_op", red))
        payload = {IN: in_flat, OUT: out_flat}
        return self._collective(OPS["reduce_scatter_tensor"], fp, payload, [output], red)

    def reduce_scatter_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return all_of(self._scheduler, self._global_rank, works, list(outputs))

    def reduce_scatter_tensor_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts)

    def gather(  # type: ignore[override]
        self, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "gather", output_lists, inputs, opts)
        t = _one(inputs, "gather")
        if t.is_complex():
            raise _refused(
                UnsupportedOperationError(
                    f"gather: complex dtype {t.dtype} is not supported (gloo refuses it: 'Invalid scalar "
                    f"type'); gather torch.view_as_real(tensor) instead"
                )
            )
        root = opts.rootRank
        self._check_root(root, "gather")
        outs: list[torch.Tensor] = []
        if self.rank() == root:
            outs = list(_one(output_lists, "gather"))
            if len(outs) != self.size():
                raise ValueError(
                    f"gather: gather_list has {len(outs)} tensors, expected group size {self.size()}"
                )
            for j, o in enumerate(outs):
                _same_dtype("gather", f"gather_list[{j}]", o, "tensor", t)
        fp = (("dtype", t.dtype), ("root", root))
        return self._collective(OPS["gather"], fp, {T: t, OUTS: outs}, outs, root=root)

    def scatter(  # type: ignore[override]
        self, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]], opts: Any = None
    ) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "scatter", outputs, input_lists, opts)
        out = _one(outputs, "scatter")
        K.require_dense(out, "scatter", "tensor")
        root = opts.rootRank
        self._check_root(root, "scatter")
        ins: list[torch.Tensor] = []
        if self.rank() == root:
            ins = list(_one(input_lists, "scatter"))
            if len(ins) != self.size():
                raise ValueError(
                    f"scatter: scatter_list has {len(ins)} tensors, expected group size {self.size()}"
                )
            for j, x in enumerate(ins):
                _same_dtype("scatter", "tensor", out, f"scatter_list[{j}]", x)
                K.require_dense(x, "scatter", f"scatter_list[{j}]")
        fp = (("dtype", out.dtype), ("root", root))
        return self._collective(OPS["scatter"], fp, {OUT: out, INS: ins}, [out], root=root)

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
            _same_dtype("all_to_all", what, t, "input_tensor_list[0]", inputs[0])
        dtypes = {t.dtype for t in list(outputs) + list(inputs)}
        fp = (("dtypes", tuple(sorted(map(str, dtypes)))),)
        payload = {OUTS: list(outputs), INS: list(inputs)}
        return self._collective(OPS["all_to_all"], fp, payload, list(outputs))

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
        fp = (("row_shape", _shape(input)[1:]), ("dtype", input.dtype))
        payload = {OUT: output, IN: input, OUT_SPLITS: out_splits, IN_SPLITS: in_splits}
        return self._collective(OPS["all_to_all_single"], fp, payload, [output])

    def barrier(self, opts: Any = None) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "barrier", opts)
        return self._collective(OPS["barrier"], (), {}, [])

    # -- point to point ---------------------------------------------------------

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int = 0) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "send", tensors, dst, tag)
        t = _one(tensors, "send")
        K.require_dense_p2p(t, "send")
        _check_caller(self._scheduler, self._global_rank, "send")
        peer = self._peer(dst, "send", "dst")
        op = P2POp("send", self.info, self._global_rank, peer, tag, t.detach().clone(), stacks.call_site(2))
        return self._post(op, t)

    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int = 0) -> SimWork:
        if modes_active():  # what gloo's path shows dispatch modes (CommDebugMode)
            show(self, "recv", tensors, src, tag)
        t = _one(tensors, "recv")
        K.require_dense_p2p(t, "recv")
        _check_caller(self._scheduler, self._global_rank, "recv")
        peer = self._peer(src, "recv", "src")
        op = P2POp("recv", self.info, peer, self._global_rank, tag, t.data, stacks.call_site(2))
        return self._post(op, t)

    def _post(self, op: P2POp, t: torch.Tensor) -> SimWork:
        self._world.before_p2p(op)
        self._scheduler.post_p2p(op, deliver)
        return SimWork(self._scheduler, self._global_rank, op, [t])

    def recv_anysource(self, tensors: Sequence[torch.Tensor], tag: int = 0) -> SimWork:
        raise _refused(
            UnsupportedOperationError(
                "recv without src (any source) is not supported by simdist: its match would "
                "depend on thread timing; pass src="
            )
        )

    def _peer(self, group_rank: int, op: str, arg: str) -> int:
        if not 0 <= group_rank < self.size():
            raise ValueError(
                f"{op}: {arg} group rank {group_rank} is outside the group of size {self.size()}"
            )
        if group_rank == self.rank():
            raise ValueError(f"{op}: {arg} is this rank itself ({self._global_rank})")
        return self.info.ranks[group_rank]

    # -- things a simulated communicator does not have ------------------------------

    def allgather_coalesced(self, *args: Any, **kwargs: Any) -> SimWork:
        raise _refused(
            UnsupportedOperationError(
                "all_gather_coalesced (deprecated in torch) is not supported by simdist"
            )
        )

    def monitored_barrier(self, *args: Any, **kwargs: Any) -> None:
        raise _refused(
            UnsupportedOperationError("monitored_barrier is not supported by simdist; use barrier()")
        )

    def _start_coalescing(self, device: Any) -> None:
        raise _refused(UnsupportedOperationError("coalescing managers are not supported by simdist"))
