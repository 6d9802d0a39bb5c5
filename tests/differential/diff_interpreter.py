"""Runs a differential program on one rank, with public torch.distributed only.

The same function runs in a simdist rank thread and in a gloo worker process.
For every step it reports a record (a plain dict): whether the call was made,
refused ("error") or never returned ("hang", from the caller's side), the
values of every tensor the call wrote and of the buffers around them, how far
each written tensor's autograd version counter moved, whether ``work.result()``
aliases the written tensors, and, for ``saved`` steps and differentiable
collectives, the gradient backward computed (or the error it raised).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import diff_data as D
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
from diff_program import Program

Record = dict[str, Any]
Emit = Callable[[int, Record], None]
# Errors that mean "the world is stuck or gone" rather than "this call was refused".
HANG_ERRORS = ("DeadlockError", "SimulationTimeout", "PeerFailedError")


def make_groups(program: Program) -> dict[tuple[int, ...], Any]:
    """Every subgroup the program names, created in first-use order (every rank
    calls ``new_group`` for each, as torch requires)."""
    groups: dict[tuple[int, ...], Any] = {}
    for s in program.steps:
        if s["group"] is not None and tuple(s["group"]) not in groups:
            groups[tuple(s["group"])] = dist.new_group(list(s["group"]))
    return groups


def run_rank(
    rank: int, program: Program, groups: dict[tuple[int, ...], Any], emit: Emit, device: Any = "cpu"
) -> None:
    """Run every step this rank takes part in, with its tensors on ``device``;
    ``emit(index, record)`` after each (tensors in records are on the CPU)."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    pending: list[tuple[int, _Call]] = []
    for index, s in enumerate(program.steps):
        members = program.members(s)
        if rank not in members or (s["skip"] and rank == members[-1]):
            emit(index, {"status": "skip"})
            continue
        group = None if s["group"] is None else groups[tuple(s["group"])]
        step_env = _Env(rank, program, s, index, members, group, torch.device(device))
        try:
            call = _HANDLERS[s["op"]](step_env)
        except Exception as exc:
            record = _error_record(exc)
            emit(index, record)
            if record["status"] == "hang":
                return
            continue
        if s["async"] and call.work is not None:
            pending.append((index, call))
            # Replaced once waited for; left in place when the rank never got
            # there (it died or hung later), so a crash is placed at its own step.
            emit(index, {"status": "pending"})
            continue
        record = call.finish()
        emit(index, record)
        if record["status"] == "hang":
            return
    for index, call in pending:
        record = call.finish()
        emit(index, record)
        if record["status"] == "hang":
            return


def _error_record(exc: BaseException) -> Record:
    kind = "hang" if type(exc).__name__ in HANG_ERRORS else "error"
    return {"status": kind, "error": f"{type(exc).__name__}: {exc}"[:2000], "type": type(exc).__name__}


@dataclass
class _Env:
    rank: int
    program: Program
    s: dict[str, Any]
    index: int
    members: list[int]
    group: Any
    device: torch.device

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def me(self) -> int:
        return self.members.index(self.rank)

    @property
    def dtype(self) -> torch.dtype:
        return D.DTYPES[self.s["dtype"]]

    @property
    def red(self) -> Any:
        return getattr(dist.ReduceOp, self.s["red"])

    def data(self, tag: str, shape: list[int] | None = None, rank: int | None = None) -> torch.Tensor:
        gen = D.generator(self.program.seed, self.rank if rank is None else rank, self.index, tag)
        data = D.values(gen, list(self.s["shape"] if shape is None else shape), self.dtype, self.s["values"])
        return data.to(self.device)

    def zeros(self, shape: list[int]) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def root_kw(self, name: str) -> dict[str, int]:
        """``src=``/``dst=`` as a global rank, or ``group_src=``/``group_dst=``."""
        root = self.s["root"]
        if self.s["group_arg"]:
            return {f"group_{name}": root}
        return {name: self.members[root]}


