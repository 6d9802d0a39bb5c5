"""The simdist ``ProcessGroup``: torch.distributed calls -> rendezvous calls.

Each rank thread owns its own ``SimProcessGroup`` objects (c10d creates one per
rank per group), so a group object always knows its rank, even when a
collective is issued from an autograd thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from . import collectives as C
from . import stacks
from ._core import identity
from ._core.records import Call, GroupInfo, P2POp, Waitable
from ._core.scheduler import Scheduler
from ._isolation.c10d_state import scoped_name
from .errors import CollectiveMismatchError, SimulationError, UnsupportedOperationError
from .reduction import check_reduce_op

BACKEND_NAME = "simdist"


class SimWork(dist.Work):
    """A handle on a pending call; ``wait()`` blocks in the scheduler, bounded
    by deadlock detection and the run's watchdog."""

    def __init__(
        self,
        scheduler: Scheduler,
        rank: int,
        waitable: Waitable | None,
        result: list[torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self._scheduler = scheduler
        self._rank = rank
        self._waitable = waitable
        self._result = result or []

    def wait(self, timeout: Any = None) -> bool:
        if self._waitable is not None:
            _check_caller(self._scheduler, self._rank, "Work.wait")
            self._scheduler.wait(self._rank, self._waitable)
        return True

    def is_completed(self) -> bool:
        return self._waitable is None or self._waitable.done

    def is_success(self) -> bool:
        return self.is_completed() and (self._waitable is None or self._waitable.error is None)

    def exception(self) -> Any:
        return None if self._waitable is None else self._waitable.error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        self.wait()
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(self._result)
        return fut


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _one(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise _refused(
            UnsupportedOperationError(f"{op}: simdist takes one tensor per rank per call, got {len(tensors)}")
        )
    return tensors[0]


class SimProcessGroup(dist.ProcessGroup):
    """One rank's handle on one simulated communicator."""

    def __init__(self, world: WorldHooks, rank: int, group: GroupInfo) -> None:
        super().__init__(group.ranks.index(rank), len(group.ranks))
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
    def group_desc(self) -> str:  # type: ignore[override]
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
        op: str,
        fingerprint: tuple[tuple[str, Any], ...],
        payload: dict[str, Any],
        complete: Callable[[list[Call]], None],
        result: list[torch.Tensor] | None = None,
    ) -> SimWork:
        # The hot path of every collective: kept flat on purpose (each Python
        # call costs about as much as the bookkeeping it would hide).
        if _current.world is not self._world or _current.rank != self._global_rank:
            _check_caller(self._scheduler, self._global_rank, op)
        seq = self._seq
        self._seq = seq + 1
        info = self._info
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
        world = self._world
        world.before_call(call, info, seq)
        pending = self._scheduler.join_collective(info, seq, call, _outside_autograd(complete), world.verify)
        return SimWork(self._scheduler, self._global_rank, pending, result)

    def _reduce_op(self, opts: Any, dtype: torch.dtype, op: str) -> str:
        try:
            return check_reduce_op(opts.reduceOp, dtype, op)
        except UnsupportedOperationError as exc:
            raise _refused(exc)

    # -- collectives ----------------------------------------------------------

    def allreduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        t = _one(tensors, "all_reduce")
        red = self._reduce_op(opts or dist.AllreduceOptions(), t.dtype, "all_reduce")
        model, key = self._world.reduction, f"{self._info.name}/{self._seq}"

        def complete(calls: list[Call]) -> None:
            ts = [c.payload["t"] for c in calls]
            C.reduce_into(model, ts[0], ts, red, key)
            for x in ts[1:]:
                x.copy_(ts[0])

        return self._collective(
            "all_reduce",
            (("shape", _shape(t)), ("dtype", t.dtype), ("reduce_op", red)),
            {"t": t},
            complete,
            [t],
        )

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        red = self._reduce_op(opts, tensors[0].dtype, "all_reduce_coalesced") if tensors else "SUM"
        model, key = self._world.reduction, f"{self._info.name}/{self._seq}"

        def complete(calls: list[Call]) -> None:
            for i in range(len(tensors)):
                ts = [c.payload["ts"][i] for c in calls]
                C.reduce_into(model, ts[0], ts, red, f"{key}/{i}")
                for x in ts[1:]:
                    x.copy_(ts[0])

        fp = tuple((f"t{i}", (_shape(t), t.dtype)) for i, t in enumerate(tensors))
        return self._collective(
            "all_reduce_coalesced", fp + (("reduce_op", red),), {"ts": list(tensors)}, complete, list(tensors)
        )

    def broadcast(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        t = _one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "broadcast")

        def complete(calls: list[Call]) -> None:
            src = calls[root].payload["t"]
            for i, c in enumerate(calls):
                if i != root:
                    c.payload["t"].copy_(src)

        return self._collective(
            "broadcast", (("shape", _shape(t)), ("dtype", t.dtype), ("root", root)), {"t": t}, complete, [t]
        )

    def reduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        t = _one(tensors, "reduce")
        red = self._reduce_op(opts, t.dtype, "reduce")
        root = opts.rootRank
        self._check_root(root, "reduce")
        model, key = self._world.reduction, f"{self._info.name}/{self._seq}"

        def complete(calls: list[Call]) -> None:
            ts = [c.payload["t"] for c in calls]
            C.reduce_into(model, ts[root], ts, red, key)

        return self._collective(
            "reduce",
            (("shape", _shape(t)), ("dtype", t.dtype), ("reduce_op", red), ("root", root)),
            {"t": t},
            complete,
            [t],
        )

    def allgather(
        self, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        t = _one(inputs, "all_gather")
        outs = list(_one(output_lists, "all_gather"))  # type: ignore[arg-type]
        n = self.size()
        if len(outs) != n:
            raise ValueError(f"all_gather: tensor_list has {len(outs)} tensors, expected group size {n}")
        for j, o in enumerate(outs):
            _same_dtype("all_gather", f"tensor_list[{j}]", o, "tensor", t)
        ranks = self.info.ranks

        def complete(calls: list[Call]) -> None:
            for c in calls:
                for j, o in enumerate(c.payload["outs"]):
                    src = calls[j].payload["t"]
                    if o.shape != src.shape:
                        raise CollectiveMismatchError(
                            f"all_gather: rank {c.rank}'s tensor_list[{j}] has shape "
                            f"{list(o.shape)} but rank {ranks[j]} contributed {list(src.shape)}"
                        )
                    C.copy_into(o, src)

        return self._collective("all_gather", (("dtype", t.dtype),), {"t": t, "outs": outs}, complete, outs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        n = self.size()
        _same_dtype("all_gather_into_tensor", "output_tensor", output, "input_tensor", input)
        if output.numel() != n * input.numel():
            raise ValueError(
                f"all_gather_into_tensor: output_tensor has {output.numel()} elements, expected "
                f"group size {n} * input numel {input.numel()} = {n * input.numel()}"
            )
        out_flat = C.flat(output, "all_gather_into_tensor output_tensor")

        def complete(calls: list[Call]) -> None:
            # Slot by slot: a rank's input may be its own slot of the output
            # (FSDP2 gathers in place), which torch.cat(out=) refuses.
            srcs = [C.flat(c.payload["in"], "all_gather_into_tensor input_tensor") for c in calls]
            k = srcs[0].numel()
            for c in calls:
                out = c.payload["out_flat"]
                for j, src in enumerate(srcs):
                    C.copy_into(out.narrow(0, j * k, k), src)

        return self._collective(
            "all_gather_into_tensor",
            (("shape", _shape(input)), ("dtype", input.dtype)),
            {"in": input, "out_flat": out_flat},
            complete,
            [output],
        )

    def all_gather_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _all_of(self._scheduler, self._global_rank, works, list(outputs))

    def allgather_into_tensor_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        return self.all_gather_single_coalesced(outputs, inputs, opts)

    def reduce_scatter(
        self, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]], opts: Any = None
    ) -> SimWork:
        out = _one(outputs, "reduce_scatter")
        ins = list(_one(input_lists, "reduce_scatter"))  # type: ignore[arg-type]
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
        model, key = self._world.reduction, f"{self._info.name}/{self._seq}"

        def complete(calls: list[Call]) -> None:
            for r, c in enumerate(calls):
                C.reduce_into(
                    model, c.payload["out"], [k.payload["ins"][r] for k in calls], red, f"{key}/{r}"
                )

        return self._collective(
            "reduce_scatter",
            (("shape", _shape(out)), ("dtype", out.dtype), ("reduce_op", red)),
            {"out": out, "ins": ins},
            complete,
            [out],
        )

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        n = self.size()
        _same_dtype("reduce_scatter_tensor", "output", output, "input", input)
        if input.numel() != n * output.numel():
            raise ValueError(
                f"reduce_scatter_tensor: input has {input.numel()} elements, expected "
                f"group size {n} * output numel {output.numel()} = {n * output.numel()}"
            )
        red = self._reduce_op(opts, output.dtype, "reduce_scatter_tensor")
        model, key = self._world.reduction, f"{self._info.name}/{self._seq}"
        in_flat = C.flat(input, "reduce_scatter_tensor input")
        out_flat = C.flat(output, "reduce_scatter_tensor output")
        m = output.numel()

        def complete(calls: list[Call]) -> None:
            for r, c in enumerate(calls):
                parts = [k.payload["in"].narrow(0, r * m, m) for k in calls]
                C.reduce_into(model, c.payload["out"], parts, red, f"{key}/{r}")

        return self._collective(
            "reduce_scatter_tensor",
            (("shape", _shape(output)), ("dtype", output.dtype), ("reduce_op", red)),
            {"in": in_flat, "out": out_flat},
            complete,
            [output],
        )

    def reduce_scatter_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _all_of(self._scheduler, self._global_rank, works, list(outputs))

    def reduce_scatter_tensor_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts)

    def gather(
        self, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        t = _one(inputs, "gather")
        root = opts.rootRank
        self._check_root(root, "gather")
        outs: list[torch.Tensor] = []
        if self.rank() == root:
            outs = list(_one(output_lists, "gather"))  # type: ignore[arg-type]
            if len(outs) != self.size():
                raise ValueError(
                    f"gather: gather_list has {len(outs)} tensors, expected group size {self.size()}"
                )
            for j, o in enumerate(outs):
                _same_dtype("gather", f"gather_list[{j}]", o, "tensor", t)
        ranks = self.info.ranks

        def complete(calls: list[Call]) -> None:
            for j, o in enumerate(calls[root].payload["outs"]):
                src = calls[j].payload["t"]
                if o.shape != src.shape:
                    raise CollectiveMismatchError(
                        f"gather: root's gather_list[{j}] has shape {list(o.shape)} but rank "
                        f"{ranks[j]} contributed {list(src.shape)}"
                    )
                C.copy_into(o, src)

        return self._collective(
            "gather", (("dtype", t.dtype), ("root", root)), {"t": t, "outs": outs}, complete, outs
        )

    def scatter(
        self, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]], opts: Any = None
    ) -> SimWork:
        out = _one(outputs, "scatter")
        root = opts.rootRank
        self._check_root(root, "scatter")
        ins: list[torch.Tensor] = []
        if self.rank() == root:
            ins = list(_one(input_lists, "scatter"))  # type: ignore[arg-type]
            if len(ins) != self.size():
                raise ValueError(
                    f"scatter: scatter_list has {len(ins)} tensors, expected group size {self.size()}"
                )
            for j, x in enumerate(ins):
                _same_dtype("scatter", "tensor", out, f"scatter_list[{j}]", x)
        ranks = self.info.ranks

        def complete(calls: list[Call]) -> None:
            src = calls[root].payload["ins"]
            for j, c in enumerate(calls):
                o = c.payload["out"]
                if o.shape != src[j].shape:
                    raise CollectiveMismatchError(
                        f"scatter: rank {ranks[j]}'s output has shape {list(o.shape)} but the "
                        f"root's scatter_list[{j}] has shape {list(src[j].shape)}"
                    )
                C.copy_into(o, src[j])

        return self._collective(
            "scatter", (("dtype", out.dtype), ("root", root)), {"out": out, "ins": ins}, complete, [out]
        )

    def alltoall(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        n = self.size()
        if len(outputs) != n or len(inputs) != n:
            raise ValueError(
                f"all_to_all: expected {n} output and input tensors (the group size), "
                f"got {len(outputs)} and {len(inputs)}"
            )
        for i, t in enumerate(list(outputs) + list(inputs)):
            what = f"output_tensor_list[{i}]" if i < n else f"input_tensor_list[{i - n}]"
            _same_dtype("all_to_all", what, t, "input_tensor_list[0]", inputs[0])
        ranks = self.info.ranks

        def complete(calls: list[Call]) -> None:
            for j, c in enumerate(calls):
                for i in range(n):
                    o, src = c.payload["outs"][i], calls[i].payload["ins"][j]
                    if o.shape != src.shape:
                        raise CollectiveMismatchError(
                            f"all_to_all: rank {ranks[j]}'s output_tensor_list[{i}] has shape "
                            f"{list(o.shape)} but rank {ranks[i]} sends {list(src.shape)}"
                        )
                    o.copy_(src)

        dtypes = {t.dtype for t in list(outputs) + list(inputs)}
        return self._collective(
            "all_to_all",
            (("dtypes", tuple(sorted(map(str, dtypes)))),),
            {"outs": list(outputs), "ins": list(inputs)},
            complete,
            list(outputs),
        )

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> SimWork:
        n = self.size()
        out_splits = C.check_splits(
            output_split_sizes,
            output.shape[0] if output.dim() else 0,
            n,
            "all_to_all_single output_split_sizes",
        )
        in_splits = C.check_splits(
            input_split_sizes, input.shape[0] if input.dim() else 0, n, "all_to_all_single input_split_sizes"
        )
        if output.shape[1:] != input.shape[1:]:
            raise ValueError(
                f"all_to_all_single: output and input must agree beyond dim 0, got "
                f"{list(output.shape)} and {list(input.shape)}"
            )
        ranks = self.info.ranks

        def complete(calls: list[Call]) -> None:
            C.all_to_all_single(
                [c.payload["out"] for c in calls],
                [c.payload["in"] for c in calls],
                [c.payload["out_splits"] for c in calls],
                [c.payload["in_splits"] for c in calls],
                ranks,
            )

        return self._collective(
            "all_to_all_single",
            (("row_shape", _shape(input)[1:]), ("dtype", input.dtype)),
            {"out": output, "in": input, "out_splits": out_splits, "in_splits": in_splits},
            complete,
            [output],
        )

    def barrier(self, opts: Any = None) -> SimWork:
        return self._collective("barrier", (), {}, lambda calls: None, [])

    def _check_root(self, root: int, op: str) -> None:
        if not 0 <= root < self.size():
            raise ValueError(f"{op}: root group rank {root} is outside the group of size {self.size()}")

    # -- point to point ---------------------------------------------------------

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int = 0) -> SimWork:
        t = _one(tensors, "send")
        _check_caller(self._scheduler, self._global_rank, "send")
        info = self.info
        peer = self._peer(dst, "send", "dst")
        op = P2POp("send", info, self._global_rank, peer, tag, t.detach().clone(), stacks.call_site(2))
        self._world.before_p2p(op)
        self._scheduler.post_p2p(op, _deliver)
        return SimWork(self._scheduler, self._global_rank, op, [t])

    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int = 0) -> SimWork:
        t = _one(tensors, "recv")
        _check_caller(self._scheduler, self._global_rank, "recv")
        info = self.info
        peer = self._peer(src, "recv", "src")
        op = P2POp("recv", info, peer, self._global_rank, tag, t.data, stacks.call_site(2))
        self._world.before_p2p(op)
        self._scheduler.post_p2p(op, _deliver)
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
    autograd: a Parameter can be broadcast into, a non-leaf keeps its grad_fn,
    and the version counter does not move (a tensor saved for backward and then
    all-reduced still backpropagates, as on gloo). ``.data`` aliases share that
    memory but neither the autograd history nor the version counter
    (``detach()`` would share the counter).
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


