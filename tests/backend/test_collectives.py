"""Semantics of every collective simdist promises, through public torch.distributed.

Each test runs one SPMD body on a simulated world. The body issues a list of
cases (dtype x reduce op x group x sync/async) and returns what it received; the
test regenerates every rank's inputs from the case seeds and checks each result
against ``collective_reference`` (numpy), never against simdist itself. Every body
runs twice (the point-to-point one too) and the two runs must agree bitwise.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import collective_reference as ref
import numpy as np
import pytest
import torch
import torch.distributed as dist
from collective_reference import BOOL, FLOAT, INT, Sizes
from hypothesis import given, settings
from hypothesis import strategies as st

import simdist
from simdist import Layout

pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")

# Generous: only a broken implementation gets near it, and then it fails instead of hanging.
TIMEOUT = 60.0

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
KIND = {
    name: FLOAT if dt.is_floating_point else (BOOL if dt == torch.bool else INT)
    for name, dt in DTYPES.items()
}
NP_INT = {"int32": np.int32, "int64": np.int64, "uint8": np.uint8}
TORCH_OPS = {name: getattr(dist.ReduceOp, name) for name in ref.REDUCE_OPS}
LAYOUT_AXES = ("tp", "cp", "dp", "pp", "dp_cp", "mp")


# --- worlds ---------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    name: str
    layout: Layout | None
    sizes: Sizes

    @property
    def world_size(self) -> int:
        return self.sizes.world_size

    def axes(self) -> list[str]:
        """'default' means group=None; the rest are ctx.groups entries."""
        return ["default", "world"] + (list(LAYOUT_AXES) if self.layout is not None else [])

    def members(self, axis: str, rank: int) -> list[int]:
        return list(_members(self.sizes, axis, rank))

    def run(self, body: Callable[..., Any], *args: Any, share_args: bool = False, **kwargs: Any) -> list[Any]:
        if self.layout is None:
            return simdist.run(
                body,
                world_size=self.world_size,
                timeout=TIMEOUT,
                args=args,
                kwargs=kwargs,
                share_args=share_args,
            )
        return simdist.run(
            body, layout=self.layout, timeout=TIMEOUT, args=args, kwargs=kwargs, share_args=share_args
        )


@functools.cache
def _members(sizes: Sizes, axis: str, rank: int) -> tuple[int, ...]:
    if axis in ("default", "world"):
        return tuple(range(sizes.world_size))
    return tuple(ref.reference_group_of(sizes, axis, rank))


def flat(n: int) -> World:
    return World(f"flat{n}", None, Sizes(tp=n))


def laid_out(**sizes: int) -> World:
    s = Sizes(**sizes)
    name = "".join(f"{a}{v}" for a, v in sizes.items())
    return World(name, Layout(**sizes), s)


# World sizes 1, 2, 3, 4, 8 (tp=3 is a non-power-of-two axis); the hypothesis
# test below draws more layouts, with 3 on any axis.
WORLDS = [
    flat(1),
    flat(2),
    laid_out(tp=3),
    laid_out(cp=2, dp=2),
    laid_out(tp=2, dp=2, pp=2),
]


def group_handle(ctx: simdist.RankContext, axis: str) -> dist.ProcessGroup | None:
    return None if axis == "default" else ctx.groups[axis]


# --- cases and their data -------------------------------------------------------


@dataclass(frozen=True)
class Case:
    key: str
    axis: str
    dtype: str
    op: str | None
    async_op: bool
    seed: int
    data: str = "any"  # "ints": small integers (float maths exact); "noise"; "any"


def float_data_for(op: str) -> str:
    # Small integers keep SUM and PRODUCT exact in every float dtype, so those
    # compare bitwise; MIN/MAX are exact on any data.
    return "noise" if op in ("MIN", "MAX") else "ints"


def reduction_cases(world: World, full_product: bool) -> list[Case]:
    """Every (dtype, op) torch defines. With ``full_product`` on every group;
    otherwise each pair on three groups, rotating, so all groups still get used."""
    cases: list[Case] = []
    axes = world.axes()
    i = 0
    for dtype, kind in KIND.items():
        for op in ref.REDUCE_OPS:
            if not ref.op_defined(op, kind):
                continue
            data = float_data_for(op) if kind == FLOAT else "any"
            rotated = [axes[(i + k) % len(axes)] for k in range(min(3, len(axes)))]
            chosen = axes if full_product else rotated
            for j, axis in enumerate(chosen):
                cases.append(
                    Case(
                        f"{axis}/{dtype}/{op}/{data}",
                        axis,
                        dtype,
                        op,
                        (i + j) % 2 == 1,
                        seed=len(cases),
                        data=data,
                    )
                )
            i += 1
    # Random floats: rounding happens, results compared within a bound that holds
    # for any summation order.
    for dtype in ("float32", "float64", "bfloat16", "float16"):
        for op in ("SUM", "AVG"):
            for j, axis in enumerate(axes if full_product else axes[:3]):
                cases.append(
                    Case(
                        f"{axis}/{dtype}/{op}/noise",
                        axis,
                        dtype,
                        op,
                        j % 2 == 0,
                        seed=len(cases),
                        data="noise",
                    )
                )
    return cases


def movement_cases(world: World) -> list[Case]:
    cases: list[Case] = []
    for i, dtype in enumerate(DTYPES):
        for j, axis in enumerate(world.axes()):
            cases.append(
                Case(f"{axis}/{dtype}", axis, dtype, None, (i + j) % 2 == 1, seed=len(cases), data="noise")
            )
    return cases


def make(case: Case, rank: int, shape: Sequence[int] = (5,), sub: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input for ``case``: a pure function of its arguments, so the
    test can rebuild every member's input for the reference."""
    rng = np.random.default_rng([case.seed, rank, sub, 12345])
    shape = tuple(shape)
    kind = KIND[case.dtype]
    if kind == BOOL:
        values: np.ndarray = rng.integers(0, 2, size=shape).astype(np.bool_)
    elif kind == INT:
        np_dtype = NP_INT[case.dtype]
        info = np.iinfo(np_dtype)
        lo, hi = int(info.min), int(info.max)
        if info.min < 0 and case.op == "SUM":
            lo, hi = -(2 ** (info.bits - 5)), 2 ** (info.bits - 5)  # no signed overflow on 8 ranks
        elif info.min < 0 and case.op == "PRODUCT":
            lo, hi = -3, 3
        # uint8 keeps its full range: unsigned sums and products wrap, by definition.
        values = rng.integers(lo, hi, size=shape, dtype=np_dtype, endpoint=True)
    elif case.data == "ints":
        pool = [-2.0, -1.0, 1.0, 2.0, 0.0] if case.op == "PRODUCT" else list(np.arange(-4.0, 5.0))
        values = rng.choice(pool, size=shape)
    else:
        values = rng.standard_normal(size=shape) * 3.0
        if case.op is None and values.size >= 4:
            # Data movement must carry every bit pattern, specials included.
            specials = [-0.0, np.inf, -np.inf] + ([np.nan] if case.dtype != "bfloat16" else [])
            flat_values = values.reshape(-1)
            for special in specials:
                flat_values[int(rng.integers(0, flat_values.size))] = special
    return torch.from_numpy(np.ascontiguousarray(values)).to(DTYPES[case.dtype])