@dataclass
class _Call:
    """A call made: what it wrote, to be read once its work is done."""

    env: _Env
    work: Any = None
    written: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    leaves: list[torch.Tensor] = field(default_factory=list)
    side: Any = None  # a loss over the written tensors, computed before the call
    extra: dict[str, Any] = field(default_factory=dict)
    read: Callable[[], dict[str, Any]] | None = None

    def out(self, name: str, data: torch.Tensor, view: str | None = None) -> torch.Tensor:
        """A tensor the call writes, initialised with ``data``, laid out as the step says."""
        view = self.env.s["view"] if view is None else view
        saved = self.env.s["saved"] and data.dtype in (torch.float32, torch.float64)
        buffer, tensor = D.placed(data, view)
        if saved:
            leaf = buffer.detach().clone().requires_grad_(True)
            self.leaves.append(leaf)
            buffer = leaf.clone()
            tensor = _same_view(buffer, tensor)
        self.written[name] = tensor
        self.buffers[name] = buffer
        return tensor

    def start(self, work: Any) -> _Call:
        self.work = work
        return self

    def save_for_backward(self) -> None:
        """Called just before the call: version counters are read from here on."""
        self.versions = {k: t._version for k, t in self.written.items()}
        if self.leaves:
            self.side = sum((t * t).sum() for t in self.written.values() if t.requires_grad)

    def finish(self) -> Record:
        try:
            if self.work is not None:
                self.work.wait()
                self.extra["result_aliases"] = _result_aliases(self.work, self.written)
        except Exception as exc:
            return _error_record(exc)
        record: Record = {"status": "ok", **self.extra}
        record["versions"] = {k: t._version - self.versions[k] for k, t in self.written.items()}
        record["values"] = {k: t.detach().cpu().clone() for k, t in self.written.items()}
        record["buffers"] = {k: b.detach().cpu().clone() for k, b in self.buffers.items()}
        if self.read is not None:
            try:
                record.update(self.read())
            except Exception as exc:
                return _error_record(exc)
        if self.side is not None:
            record["backward"] = _backward(self.side, self.leaves)
        return record