def _outside_autograd(fn: Callable[[list[Call]], None]) -> Callable[[list[Call]], None]:
    """Inference tensors may only be written in inference mode, and the
    completing thread may belong to another rank than the tensor's owner."""

    def run(calls: list[Call]) -> None:
        for c in calls:
            if c.inference:
                with torch.inference_mode():
                    fn(calls)
                return
        fn(calls)

    return run


def _deliver(send: P2POp, recv: P2POp) -> None:
    """Copy a matched send into its recv (runs under the world lock)."""
    src, dst = send.tensor, recv.tensor
    if src.dtype != dst.dtype or src.numel() != dst.numel():
        raise CollectiveMismatchError(
            f"send/recv mismatch between rank {send.src} and rank {send.dst} (tag {send.tag}): "
            f"send {list(src.shape)} {src.dtype} at {send.site}, "
            f"recv {list(dst.shape)} {dst.dtype} at {recv.site}"
        )
    with torch.inference_mode():
        dst.copy_(src.view(dst.shape))


class _AllOf(Waitable):
    def __init__(self, works: list[SimWork]) -> None:
        self.works = works

    @property
    def done(self) -> bool:  # type: ignore[override]
        return all(w.is_completed() for w in self.works)

    @property
    def error(self) -> BaseException | None:  # type: ignore[override]
        for w in self.works:
            if w.exception() is not None:
                return w.exception()
        return None