@functools.cache
def ref_input(case: Case, rank: int, shape: tuple[int, ...] = (5,), sub: int = 0) -> np.ndarray:
    """``make``'s value as numpy, cached: the checks rebuild each input many times."""
    array = to_np(make(case, rank, shape, sub))
    array.setflags(write=False)
    return array


def to_np(t: torch.Tensor) -> np.ndarray:
    # numpy has no bfloat16; float32 holds every bfloat16 value exactly.
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def split_matrix(seed: int, n: int) -> list[list[int]]:
    """splits[s][r]: rows member s sends to member r in the uneven all_to_all_single (zeros included)."""
    rng = np.random.default_rng([seed, n, 777])
    return [[int(v) for v in rng.integers(0, 4, size=n)] for _ in range(n)]


# --- issuing: one function per collective, run inside the rank's thread --------

Read = Callable[[], Any]
Issued = tuple[Read, Any]


def pick_root(case: Case, members: list[int]) -> int:
    return members[(case.seed * 7 + 3) % len(members)]


def issue_all_reduce(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    t = make(case, rank)
    work = dist.all_reduce(t, op=TORCH_OPS[case.op], group=group, async_op=case.async_op)
    return (lambda: t), work


def issue_reduce(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    t = make(case, rank)
    root = pick_root(case, members)
    if case.seed % 2:
        work = dist.reduce(
            t, group_dst=members.index(root), op=TORCH_OPS[case.op], group=group, async_op=case.async_op
        )
    else:
        work = dist.reduce(t, dst=root, op=TORCH_OPS[case.op], group=group, async_op=case.async_op)
    return (lambda: t), work


def issue_reduce_scatter(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    chunks = [make(case, rank, sub=j) for j in range(len(members))]
    out = torch.empty(5, dtype=DTYPES[case.dtype])
    work = dist.reduce_scatter(out, chunks, op=TORCH_OPS[case.op], group=group, async_op=case.async_op)
    return (lambda: out), work


def issue_reduce_scatter_tensor(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    t = make(case, rank, shape=(2 * len(members), 3))
    out = torch.empty(2, 3, dtype=DTYPES[case.dtype])
    work = dist.reduce_scatter_tensor(out, t, op=TORCH_OPS[case.op], group=group, async_op=case.async_op)
    return (lambda: out), work


def issue_reduce_scatter_single(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    # torch 2.13's new name for reduce_scatter_tensor (which now warns it is deprecated).
    t = make(case, rank, shape=(2 * len(members), 3))
    out = torch.empty(2, 3, dtype=DTYPES[case.dtype])
    work = dist.reduce_scatter_single(out, t, op=TORCH_OPS[case.op], group=group, async_op=case.async_op)
    return (lambda: out), work


def issue_all_gather_single(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    t = make(case, rank, shape=(2, 3))
    out = torch.empty(2 * len(members), 3, dtype=t.dtype)
    work = dist.all_gather_single(out, t, group=group, async_op=case.async_op)
    return (lambda: out), work


def issue_broadcast(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    t = make(case, rank, shape=(2, 3))
    root = pick_root(case, members)
    if case.seed % 2:
        work = dist.broadcast(t, group_src=members.index(root), group=group, async_op=case.async_op)
    else:
        work = dist.broadcast(t, src=root, group=group, async_op=case.async_op)
    return (lambda: t), work


def issue_all_gather(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    t = make(case, rank)
    outs = [torch.empty_like(t) for _ in members]
    work = dist.all_gather(outs, t, group=group, async_op=case.async_op)
    return (lambda: outs), work


def issue_all_gather_into_tensor(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    t = make(case, rank, shape=(2, 3))
    out = torch.empty(2 * len(members), 3, dtype=t.dtype)
    work = dist.all_gather_into_tensor(out, t, group=group, async_op=case.async_op)
    return (lambda: out), work


def issue_gather(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    t = make(case, rank)
    root = pick_root(case, members)
    outs = [torch.empty_like(t) for _ in members] if rank == root else None
    if case.seed % 2:
        work = dist.gather(t, outs, group_dst=members.index(root), group=group, async_op=case.async_op)
    else:
        work = dist.gather(t, outs, dst=root, group=group, async_op=case.async_op)
    return (lambda: outs), work


def issue_scatter(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    root = pick_root(case, members)
    chunks = [make(case, rank, sub=j) for j in range(len(members))] if rank == root else None
    out = torch.empty(5, dtype=DTYPES[case.dtype])
    if case.seed % 2:
        work = dist.scatter(out, chunks, group_src=members.index(root), group=group, async_op=case.async_op)
    else:
        work = dist.scatter(out, chunks, src=root, group=group, async_op=case.async_op)
    return (lambda: out), work


def issue_all_to_all(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    ins = [make(case, rank, sub=j) for j in range(len(members))]
    outs = [torch.empty_like(t) for t in ins]
    work = dist.all_to_all(outs, ins, group=group, async_op=case.async_op)
    return (lambda: outs), work


def issue_all_to_all_single_even(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    t = make(case, rank, shape=(2 * len(members), 3))
    out = torch.empty_like(t)
    work = dist.all_to_all_single(out, t, group=group, async_op=case.async_op)
    return (lambda: out), work


def issue_all_to_all_single_uneven(rank: int, case: Case, group: Any, members: list[int]) -> Issued:
    splits = split_matrix(case.seed, len(members))
    me = members.index(rank)
    in_splits = splits[me]
    out_splits = ref.output_splits(splits)[me]
    t = make(case, rank, shape=(sum(in_splits), 2))
    out = torch.empty(sum(out_splits), 2, dtype=t.dtype)
    work = dist.all_to_all_single(out, t, out_splits, in_splits, group=group, async_op=case.async_op)
    return (lambda: out), work


# --- expectations: what member ``rank`` must hold, from the numpy reference ------

UNSPECIFIED = object()


@dataclass
class Expect:
    value: Any  # ndarray or list of ndarrays
    abs_sum: Any = None  # elementwise sum of |inputs| for rounding bounds (reductions)


def inputs_of(case: Case, members: list[int], shape: tuple[int, ...] = (5,)) -> list[np.ndarray]:
    return [ref_input(case, m, shape) for m in members]


# Each returns what every member must hold, in member order (UNSPECIFIED where the
# collective promises nothing).


def bound_of(
    case: Case, group_result: Callable[[list[np.ndarray]], list[np.ndarray]], xs: list[np.ndarray]
) -> list[Any]:
    """Elementwise sum of |inputs| that each member's result came from: the scale of
    the rounding error any summation order may make."""
    if KIND[case.dtype] != FLOAT:
        return [None] * len(xs)
    return group_result([np.abs(x.astype(np.float64)) for x in xs])


def expect_all_reduce(case: Case, members: list[int]) -> list[Any]:
    xs = inputs_of(case, members)
    bounds = bound_of(case, lambda a: ref.all_reduce(a, "SUM"), xs)
    return [Expect(v, b) for v, b in zip(ref.all_reduce(xs, case.op), bounds)]


def expect_reduce(case: Case, members: list[int]) -> list[Any]:
    xs = inputs_of(case, members)
    root = members.index(pick_root(case, members))
    bound = bound_of(case, lambda a: [ref.reduce(a, "SUM", root)] * len(a), xs)[root]
    # gloo uses non-root buffers as scratch: only the root's result is defined.
    return [
        Expect(ref.reduce(xs, case.op, root), bound) if i == root else UNSPECIFIED
        for i in range(len(members))
    ]


def expect_reduce_scatter(case: Case, members: list[int]) -> list[Any]:
    n = len(members)
    lists = [[ref_input(case, m, sub=j) for j in range(n)] for m in members]
    if KIND[case.dtype] == FLOAT:
        bounds = ref.reduce_scatter(
            [[np.abs(c.astype(np.float64)) for c in chunks] for chunks in lists], "SUM"
        )
    else:
        bounds = [None] * n
    return [Expect(v, b) for v, b in zip(ref.reduce_scatter(lists, case.op), bounds)]


def expect_reduce_scatter_tensor(case: Case, members: list[int]) -> list[Any]:
    xs = inputs_of(case, members, shape=(2 * len(members), 3))
    bounds = bound_of(case, lambda a: ref.reduce_scatter_tensor(a, "SUM"), xs)
    return [Expect(v, b) for v, b in zip(ref.reduce_scatter_tensor(xs, case.op), bounds)]


def expect_broadcast(case: Case, members: list[int]) -> list[Any]:
    xs = inputs_of(case, members, shape=(2, 3))
    return [Expect(v) for v in ref.broadcast(xs, members.index(pick_root(case, members)))]


def expect_all_gather(case: Case, members: list[int]) -> list[Any]:
    return [Expect(v) for v in ref.all_gather(inputs_of(case, members))]


def expect_all_gather_into_tensor(case: Case, members: list[int]) -> list[Any]:
    return [Expect(v) for v in ref.all_gather_into_tensor(inputs_of(case, members, shape=(2, 3)))]


def expect_gather(case: Case, members: list[int]) -> list[Any]:
    root = members.index(pick_root(case, members))
    gathered = ref.gather(inputs_of(case, members), root)
    # Non-roots pass gather_list=None and must get nothing back.
    return [Expect(gathered if i == root else None) for i in range(len(members))]


def expect_scatter(case: Case, members: list[int]) -> list[Any]:
    root = pick_root(case, members)
    chunks = [ref_input(case, root, sub=j) for j in range(len(members))]
    return [Expect(v) for v in ref.scatter(chunks, len(members))]


def expect_all_to_all(case: Case, members: list[int]) -> list[Any]:
    n = len(members)
    lists = [[ref_input(case, m, sub=j) for j in range(n)] for m in members]
    return [Expect(v) for v in ref.all_to_all(lists)]


def expect_all_to_all_single_even(case: Case, members: list[int]) -> list[Any]:
    xs = inputs_of(case, members, shape=(2 * len(members), 3))
    return [Expect(v) for v in ref.all_to_all_single(xs)]


def expect_all_to_all_single_uneven(case: Case, members: list[int]) -> list[Any]:
    splits = split_matrix(case.seed, len(members))
    xs = [ref_input(case, m, (sum(splits[i]), 2)) for i, m in enumerate(members)]
    return [Expect(v) for v in ref.all_to_all_single(xs, splits)]


@functools.cache
def expected(name: str, case: Case, members: tuple[int, ...]) -> list[Any]:
    return COLLECTIVES[name][1](case, list(members))


def expected_for(name: str, case: Case, members: list[int], rank: int) -> Any:
    return expected(name, case, tuple(members))[members.index(rank)]


COLLECTIVES: dict[str, tuple[Callable[..., Issued], Callable[..., Any]]] = {
    "all_reduce": (issue_all_reduce, expect_all_reduce),
    "reduce": (issue_reduce, expect_reduce),
    "reduce_scatter": (issue_reduce_scatter, expect_reduce_scatter),
    "reduce_scatter_tensor": (issue_reduce_scatter_tensor, expect_reduce_scatter_tensor),
    "reduce_scatter_single": (issue_reduce_scatter_single, expect_reduce_scatter_tensor),
    "broadcast": (issue_broadcast, expect_broadcast),
    "all_gather": (issue_all_gather, expect_all_gather),
    "all_gather_into_tensor": (issue_all_gather_into_tensor, expect_all_gather_into_tensor),
    "all_gather_single": (issue_all_gather_single, expect_all_gather_into_tensor),
    "gather": (issue_gather, expect_gather),
    "scatter": (issue_scatter, expect_scatter),
    "all_to_all": (issue_all_to_all, expect_all_to_all),
    "all_to_all_single_even": (issue_all_to_all_single_even, expect_all_to_all_single_even),
    "all_to_all_single_uneven": (issue_all_to_all_single_uneven, expect_all_to_all_single_uneven),
}
# Names torch itself lacks (the *_single ones are new in 2.13) are left out.
AVAILABLE = tuple(
    name for name in COLLECTIVES if hasattr(dist, name.replace("_even", "").replace("_uneven", ""))
)
# Same backend paths as the *_tensor forms: checked on fewer worlds.
ALIASES = tuple(n for n in ("reduce_scatter_single", "all_gather_single") if n in AVAILABLE)
REDUCTIONS = tuple(
    n for n in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor") if n in AVAILABLE
)
MOVEMENTS = tuple(name for name in AVAILABLE if name not in REDUCTIONS + ALIASES)


def collective_body(ctx: simdist.RankContext, world: World, name: str, cases: list[Case]) -> dict[str, Any]:
    """Issue every case in order (the same order on every rank), async ones a few at a time."""
    issue = COLLECTIVES[name][0]
    assert len({case.key for case in cases}) == len(cases), "case keys must be unique"
    results: dict[str, Any] = {}
    pending: list[tuple[str, Read, Any]] = []

    def drain() -> None:
        for key, read, work in pending:
            assert work is not None, f"{name} with async_op=True returned no Work"
            work.wait()
            assert work.is_completed(), f"{name}: Work not completed after wait()"
            results[key] = read()
        pending.clear()

    for case in cases:
        read, work = issue(ctx.rank, case, group_handle(ctx, case.axis), world.members(case.axis, ctx.rank))
        if case.async_op:
            pending.append((case.key, read, work))
            if len(pending) >= 3:  # keep several Works outstanding at once
                drain()
        else:
            assert work is None, f"{name} without async_op returned {work!r}"
            results[case.key] = read()
    drain()
    return results


# --- comparing ----------------------------------------------------------------


def compare(got: Any, expect: Expect, case: Case, n: int) -> str | None:
    """None when ``got`` is right, else a description of what is wrong."""
    want = expect.value
    if want is None:
        return None if got is None else f"expected None, got {type(got).__name__}"
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"expected a list of {len(want)} tensors, got {got!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            problem = compare(g, Expect(w), case, n)
            if problem:
                return f"[{i}]: {problem}"
        return None
    dtype = DTYPES[case.dtype]
    if not isinstance(got, torch.Tensor) or got.dtype != dtype or tuple(got.shape) != want.shape:
        return f"expected {dtype} tensor of shape {want.shape}, got {getattr(got, 'dtype', type(got))} {getattr(got, 'shape', '')}"
    kind = KIND[case.dtype]
    if kind == BOOL:
        # gloo itself stores a bool SUM as byte 2 on some elements: compare truth values.
        ok = np.array_equal(got.numpy() != 0, want)
    elif kind == INT:
        ok = torch.equal(got, torch.from_numpy(np.ascontiguousarray(want)))
    elif case.op is None:
        # Moved data must arrive bit for bit (NaN, inf and -0.0 included).
        expected_t = torch.from_numpy(np.ascontiguousarray(want)).to(dtype)
        ok = bits(got) == bits(expected_t)
    elif case.op in ("MIN", "MAX") or (case.data == "ints" and case.op != "AVG"):
        ok = torch.equal(got, torch.from_numpy(np.ascontiguousarray(want)).to(dtype))
    else:
        eps = torch.finfo(dtype).eps
        slack = (n + 1) * eps * expect.abs_sum / (n if case.op == "AVG" else 1) + eps * np.abs(want)
        ok = bool(np.all(np.abs(got.double().numpy() - want) <= slack))
    return None if ok else f"got {got.tolist()}, expected {want.tolist()}"


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def flatten_bits(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), tuple(value.shape), bits(value))
    if isinstance(value, (list, tuple)):
        return [flatten_bits(v) for v in value]
    if isinstance(value, dict):
        return {k: flatten_bits(v) for k, v in value.items()}
    return value


def check_against_reference(
    world: World, name: str, cases: list[Case], results: list[dict[str, Any]]
) -> None:
    problems = []
    for rank in range(world.world_size):
        for case in cases:
            members = world.members(case.axis, rank)
            want = expected_for(name, case, members, rank)
            if want is UNSPECIFIED:
                continue
            problem = compare(results[rank][case.key], want, case, len(members))
            if problem:
                mode = "async" if case.async_op else "sync"
                problems.append(f"{name} {case.key} ({mode}) rank {rank} of group {members}: {problem}")
    assert not problems, f"{len(problems)} wrong results, first ones:\n" + "\n".join(problems[:8])


def run_and_check(world: World, name: str, cases: list[Case]) -> None:
    first = world.run(collective_body, world, name, cases)
    assert len(first) == world.world_size
    check_against_reference(world, name, cases, first)
    second = world.run(collective_body, world, name, cases)
    assert flatten_bits(second) == flatten_bits(first), f"{name}: a second run differs bitwise"


# --- the tests ----------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: w.name)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_collective(name: str, world: World) -> None:
    # all_reduce gets every (dtype, op) on every group while that stays cheap.
    full = name == "all_reduce" and world.world_size <= 4
    run_and_check(world, name, reduction_cases(world, full_product=full))


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: w.name)
@pytest.mark.parametrize("name", MOVEMENTS)
def test_data_movement_collective(name: str, world: World) -> None:
    run_and_check(world, name, movement_cases(world))


@pytest.mark.parametrize("world", [WORLDS[2], WORLDS[4]], ids=lambda w: w.name)
@pytest.mark.parametrize("name", ALIASES)
def test_single_tensor_aliases(name: str, world: World) -> None:
    cases = reduction_cases(world, full_product=False) if "reduce" in name else movement_cases(world)
    run_and_check(world, name, cases)


# Combinations gloo rejects; simdist must refuse them too rather than return data.
UNDEFINED = [
    (op, dtype) for dtype, kind in KIND.items() for op in ref.REDUCE_OPS if not ref.op_defined(op, kind)
]
TORCH_TYPE_NAMES = {
    "float32": "float",
    "float64": "double",
    "bfloat16": "bfloat16",
    "float16": "half",
    "int32": "int",
    "int64": "long",
    "uint8": "byte",
    "bool": "bool",
}


def names_dtype(message: str, dtype: str) -> bool:
    lowered = message.lower()
    return (
        dtype in lowered
        or TORCH_TYPE_NAMES[dtype] in lowered.replace("torch.", " ").split()
        or (f"torch.{dtype}" in lowered)
    )


def undefined_reduction_body(ctx: simdist.RankContext, collective: str, op: str, dtype: str) -> str:
    t = torch.ones(4, dtype=DTYPES[dtype])
    reduce_op = TORCH_OPS[op]
    if collective == "all_reduce":
        dist.all_reduce(t, op=reduce_op)
    elif collective == "reduce":
        dist.reduce(t, dst=0, op=reduce_op)
    elif collective == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(torch.empty(2, dtype=t.dtype), t, op=reduce_op)
    else:
        dist.reduce_scatter(torch.empty(4, dtype=t.dtype), [t, t.clone()], op=reduce_op)
    return "returned data for an undefined reduction"


@pytest.mark.parametrize("op,dtype", UNDEFINED, ids=lambda v: str(v))
def test_undefined_reduction_raises_naming_op(op: str, dtype: str) -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(undefined_reduction_body, world_size=2, timeout=TIMEOUT, args=("all_reduce", op, dtype))
    cause = info.value.__cause__
    assert cause is not None and not isinstance(cause, simdist.PeerFailedError), repr(cause)
    assert op in str(cause), f"error does not name ReduceOp.{op}: {cause!r}"
    assert names_dtype(str(cause), dtype), f"error does not name dtype {dtype}: {cause!r}"


@pytest.mark.parametrize(
    "collective,op,dtype",
    [
        ("reduce", "BAND", "float32"),
        ("reduce_scatter_tensor", "AVG", "int64"),
        ("reduce_scatter", "BXOR", "bfloat16"),
    ],
)
def test_undefined_reduction_raises_in_other_reductions(collective: str, op: str, dtype: str) -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(undefined_reduction_body, world_size=2, timeout=TIMEOUT, args=(collective, op, dtype))
    assert op in str(info.value.__cause__), repr(info.value.__cause__)


# --- barrier --------------------------------------------------------------------


def barrier_body(
    ctx: simdist.RankContext, world: World, arrivals: dict[str, list[int]], lock: threading.Lock
) -> list[str]:
    """Every rank records its arrival, then waits in barrier; afterwards every member
    of its group must have recorded. Late arrivals are staggered so a barrier that
    does not wait would be seen."""
    problems = []
    for i, axis in enumerate(world.axes()):
        members = world.members(axis, ctx.rank)
        key = f"{axis}:{members[0]}"
        time.sleep(0.002 * (members.index(ctx.rank) % 3))
        with lock:
            arrivals.setdefault(key, []).append(ctx.rank)
        if i % 2:
            work = dist.barrier(group=group_handle(ctx, axis), async_op=True)
            work.wait()
        else:
            dist.barrier(group=group_handle(ctx, axis))
        with lock:
            seen = sorted(arrivals[key])
        if not set(members) <= set(seen):
            problems.append(f"rank {ctx.rank} left barrier on {axis} {members} having seen only {seen}")
        dist.barrier(group=group_handle(ctx, axis))  # nobody reuses the key before all have checked
    return problems


@pytest.mark.parametrize("world", WORLDS[1:], ids=lambda w: w.name)
def test_barrier_waits_for_every_member(world: World) -> None:
    results = world.run(barrier_body, world, arrivals={}, lock=threading.Lock(), share_args=True)
    assert results == [[] for _ in range(world.world_size)]


# --- point to point ----------------------------------------------------------------


def p2p_case(world: World, axis: str, dtype: str, salt: int) -> Case:
    return Case(f"p2p/{axis}/{dtype}/{salt}", axis, dtype, None, False, seed=1000 + salt, data="noise")


def p2p_body(ctx: simdist.RankContext, world: World) -> dict[str, torch.Tensor]:
    """Around each group's ring: send/recv, isend/irecv and batch_isend_irecv, every dtype."""
    out: dict[str, torch.Tensor] = {}
    for a, axis in enumerate(world.axes()):
        members = world.members(axis, ctx.rank)
        n = len(members)
        if n == 1:
            continue  # a rank cannot send to itself
        group = group_handle(ctx, axis)
        me = members.index(ctx.rank)
        nxt, prv = members[(me + 1) % n], members[(me - 1) % n]
        for d, dtype in enumerate(DTYPES):
            salt = 100 * a + 10 * d
            # Blocking send/recv: even positions send first so the ring cannot wait on itself.
            case = p2p_case(world, axis, dtype, salt)
            t, buf = make(case, ctx.rank), torch.empty(5, dtype=DTYPES[dtype])
            use_group_index = d % 2 == 1
            if me % 2 == 0:
                send(t, nxt, group, members, use_group_index)
                recv(buf, prv, group, members, use_group_index)
            else:
                recv(buf, prv, group, members, use_group_index)
                send(t, nxt, group, members, use_group_index)
            out[case.key] = buf
            # isend/irecv: post both, then wait.
            case = p2p_case(world, axis, dtype, salt + 1)
            t, buf = make(case, ctx.rank), torch.empty(5, dtype=DTYPES[dtype])
            recv_work = dist.irecv(buf, src=prv, group=group)
            send_work = dist.isend(t, dst=nxt, group=group)
            send_work.wait()
            recv_work.wait()
            out[case.key] = buf
            # batch_isend_irecv: both directions at once.
            fwd, bwd = p2p_case(world, axis, dtype, salt + 2), p2p_case(world, axis, dtype, salt + 3)
            t_fwd, t_bwd = make(fwd, ctx.rank), make(bwd, ctx.rank)
            from_prv, from_nxt = torch.empty_like(t_fwd), torch.empty_like(t_bwd)
            if use_group_index:  # peers named by their rank in the group
                ops = [
                    dist.P2POp(dist.isend, t_fwd, group=group, group_peer=members.index(nxt)),
                    dist.P2POp(dist.irecv, from_prv, group=group, group_peer=members.index(prv)),
                    dist.P2POp(dist.isend, t_bwd, group=group, group_peer=members.index(prv)),
                    dist.P2POp(dist.irecv, from_nxt, group=group, group_peer=members.index(nxt)),
                ]
            else:
                ops = [
                    dist.P2POp(dist.isend, t_fwd, nxt, group),
                    dist.P2POp(dist.irecv, from_prv, prv, group),
                    dist.P2POp(dist.isend, t_bwd, prv, group),
                    dist.P2POp(dist.irecv, from_nxt, nxt, group),
                ]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            out[fwd.key], out[bwd.key] = from_prv, from_nxt
    return out


def send(t: torch.Tensor, dst: int, group: Any, members: list[int], by_group_index: bool) -> None:
    if by_group_index:
        dist.send(t, group_dst=members.index(dst), group=group)
    else:
        dist.send(t, dst=dst, group=group)


def recv(t: torch.Tensor, src: int, group: Any, members: list[int], by_group_index: bool) -> None:
    if by_group_index:
        sender = dist.recv(t, group_src=members.index(src), group=group)
    else:
        sender = dist.recv(t, src=src, group=group)
    assert sender == src, f"recv returned sender {sender}, expected global rank {src}"


@pytest.mark.parametrize("world", WORLDS[1:], ids=lambda w: w.name)
def test_point_to_point_rings(world: World) -> None:
    first = world.run(p2p_body, world)
    problems = []
    for rank in range(world.world_size):
        for a, axis in enumerate(world.axes()):
            members = world.members(axis, rank)
            if len(members) == 1:
                continue
            me = members.index(rank)
            prv, nxt = members[(me - 1) % len(members)], members[(me + 1) % len(members)]
            for d, dtype in enumerate(DTYPES):
                salt = 100 * a + 10 * d
                for offset, sender in ((0, prv), (1, prv), (2, prv), (3, nxt)):
                    case = p2p_case(world, axis, dtype, salt + offset)
                    sent = [ref_input(case, m) for m in members]
                    step = 1 if sender == prv else -1
                    # With two members prv == nxt: messages between a pair match in posting order.
                    want = ref.ring_shift(sent, step)[me]
                    problem = compare(first[rank][case.key], Expect(want), case, len(members))
                    if problem:
                        problems.append(f"{case.key} rank {rank} in {members}: {problem}")
    assert not problems, "\n".join(problems[:8])
    second = world.run(p2p_body, world)
    assert flatten_bits(second) == flatten_bits(first)


def recv_any_source_body(ctx: simdist.RankContext) -> list[tuple[int, float]]:
    """Group member 0 of each dp group receives from every other member, src unspecified."""
    group = ctx.groups.dp
    members = ctx.layout.group_of("dp", ctx.rank)
    if ctx.rank != members[0]:
        dist.send(torch.tensor([float(ctx.rank) + 0.5]), dst=members[0], group=group)
        return []
    got = []
    for _ in members[1:]:
        buf = torch.empty(1)
        sender = dist.recv(buf, group=group)
        got.append((sender, buf.item()))
    return sorted(got)


def test_recv_from_any_source_reports_the_sender_or_is_refused() -> None:
    """gloo matches an any-source recv by arrival; a simulator that promises
    arrival-independent results may refuse it instead, but then clearly."""
    layout = Layout(tp=2, dp=3)
    try:
        results = simdist.run(recv_any_source_body, layout=layout, timeout=TIMEOUT)
    except simdist.RankError as err:
        cause = err.__cause__
        assert isinstance(cause, simdist.UnsupportedOperationError), repr(cause)
        assert "src" in str(cause) and "recv" in str(cause), str(cause)
        return
    for group in ref.reference_group_ranks(Sizes(tp=2, dp=3), "dp"):
        assert results[group[0]] == [(m, m + 0.5) for m in group[1:]]


# --- object collectives -------------------------------------------------------------


def payload(rank: int, tag: str) -> Any:
    # Variable-size pickles: a collective that assumed equal sizes would fail.
    return {
        "from": rank,
        "tag": tag,
        "items": list(range(rank * 3)),
        "text": "x" * (rank * 7 + 1),
        "none": None,
        "tensor": torch.arange(rank + 1, dtype=torch.int64),
    }


def same_object(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_object(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_object(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


def object_body(ctx: simdist.RankContext, world: World) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a, axis in enumerate(world.axes()):
        group = group_handle(ctx, axis)
        members = world.members(axis, ctx.rank)
        n = len(members)
        root = members[(a + 1) % n]
        use_group_index = a % 2 == 1

        objs = [payload(ctx.rank, f"b{axis}"), ("tuple", ctx.rank), f"s{ctx.rank}"]
        if use_group_index:
            dist.broadcast_object_list(objs, group_src=members.index(root), group=group)
        else:
            dist.broadcast_object_list(objs, src=root, group=group)
        out[f"bcast/{axis}"] = objs

        gathered: list[Any] = [None] * n
        dist.all_gather_object(gathered, payload(ctx.rank, f"ag{axis}"), group=group)
        out[f"allgather/{axis}"] = gathered

        dest = [None] * n if ctx.rank == root else None
        if use_group_index:
            dist.gather_object(
                payload(ctx.rank, f"g{axis}"), dest, group_dst=members.index(root), group=group
            )
        else:
            dist.gather_object(payload(ctx.rank, f"g{axis}"), dest, dst=root, group=group)
        out[f"gather/{axis}"] = dest

        received: list[Any] = [None]
        sources = [payload(root, f"sc{axis}-to{j}") for j in range(n)] if ctx.rank == root else None
        if use_group_index:
            dist.scatter_object_list(received, sources, group_src=members.index(root), group=group)
        else:
            dist.scatter_object_list(received, sources, src=root, group=group)
        out[f"scatter/{axis}"] = received[0]
    return out


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: w.name)
def test_object_collectives(world: World) -> None:
    results = world.run(object_body, world)
    problems = []
    for rank in range(world.world_size):
        for a, axis in enumerate(world.axes()):
            members = world.members(axis, rank)
            n, me = len(members), members.index(rank)
            root_index = (a + 1) % n
            root = members[root_index]
            lists = [[payload(m, f"b{axis}"), ("tuple", m), f"s{m}"] for m in members]
            expected = {
                f"bcast/{axis}": ref.broadcast_object_list(lists, root_index)[me],
                f"allgather/{axis}": ref.all_gather_object([payload(m, f"ag{axis}") for m in members])[me],
                f"gather/{axis}": ref.gather_object([payload(m, f"g{axis}") for m in members], root_index)
                if rank == root
                else None,
                f"scatter/{axis}": ref.scatter_object_list(
                    [payload(root, f"sc{axis}-to{j}") for j in range(n)], n
                )[me],
            }
            for key, want in expected.items():
                if not same_object(results[rank][key], want):
                    problems.append(
                        f"rank {rank} {key} in {members}: got {results[rank][key]!r}, expected {want!r}"
                    )
    assert not problems, "\n".join(problems[:6])


# --- buffers are the rank's own --------------------------------------------------------


def aliasing_body(ctx: simdist.RankContext) -> list[str]:
    """After a collective, mutating one rank's buffers must not change what peers received."""
    n, r = ctx.world_size, ctx.rank
    mine = torch.full((3,), float(r))
    gathered = [torch.empty(3) for _ in range(n)]
    dist.all_gather(gathered, mine)
    bcast = torch.full((3,), float(r))
    dist.broadcast(bcast, src=0)
    chunks = [torch.full((2,), 10.0 * j) for j in range(n)] if r == 0 else None
    scattered = torch.empty(2)
    dist.scatter(scattered, chunks, src=0)
    objs: list[Any] = [{"owner": r}]
    dist.broadcast_object_list(objs, src=0)
    dist.barrier()
    # Scribble over every buffer that was an input somewhere: the broadcast and
    # scatter sources on the root, the received object on the others.
    mine.add_(1000)
    if r == 0:
        bcast.add_(1000)
        for c in chunks or []:
            c.add_(1000)
    else:
        objs[0]["owner"] = -r
    dist.barrier()
    problems = []
    if [t.tolist() for t in gathered] != [[float(j)] * 3 for j in range(n)]:
        problems.append(f"all_gather output changed: {[t.tolist() for t in gathered]}")
    if r != 0 and bcast.tolist() != [0.0] * 3:
        problems.append(f"broadcast output changed: {bcast.tolist()}")
    if scattered.tolist() != [10.0 * r] * 2:
        problems.append(f"scatter output changed: {scattered.tolist()}")
    if r == 0 and objs[0] != {"owner": 0}:
        problems.append(f"root's broadcast object changed by a peer: {objs[0]}")
    return problems


def test_outputs_do_not_alias_peer_buffers() -> None:
    assert simdist.run(aliasing_body, world_size=3, timeout=TIMEOUT) == [[], [], []]


# --- order of arrival ------------------------------------------------------------------


def staggered_body(ctx: simdist.RankContext, reverse: bool) -> list[torch.Tensor]:
    """Float reductions that round, with arrivals forced into one order or the other."""
    n = ctx.world_size
    delay = (n - 1 - ctx.rank) if reverse else ctx.rank
    outs = []
    for k, dtype in enumerate((torch.float32, torch.bfloat16, torch.float16, torch.float32)):
        rng = np.random.default_rng([k, ctx.rank, 99])
        x = torch.from_numpy(rng.standard_normal(64) * 10.0 ** rng.integers(-3, 4, 64)).to(dtype)
        time.sleep(0.002 * delay)
        if k == 3:
            out = torch.empty(8, dtype=dtype)
            dist.reduce_scatter_tensor(out, x[: 8 * n], op=dist.ReduceOp.SUM)
            outs.append(out)
            continue
        dist.all_reduce(x, op=dist.ReduceOp.AVG if k == 2 else dist.ReduceOp.SUM)
        outs.append(x)
    y = torch.from_numpy(np.random.default_rng([ctx.rank, 5]).standard_normal(16)).float()
    time.sleep(0.002 * delay)
    dist.reduce(y, dst=n - 1)
    if ctx.rank == n - 1:
        outs.append(y)
    return outs


@pytest.mark.parametrize("world_size", [3, 8])
def test_results_do_not_depend_on_arrival_order(world_size: int) -> None:
    forward = simdist.run(staggered_body, world_size=world_size, timeout=TIMEOUT, kwargs={"reverse": False})
    backward = simdist.run(staggered_body, world_size=world_size, timeout=TIMEOUT, kwargs={"reverse": True})
    assert flatten_bits(forward) == flatten_bits(backward)


# --- non-contiguous tensors (gloo accepts them) ------------------------------------------


def views_body(ctx: simdist.RankContext) -> dict[str, Any]:
    """Collectives on views of larger buffers must write through to the buffer."""
    r = ctx.rank
    out: dict[str, Any] = {}
    # channels-last: not contiguous, but dense in its own memory format (NCCL and gloo take it)
    base = (torch.arange(8.0).reshape(1, 2, 2, 2) * (r + 1)).to(memory_format=torch.channels_last)
    dist.all_reduce(base)
    out["channels_last_all_reduce"] = base.tolist()
    other = (torch.arange(8.0).reshape(1, 2, 2, 2) * (r + 1)).to(memory_format=torch.channels_last)
    dist.broadcast(other, src=1)
    out["channels_last_broadcast"] = other.tolist()
    flat_buffer = torch.full((10,), -1.0)
    flat_buffer[3:6] = float(r + 1)
    dist.all_reduce(flat_buffer[3:6])  # a slice with a storage offset, as in bucketed DDP
    out["slice_all_reduce"] = flat_buffer.tolist()
    strided = torch.full((2, 8), -1.0)
    dist.all_gather([strided[0, ::2], strided[1, 1::2]], torch.arange(4.0) + 10 * r)
    out["strided_all_gather"] = strided.tolist()
    gathered = torch.full((2, 4), -1.0)
    dist.all_gather_into_tensor(gathered.view(-1)[2:6], torch.full((2,), float(r)))
    out["gather_into_slice"] = gathered.tolist()
    return out


def test_views_are_written_through() -> None:
    results = simdist.run(views_body, world_size=2, timeout=TIMEOUT)
    xs = [np.arange(8.0).reshape(1, 2, 2, 2) * (r + 1) for r in range(2)]
    for got in results:
        assert got["channels_last_all_reduce"] == ref.all_reduce(xs, "SUM")[0].tolist()
        assert got["channels_last_broadcast"] == ref.broadcast(xs, 1)[0].tolist()
        assert got["slice_all_reduce"] == [-1.0] * 3 + [3.0] * 3 + [-1.0] * 4
        want = np.full((2, 8), -1.0)
        want[0, ::2] = np.arange(4.0)
        want[1, 1::2] = np.arange(4.0) + 10
        assert got["strided_all_gather"] == want.tolist()
        assert got["gather_into_slice"] == [[-1.0, -1.0, 0.0, 0.0], [1.0, 1.0, -1.0, -1.0]]


def _strided(r: int) -> torch.Tensor:
    return (torch.arange(8.0) + 10 * r)[::2]


# Where gloo reads or writes a non-contiguous tensor's memory as if it were
# contiguous (measured on torch 2.13: wrong values, elements outside the view
# written) and NCCL refuses it, simdist refuses it: on every member for collectives.
NON_CONTIGUOUS_CALLS: dict[str, Callable[[int], object]] = {
    "all_reduce": lambda r: dist.all_reduce(_strided(r)),
    "transposed all_reduce": lambda r: dist.all_reduce(torch.zeros(2, 3).t()),
    "broadcast": lambda r: dist.broadcast(_strided(r), src=0),
    "reduce": lambda r: dist.reduce(_strided(r), dst=0),
    "scatter": lambda r: dist.scatter(_strided(r), [torch.zeros(4)] * 2 if r == 0 else None, src=0),
    "scatter_list": lambda r: dist.scatter(torch.zeros(4), [_strided(0)] * 2 if r == 0 else None, src=0),
    "reduce_scatter": lambda r: dist.reduce_scatter(_strided(r), [torch.ones(4), torch.ones(4)]),
    "all_to_all_single": lambda r: dist.all_to_all_single(_strided(r), torch.ones(4)),
}


@pytest.mark.parametrize("name", sorted(NON_CONTIGUOUS_CALLS))
def test_non_contiguous_tensors_are_refused_where_gloo_writes_them_as_contiguous(name: str) -> None:
    def body(ctx: simdist.RankContext) -> None:
        NON_CONTIGUOUS_CALLS[name](ctx.rank)

    with pytest.raises(simdist.RankError) as info:
        simdist.run(body, world_size=2, timeout=TIMEOUT)
    failures = info.value.failures
    # scatter_list: only the root passes a list; the other member is stopped with it.
    assert sorted(failures) == ([0] if name == "scatter_list" else [0, 1])
    for exc in failures.values():
        assert isinstance(exc, ValueError), exc
        assert "must be contiguous" in str(exc) and "strides" in str(exc)


def p2p_strided_body(ctx: simdist.RankContext, side: str) -> str:
    if (ctx.rank == 0) == (side == "send"):
        try:
            if side == "send":
                dist.send(_strided(0), dst=1)
            else:
                dist.recv(_strided(1), src=0)
        except ValueError as exc:
            return str(exc)
        return "no error"
    # The peer makes its half of the transfer, which can now never complete.
    if side == "send":
        dist.recv(torch.zeros(4), src=0)
    else:
        dist.send(torch.zeros(4), dst=1)
    return "peer"


@pytest.mark.parametrize("side", ["send", "recv"])
def test_non_contiguous_p2p_is_refused_as_gloo_refuses_it_and_the_peer_is_not_left_waiting(side: str) -> None:
    # gloo: 'input tensor has to be contiguous', and the peer then hangs until its
    # timeout. simdist refuses the same call; the peer's wait is reported, not hung.
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(p2p_strided_body, world_size=2, timeout=TIMEOUT, args=(side,))
    assert "recv from rank 0" in str(info.value) or "send to rank 1" in str(info.value)


def test_a_caught_p2p_refusal_says_what_is_wrong() -> None:
    def body(ctx: simdist.RankContext) -> str:
        if ctx.rank == 0:
            try:
                dist.send(_strided(0), dst=1)
            except ValueError as exc:
                message = str(exc)
            dist.send(torch.zeros(4), dst=1)
            return message
        t = torch.ones(4)
        dist.recv(t, src=0)
        return str(t.tolist())

    message, received = simdist.run(body, world_size=2, timeout=TIMEOUT)
    assert message.startswith("send: tensor must be contiguous, got shape [4] with strides (2,)")
    assert received == str([0.0] * 4)


def edge_shapes_body(ctx: simdist.RankContext) -> dict[str, Any]:
    r, n = ctx.rank, ctx.world_size
    scalar = torch.tensor(float(r + 1))
    dist.all_reduce(scalar, op=dist.ReduceOp.PRODUCT)
    empty = torch.empty(0, 3)
    dist.all_reduce(empty)
    empty_gathered = [torch.empty(0) for _ in range(n)]
    dist.all_gather(empty_gathered, torch.empty(0))
    big = torch.from_numpy(np.random.default_rng([r, 3]).standard_normal(200_001)).float()
    dist.all_reduce(big)
    return {
        "scalar": (tuple(scalar.shape), scalar.item()),
        "empty": tuple(empty.shape),
        "empty_gathered": [tuple(t.shape) for t in empty_gathered],
        "big": big.double().numpy(),
    }


def test_scalar_empty_and_large_tensors() -> None:
    n = 3
    results = simdist.run(edge_shapes_body, world_size=n, timeout=TIMEOUT)
    xs = [
        torch.from_numpy(np.random.default_rng([r, 3]).standard_normal(200_001)).float().double().numpy()
        for r in range(n)
    ]
    want = ref.all_reduce(xs, "SUM")[0]
    bound = ref.all_reduce([np.abs(x) for x in xs], "SUM")[0]
    eps = float(np.finfo(np.float32).eps)
    for got in results:
        assert got["scalar"] == ((), 6.0)
        assert got["empty"] == (0, 3)
        assert got["empty_gathered"] == [(0,)] * n
        assert np.all(np.abs(got["big"] - want) <= (n + 1) * eps * bound)


# --- tensors autograd or inference mode cares about -------------------------------------
# Facts measured on a 2-process gloo world (torch 2.13): a collective writes its
# output outside autograd. Parameters (leaves that require grad) are accepted,
# inference tensors are accepted whether or not the calling rank is in inference
# mode, and a non-leaf keeps its grad_fn, so backward ignores the collective.


def parameter_body(ctx: simdist.RankContext) -> tuple[list[float], list[float], bool]:
    p = torch.nn.Parameter(torch.full((3,), float(ctx.rank)))
    dist.broadcast(p, src=0)  # the usual initial weight sync
    q = torch.nn.Parameter(torch.full((3,), float(ctx.rank)))
    dist.all_reduce(q)
    return p.tolist(), q.tolist(), p.requires_grad and p.grad_fn is None


def inference_on_one_rank_body(ctx: simdist.RankContext) -> list[float]:
    if ctx.rank == 0:
        with torch.inference_mode():
            t = torch.ones(2)
            dist.all_reduce(t)
    else:
        time.sleep(0.01)  # rank 0 arrives first; a later rank completes the collective
        t = torch.ones(2)
        dist.all_reduce(t)
    return t.tolist()


def inference_tensor_outside_body(ctx: simdist.RankContext) -> list[float]:
    with torch.inference_mode():
        t = torch.ones(2)
    dist.all_reduce(t)
    return t.tolist()


def non_leaf_body(ctx: simdist.RankContext) -> tuple[list[float], str, list[float]]:
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    dist.all_reduce(y)
    y.sum().backward()
    return y.tolist(), type(y.grad_fn).__name__, x.grad.tolist()


@pytest.mark.parametrize(
    "body,expected",
    [
        (parameter_body, ([0.0] * 3, [3.0] * 3, True)),
        (inference_on_one_rank_body, [3.0, 3.0]),
        (inference_tensor_outside_body, [3.0, 3.0]),
        (non_leaf_body, ([6.0, 6.0], "MulBackward0", [2.0, 2.0])),
    ],
    ids=["parameters", "inference_on_one_rank", "inference_tensor_outside_mode", "non_leaf"],
)
def test_collectives_write_outside_autograd_like_gloo(body: Callable[..., Any], expected: Any) -> None:
    assert simdist.run(body, world_size=3, timeout=TIMEOUT) == [expected] * 3


# --- async Work futures ------------------------------------------------------------------


def future_body(ctx: simdist.RankContext) -> list[float]:
    t = torch.full((2,), float(ctx.rank))
    work = dist.all_reduce(t, group=ctx.groups.world, async_op=True)
    # DDP communication hooks chain on the Work's future like this.
    averaged = work.get_future().then(lambda fut: fut.value()[0] / ctx.world_size)
    return averaged.wait().tolist()


def test_async_work_future_carries_the_result() -> None:
    results = simdist.run(future_body, world_size=4, timeout=TIMEOUT)
    assert results == [[1.5, 1.5]] * 4


# --- invalid calls fail on every rank, never hang -------------------------------------------


def wrong_output_size_body(ctx: simdist.RankContext, only_rank: int | None) -> None:
    wrong = only_rank is None or ctx.rank == only_rank
    out = torch.empty(ctx.world_size * 2 + (1 if wrong else 0))
    dist.all_gather_into_tensor(out, torch.ones(2))


@pytest.mark.parametrize("only_rank", [None, 1], ids=["every_rank", "one_rank"])
def test_wrong_output_size_raises_instead_of_hanging(only_rank: int | None) -> None:
    with pytest.raises(simdist.SimulationError):
        simdist.run(wrong_output_size_body, world_size=3, timeout=TIMEOUT, kwargs={"only_rank": only_rank})


# --- random layouts ----------------------------------------------------------------------


@st.composite
def small_layouts(draw: st.DrawFn) -> Sizes:
    """Worlds of at most 8 ranks, with axes of 1..3 (3 is the non-power-of-two)."""
    s = Sizes(
        tp=draw(st.integers(1, 3)),
        cp=draw(st.integers(1, 2)),
        dp=draw(st.integers(1, 3)),
        pp=draw(st.integers(1, 3)),
    )
    return s if s.world_size <= 8 else Sizes(tp=s.tp, pp=2)


MIXED = [
    ("all_reduce", "int64", "SUM"),
    ("all_reduce", "float32", "MAX"),
    ("reduce_scatter_tensor", "bfloat16", "SUM"),
    ("all_gather_into_tensor", "uint8", None),
    ("all_to_all_single_uneven", "float16", None),
    ("broadcast", "bool", None),
]


def mixed_body(ctx: simdist.RankContext, world: World, plan: list[tuple[str, Case]]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, case in plan:
        read, work = COLLECTIVES[name][0](
            ctx.rank, case, group_handle(ctx, case.axis), world.members(case.axis, ctx.rank)
        )
        if work is not None:
            work.wait()
        results[case.key] = read()
    return results


@settings(max_examples=8, deadline=None)
@given(small_layouts(), st.integers(0, 2**16))
def test_random_layouts_mixed_collectives(s: Sizes, seed: int) -> None:
    world = World("random", Layout(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp), s)
    plan = []
    for i, axis in enumerate(world.axes()):
        for j, (name, dtype, op) in enumerate(MIXED):
            data = "ints" if KIND[dtype] == FLOAT and op == "SUM" else ("noise" if op is None else "any")
            case = Case(
                f"{name}/{axis}/{dtype}", axis, dtype, op, (i + j) % 2 == 0, seed=seed + len(plan), data=data
            )
            plan.append((name, case))
    results = world.run(mixed_body, world, plan)
    problems = []
    for rank in range(world.world_size):
        for name, case in plan:
            members = world.members(case.axis, rank)
            problem = compare(
                results[rank][case.key], expected_for(name, case, members, rank), case, len(members)
            )
            if problem:
                problems.append(f"{s} {case.key} rank {rank}: {problem}")
    assert not problems, "\n".join(problems[:6])


# --- the reference itself, on hand-worked examples ------------------------------------------


def test_reference_on_hand_worked_examples() -> None:
    a, b = np.array([1, 6], dtype=np.uint8), np.array([255, 3], dtype=np.uint8)
    assert ref.reduce_arrays([a, b], "SUM").tolist() == [0, 9]  # wraps
    assert ref.reduce_arrays([a, b], "BXOR").tolist() == [254, 5]
    assert ref.reduce_arrays([np.array([True, False]), np.array([True, True])], "SUM").tolist() == [
        True,
        True,
    ]
    assert ref.reduce_arrays([np.array([True, False]), np.array([True, True])], "BXOR").tolist() == [
        False,
        True,
    ]
    assert ref.reduce_arrays([np.array([1.0, 2.0]), np.array([2.0, 5.0])], "AVG").tolist() == [1.5, 3.5]
    with pytest.raises(ref.UndefinedReduction):
        ref.reduce_arrays([np.array([1.0])], "BAND")
    with pytest.raises(ref.UndefinedReduction):
        ref.reduce_arrays([np.array([1])], "AVG")
    xs = [np.arange(3) + 10 * s for s in range(2)]
    # member 0 sends [0] to 0 and [1, 2] to 1; member 1 sends [10, 11] to 0 and [12] to 1
    assert [o.tolist() for o in ref.all_to_all_single(xs, [[1, 2], [2, 1]])] == [[0, 10, 11], [1, 2, 12]]
    assert ref.output_splits([[1, 2], [2, 1]]) == [[1, 2], [2, 1]]
    assert ref.output_splits([[0, 3], [1, 1]]) == [[0, 1], [3, 1]]
    assert [o.tolist() for o in ref.reduce_scatter_tensor([np.arange(4), np.arange(4) * 10], "SUM")] == [
        [0, 11],
        [22, 33],
    ]
    assert [o.tolist() for o in ref.ring_shift([np.array([0]), np.array([1]), np.array([2])], 1)] == [
        [2],
        [0],
        [1],
    ]
    assert ref.reference_group_ranks(Sizes(tp=2, pp=2), "mp") == [[0, 1, 2, 3]]
    assert ref.reference_group_ranks(Sizes(tp=2, cp=2, dp=2), "dp_cp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