def _same_view(buffer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return buffer.as_strided(like.shape, like.stride(), like.storage_offset())


def _result_aliases(work: Any, written: dict[str, torch.Tensor]) -> list[bool] | None:
    try:
        result = work.result()
    except Exception:
        return None
    ptrs = {t.data_ptr() for t in written.values() if t.numel()}
    return [t.numel() > 0 and t.data_ptr() in ptrs for t in result]


def _backward(loss: Any, leaves: list[torch.Tensor]) -> Any:
    try:
        loss.backward()
    except Exception as exc:
        text = str(exc)
        return "inplace-modified" if "modified by an inplace operation" in text else f"{type(exc).__name__}"
    return [leaf.grad.cpu().clone() if leaf.grad is not None else None for leaf in leaves]


# ------------------------------------------------------------------ handlers


def _all_reduce(e: _Env) -> _Call:
    c = _Call(e)
    t = c.out("t", e.data("in"))
    c.save_for_backward()
    return c.start(dist.all_reduce(t, op=e.red, group=e.group, async_op=e.s["async"]))


def _broadcast(e: _Env) -> _Call:
    c = _Call(e)
    t = c.out("t", e.data("in"))
    c.save_for_backward()
    return c.start(dist.broadcast(t, group=e.group, async_op=e.s["async"], **e.root_kw("src")))


def _reduce(e: _Env) -> _Call:
    c = _Call(e)
    t = c.out("t", e.data("in"))
    c.save_for_backward()
    work = dist.reduce(t, op=e.red, group=e.group, async_op=e.s["async"], **e.root_kw("dst"))
    if e.me != e.s["root"]:
        # Non-root buffers are scratch space on real backends: not compared.
        c.written, c.buffers, c.versions = {}, {}, {}
    return c.start(work)


def _all_gather(e: _Env) -> _Call:
    c = _Call(e)
    outs = [c.out(f"o{j}", torch.zeros_like(e.data("in"))) for j in range(e.n)]
    t = outs[e.me] if e.s["inplace"] else e.data("in")
    if e.s["inplace"]:
        t.copy_(e.data("in"))
    c.save_for_backward()
    return c.start(dist.all_gather(outs, t, group=e.group, async_op=e.s["async"]))


def _cat_shape(e: _Env) -> list[int]:
    shape = list(e.s["shape"])
    if e.s["stack"] or not shape:
        return [e.n, *shape]
    return [e.n * shape[0], *shape[1:]]


def _chunk(big: torch.Tensor, e: _Env, j: int) -> torch.Tensor:
    if e.s["stack"] or not e.s["shape"]:
        return big[j]
    k = e.s["shape"][0]
    return big.narrow(0, j * k, k)


def _all_gather_into_tensor(e: _Env) -> _Call:
    c = _Call(e)
    out = c.out("out", e.zeros(_cat_shape(e)))
    if e.s["inplace"]:
        t = _chunk(out, e, e.me)
        t.copy_(e.data("in"))
    else:
        t = e.data("in")
    c.save_for_backward()
    return c.start(dist.all_gather_into_tensor(out, t, group=e.group, async_op=e.s["async"]))


def _reduce_scatter(e: _Env) -> _Call:
    c = _Call(e)
    ins = [e.data(f"in{j}") for j in range(e.n)]
    if e.s["inplace"]:
        out = c.out("out", ins[e.me])
        ins[e.me] = out
    else:
        out = c.out("out", torch.zeros_like(ins[0]))
    c.save_for_backward()
    return c.start(dist.reduce_scatter(out, ins, op=e.red, group=e.group, async_op=e.s["async"]))


def _reduce_scatter_tensor(e: _Env) -> _Call:
    c = _Call(e)
    if e.s["inplace"]:
        big = c.out("in", e.data("in", _cat_shape(e)), view="contig")
        out = _chunk(big, e, e.me)
    else:
        big = e.data("in", _cat_shape(e))
        out = c.out("out", e.zeros(list(e.s["shape"])))
    c.save_for_backward()
    return c.start(dist.reduce_scatter_tensor(out, big, op=e.red, group=e.group, async_op=e.s["async"]))


def _gather(e: _Env) -> _Call:
    c = _Call(e)
    root = e.me == e.s["root"]
    outs = [c.out(f"o{j}", torch.zeros_like(e.data("in"))) for j in range(e.n)] if root else None
    c.save_for_backward()
    work = dist.gather(e.data("in"), outs, group=e.group, async_op=e.s["async"], **e.root_kw("dst"))
    return c.start(work)


def _scatter(e: _Env) -> _Call:
    c = _Call(e)
    out = c.out("out", torch.zeros_like(e.data("in")))
    ins = [e.data(f"in{j}") for j in range(e.n)] if e.me == e.s["root"] else None
    c.save_for_backward()
    return c.start(dist.scatter(out, ins, group=e.group, async_op=e.s["async"], **e.root_kw("src")))


def _rows(e: _Env, src: int, dst: int) -> list[int]:
    """The shape of what group rank ``src`` sends to ``dst`` (all_to_all)."""
    shape = list(e.s["shape"])
    if not e.s["uneven"] or not shape:
        return shape
    return [D.uneven_sizes(e.program.seed, e.index, e.n)[src][dst], *shape[1:]]


def _all_to_all(e: _Env) -> _Call:
    c = _Call(e)
    outs = [c.out(f"o{i}", e.zeros(_rows(e, i, e.me))) for i in range(e.n)]
    ins = [e.data(f"in{j}", _rows(e, e.me, j)) for j in range(e.n)]
    c.save_for_backward()
    return c.start(dist.all_to_all(outs, ins, group=e.group, async_op=e.s["async"]))


def _splits(e: _Env) -> tuple[list[int], list[int], list[int], list[int]] | None:
    """(input shape, output shape, input splits, output splits); None when even."""
    shape = list(e.s["shape"])
    if not e.s["uneven"] or not shape:
        return None
    sizes = D.uneven_sizes(e.program.seed, e.index, e.n)
    ins = [sizes[e.me][j] for j in range(e.n)]
    outs = [sizes[i][e.me] for i in range(e.n)]
    return [sum(ins), *shape[1:]], [sum(outs), *shape[1:]], ins, outs


def _all_to_all_single(e: _Env) -> _Call:
    c = _Call(e)
    uneven = _splits(e)
    shape = _cat_shape(e)
    in_shape, out_shape, in_splits, out_splits = uneven or (shape, shape, None, None)
    out = c.out("out", e.zeros(out_shape))
    inp = e.data("in", in_shape)
    c.save_for_backward()
    work = dist.all_to_all_single(out, inp, out_splits, in_splits, group=e.group, async_op=e.s["async"])
    return c.start(work)


def _barrier(e: _Env) -> _Call:
    return _Call(e).start(dist.barrier(group=e.group, async_op=e.s["async"]))


def _send_recv(e: _Env) -> _Call:
    """Group rank ``root`` sends to group rank ``peer``; everyone else in the group waits for nothing."""
    c = _Call(e)
    src, dst = e.s["root"], e.s["peer"]
    kind = "dst" if e.me == src else "src"
    peer = {"group_" + kind: dst if kind == "dst" else src} if e.s["group_arg"] else None
    if peer is None:
        peer = {kind: e.members[dst] if kind == "dst" else e.members[src]}
    if e.me == src:
        send = dist.isend if e.s["async"] else dist.send
        return c.start(send(e.data("in"), group=e.group, **peer))
    if e.me == dst:
        t = c.out("t", torch.zeros_like(e.data("in")))
        c.save_for_backward()
        recv = dist.irecv if e.s["async"] else dist.recv
        result = recv(t, group=e.group, **peer)
        if not e.s["async"]:
            c.extra["returned"] = result
            return c
        return c.start(result)
    return c


def _batch_ring(e: _Env) -> _Call:
    """Every member sends to the next group rank and receives from the previous one."""
    c = _Call(e)
    nxt, prev = (e.me + 1) % e.n, (e.me - 1) % e.n
    t = c.out("t", torch.zeros_like(e.data("in")))
    c.save_for_backward()
    ops = [
        dist.P2POp(dist.isend, e.data("in"), group=e.group, group_peer=nxt),
        dist.P2POp(dist.irecv, t, group=e.group, group_peer=prev),
    ]
    if e.s["inplace"]:  # the other order: receive first
        ops.reverse()
    works = dist.batch_isend_irecv(ops)
    c.work = _AllWorks(works)
    return c


class _AllWorks:
    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self) -> None:
        for w in self.works:
            w.wait()

    def result(self) -> list[torch.Tensor]:
        raise RuntimeError("no single result")