def _all_of(scheduler: Scheduler, rank: int, works: list[SimWork], result: list[torch.Tensor]) -> SimWork:
    class _Seq(SimWork):
        def wait(self, timeout: Any = None) -> bool:
            for w in works:
                w.wait()
            return True

    return _Seq(scheduler, rank, _AllOf(works), result)


class WorldHooks:
    """What a group needs from its world (implemented by ``world.World``)."""

    scheduler: Scheduler
    reduction: Any

    def register_group(self, name: str, ranks: tuple[int, ...], rank: int) -> GroupInfo: ...
    def label_group(self, name: str, label: str) -> None: ...
    def before_call(self, call: Call, group: GroupInfo, seq: int) -> None: ...
    def before_p2p(self, op: P2POp) -> None: ...
    def verify(self, group: GroupInfo, seq: int, calls: list[Call]) -> None: ...


# -- registration with c10d ---------------------------------------------------------

# The thread's rank identity (``_core.identity``): ``_current.world``/``.rank``.
_current = identity.me


def _refused(error: BaseException) -> BaseException:
    """Note a call simdist cannot model at world level, so that a body that
    catches the error (and falls back) still fails the run: its results would
    not be what a real backend gives."""
    world = _current.world
    if world is not None:
        world.scheduler.record(_current.rank, error)
    return error


def _check_caller(scheduler: Scheduler, rank: int, what: str) -> None:
    """A rank's group (or Work) used by a thread that is not that rank's: on
    a cluster no such thread exists, and taking its call as the rank's would
    join (or wait in) the rank's collectives behind its back. Refused; once
    the run is over the scheduler's own "already ended" error says more."""
    world = _current.world
    if world is not None and world.scheduler is scheduler and _current.rank == rank:
        return
    if scheduler.closed is not None:
        return
    if world is None:
        whose = "a thread outside the run"
    elif world.scheduler is scheduler:
        whose = f"a thread of rank {_current.rank}"
    else:
        whose = "a thread of another run"
    raise SimulationError(
        f"{what}: this process group belongs to rank {rank}, but {whose} "
        f"({threading.current_thread().name!r}) called it; only rank {rank}'s own threads "
        f"(its body and the helper threads it starts) can use its groups and Works"
    )


def current_world() -> tuple[WorldHooks, int]:
    world = _current.world
    if world is None:
        raise SimulationError("the 'simdist' backend can only be initialised inside simdist.run(...)")
    return world, _current.rank


def bind_current(world: WorldHooks | None, rank: int = -1, c10d: Any = None, helper: Any = None) -> None:
    """Bind this thread to ``rank`` of ``world`` (None: unbind it); see ``_core.identity``."""
    if world is None:
        identity.unbind()
    else:
        identity.bind(world, rank, c10d, helper)


def _create(backend_opts: Any, pg_options: Any) -> SimProcessGroup:
    world, rank = current_world()
    ranks = list(backend_opts.global_ranks_in_group) or list(range(world.scheduler.world_size))
    info = world.register_group(str(backend_opts.group_id), tuple(ranks), rank)
    return SimProcessGroup(world, rank, info)


def register_backend() -> None:
    if BACKEND_NAME.upper() not in dist.Backend._plugins:  # type: ignore[attr-defined]
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