def _objects(e: _Env) -> _Call:
    c = _Call(e)
    seed, op, root = e.program.seed, e.s["op"], e.s["root"]
    mine = D.obj_for(seed, e.rank, e.index)
    kw = {"group_src" if op != "gather_object" else "group_dst": root} if e.s["group_arg"] else None
    if kw is None:
        kw = {"src" if op != "gather_object" else "dst": e.members[root]}
    if op == "all_gather_object":
        got: list[Any] = [None] * e.n
        dist.all_gather_object(got, mine, group=e.group)
    elif op == "broadcast_object_list":
        got = [mine, e.rank] if e.me == root else [None, None]
        dist.broadcast_object_list(got, group=e.group, **kw)
    elif op == "gather_object":
        got = [None] * e.n if e.me == root else None  # type: ignore[assignment]
        dist.gather_object(mine, got, group=e.group, **kw)
    else:
        got = [None]
        ins = [D.obj_for(seed, r, e.index) for r in e.members] if e.me == root else None
        dist.scatter_object_list(got, ins, group=e.group, **kw)
    c.extra["objects"] = got
    return c


def _differentiable(e: _Env) -> _Call:
    """torch.distributed.nn.functional: the forward is a collective, and so is its backward."""
    c = _Call(e)
    op, group = e.s["op"], e.group or dist.group.WORLD
    x = e.data("in").double().requires_grad_(True)
    if op == "nn_all_reduce":
        ys = [dnn.all_reduce(x, op=e.red, group=group)]
    elif op == "nn_all_gather":
        ys = list(dnn.all_gather(x, group=group))
    elif op == "nn_broadcast":
        ys = [dnn.broadcast(x, src=e.members[e.s["root"]], group=group)]
    elif op == "nn_reduce_scatter":
        ins = [x * (j + 1) for j in range(e.n)]
        ys = [dnn.reduce_scatter(torch.zeros_like(x), ins, op=e.red, group=group)]
    else:
        shape = _cat_shape(e)
        xs = e.data("in", shape).double().requires_grad_(True)
        x = xs
        ys = [dnn.all_to_all_single(torch.zeros_like(xs), xs, group=group)]
    weights = [e.data(f"w{j}", list(y.shape)).double() for j, y in enumerate(ys)]
    loss = sum((y * w).sum() for y, w in zip(ys, weights))

    def read() -> dict[str, Any]:
        loss.backward()
        grad = x.grad
        return {
            "forward": [y.detach().cpu().clone() for y in ys],
            "grad": None if grad is None else grad.cpu(),
        }

    c.read = read
    return c


_HANDLERS: dict[str, Callable[[_Env], _Call]] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_gather": _all_gather,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "reduce_scatter": _reduce_scatter,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "gather": _gather,
    "scatter": _scatter,
    "all_to_all": _all_to_all,
    "all_to_all_single": _all_to_all_single,
    "barrier": _barrier,
    "send_recv": _send_recv,
    "batch_ring": _batch_ring,
    "all_gather_object": _objects,
    "broadcast_object_list": _objects,
    "gather_object": _objects,
    "scatter_object_list": _objects,
    "nn_all_reduce": _differentiable,
    "nn_all_gather": _differentiable,
    "nn_broadcast": _differentiable,
    "nn_reduce_scatter": _differentiable,
    "nn_all_to_all_single": _differentiable,
}
