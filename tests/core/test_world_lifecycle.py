"""What a rank sees of torch.distributed inside ``run``, and what is left after it.

Inside the body the public c10d API must answer as in a real job; after ``run``
returns, the caller's torch.distributed state must be exactly as it was, and a
real gloo group must still be creatable. Group memberships are checked against
``collective_reference``'s independent layout formula.
"""

from __future__ import annotations

import threading
from typing import Any

import collective_reference as ref
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from collective_reference import Sizes

import simdist
from simdist import Layout

pytestmark = pytest.mark.filterwarnings("ignore:.*reduce_op.*is deprecated:FutureWarning")

TIMEOUT = 60.0
AXES = ("tp", "cp", "dp", "pp", "dp_cp", "mp", "world")

LAYOUTS = [
    Sizes(tp=2, dp=2, pp=2),
    Sizes(tp=3, cp=2),
    Sizes(cp=2, dp=3),
    Sizes(tp=1, cp=1, dp=1, pp=1),
]


def layout_of(s: Sizes) -> Layout:
    return Layout(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp)


# --- inside the body ---------------------------------------------------------------


def observe(ctx: simdist.RankContext) -> dict[str, Any]:
    """What this rank learns from the public API; compared in the main thread."""
    seen: dict[str, Any] = {
        "is_initialized": dist.is_initialized(),
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "ctx": (ctx.rank, ctx.world_size, ctx.device, ctx.coords, ctx.layout),
        "default_ranks": dist.get_process_group_ranks(None),
    }
    for axis in AXES:
        group = ctx.groups[axis]
        size = dist.get_world_size(group)
        seen[axis] = {
            "ranks": dist.get_process_group_ranks(group),
            "size": size,
            "group_rank": dist.get_rank(group),
            "global_of": [dist.get_global_rank(group, i) for i in range(size)],
            "group_of": {m: dist.get_group_rank(group, m) for m in dist.get_process_group_ranks(group)},
            "attribute_is_item": getattr(ctx.groups, axis) is group,
        }
    return seen


@pytest.mark.parametrize("sizes", LAYOUTS, ids=str)
def test_public_api_inside_body_matches_the_layout(sizes: Sizes) -> None:
    layout = layout_of(sizes)
    results = simdist.run(observe, layout=layout, timeout=TIMEOUT)
    assert len(results) == sizes.world_size
    for rank, seen in enumerate(results):
        assert seen["is_initialized"] is True
        assert (seen["rank"], seen["world_size"]) == (rank, sizes.world_size)
        assert seen["backend"] == "simdist"
        assert seen["ctx"][:3] == (rank, sizes.world_size, torch.device("cpu"))
        assert tuple(seen["ctx"][3]) == ref.reference_coords(sizes, rank)
        assert seen["ctx"][4] == layout
        assert seen["default_ranks"] == list(range(sizes.world_size))
        for axis in AXES:
            members = ref.reference_group_of(sizes, axis, rank)
            got = seen[axis]
            assert got["ranks"] == members, (axis, rank)
            assert got["size"] == len(members), (axis, rank)
            assert got["group_rank"] == members.index(rank), (axis, rank)
            assert got["global_of"] == members, (axis, rank)
            assert got["group_of"] == {m: i for i, m in enumerate(members)}, (axis, rank)
            assert got["attribute_is_item"], axis


def flat_body(ctx: simdist.RankContext) -> dict[str, Any]:
    missing = []
    for axis in ("tp", "cp", "dp", "pp", "dp_cp", "mp"):
        try:
            getattr(ctx.groups, axis)
        except AttributeError as err:
            missing.append((axis, "layout" in str(err).lower() or "world_size" in str(err)))
    return {
        "coords": ctx.coords,
        "layout": ctx.layout,
        "world": dist.get_process_group_ranks(ctx.groups.world),
        "rank": (ctx.rank, dist.get_rank()),
        "missing": missing,
    }


def test_flat_world_has_only_the_world_group() -> None:
    results = simdist.run(flat_body, world_size=3, timeout=TIMEOUT)
    for rank, seen in enumerate(results):
        assert seen["coords"] is None and seen["layout"] is None
        assert seen["world"] == [0, 1, 2]
        assert seen["rank"] == (rank, rank)
        # Each missing axis is an AttributeError that says how to get one.
        assert seen["missing"] == [(a, True) for a in ("tp", "cp", "dp", "pp", "dp_cp", "mp")]


def new_group_body(ctx: simdist.RankContext) -> dict[str, Any]:
    n, r = ctx.world_size, ctx.rank
    out: dict[str, Any] = {}
    # Every rank calls (the default, globally synchronised form), non-members too.
    evens = list(range(0, n, 2))
    g = dist.new_group(list(reversed(evens)))  # c10d sorts the ranks
    if r in evens:
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=g)
        out["evens"] = (dist.get_process_group_ranks(g), dist.get_rank(g), dist.get_world_size(g), t.item())
    else:
        out["evens"] = (g is dist.GroupMember.NON_GROUP_MEMBER, dist.get_rank(g))
    # A group of everyone, made the same way.
    everyone = dist.new_group()
    t = torch.tensor([r + 1], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT, group=everyone)
    out["everyone"] = (dist.get_process_group_ranks(everyone), t.item())
    # Locally synchronised: only the members call.
    odd = list(range(1, n, 2))
    if r in odd:
        g2 = dist.new_group(odd, use_local_synchronization=True)
        t = torch.tensor([float(r)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g2)
        out["odds"] = (dist.get_process_group_ranks(g2), dist.get_rank(g2), t.item())
    return out


@pytest.mark.parametrize("world_size", [1, 4, 5])
def test_new_group_inside_body(world_size: int) -> None:
    for _ in range(2):  # group names from one run must not collide with the next
        results = simdist.run(new_group_body, world_size=world_size, timeout=TIMEOUT)
        evens = list(range(0, world_size, 2))
        odds = list(range(1, world_size, 2))
        for r, seen in enumerate(results):
            if r in evens:
                assert seen["evens"] == (evens, evens.index(r), len(evens), float(sum(evens)))
            else:
                assert seen["evens"] == (True, -1)
            assert seen["everyone"] == (list(range(world_size)), int(np.prod(np.arange(1, world_size + 1))))
            if r in odds:
                assert seen["odds"] == (odds, odds.index(r), float(max(odds)))
            else:
                assert "odds" not in seen


def with_arguments(ctx: simdist.RankContext, a: int, b: str, *, scale: float, tag: str = "default") -> tuple:
    return (ctx.rank, a, b, scale * ctx.rank, tag)


def test_args_and_kwargs_reach_every_rank() -> None:
    results = simdist.run(
        with_arguments, layout=Layout(tp=2, pp=2), args=(7, "x"), kwargs={"scale": 0.5}, timeout=TIMEOUT
    )
    assert results == [(r, 7, "x", 0.5 * r, "default") for r in range(4)]
    results = simdist.run(
        with_arguments, world_size=2, args=(1, "y"), kwargs={"scale": 2.0, "tag": "t"}, timeout=TIMEOUT
    )
    assert results == [(0, 1, "y", 0.0, "t"), (1, 1, "y", 2.0, "t")]


def destroys_its_world(ctx: simdist.RankContext) -> tuple[float, bool]:
    """Training scripts end with destroy_process_group(); that must be harmless here."""
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item(), dist.is_initialized()


def test_body_may_destroy_its_process_group() -> None:
    state_before = c10d_state()
    assert simdist.run(destroys_its_world, world_size=3, timeout=TIMEOUT) == [(3.0, False)] * 3
    assert diff(state_before, c10d_state()) == []
    assert simdist.run(destroys_its_world, world_size=2, timeout=TIMEOUT) == [(1.0, False)] * 2


# --- autograd ---------------------------------------------------------------------------


class CopyToGroup(torch.autograd.Function):
    """Identity forward, all_reduce of the gradient backward (Megatron's copy-to-TP)."""

    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        fctx.group = group
        return x.clone()

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()
        dist.all_reduce(grad, group=fctx.group)
        return grad, None


class ReduceFromGroup(torch.autograd.Function):
    """all_reduce forward, identity backward (Megatron's reduce-from-TP)."""

    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        y = x.clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def weights(rank: int) -> np.ndarray:
    return np.random.default_rng([rank, 42]).integers(-5, 6, size=4).astype(np.float64)


def autograd_body(ctx: simdist.RankContext) -> dict[str, Any]:
    x = torch.arange(4, dtype=torch.float64).requires_grad_()
    w = torch.from_numpy(weights(ctx.rank))
    y = CopyToGroup.apply(x, ctx.groups.tp)
    z = ReduceFromGroup.apply(x * (ctx.rank + 1), ctx.groups.dp)
    loss = (y * w).sum() + (z * w).sum()
    loss.backward()
    # DDP-style: a hook launches an async all_reduce during backward; waited afterwards.
    p = torch.ones(3, dtype=torch.float64, requires_grad=True)
    works = []
    p.register_post_accumulate_grad_hook(
        lambda param: works.append(dist.all_reduce(param.grad, group=ctx.groups.dp, async_op=True))
    )
    (p * float(ctx.rank)).sum().backward()
    for work in works:
        work.wait()
    return {
        "x_grad": x.grad.tolist(),
        "z": z.detach().tolist(),
        "p_grad": p.grad.tolist(),
        "hooks": len(works),
    }


def test_collectives_inside_autograd_backward() -> None:
    sizes = Sizes(tp=2, dp=2, pp=2)
    results = simdist.run(autograd_body, layout=layout_of(sizes), timeout=TIMEOUT)
    x = np.arange(4, dtype=np.float64)
    for rank, got in enumerate(results):
        tp = ref.reference_group_of(sizes, "tp", rank)
        dp = ref.reference_group_of(sizes, "dp", rank)
        # d/dx of sum(y*w) with y's gradient summed over tp, plus (rank+1) * w from z.
        want_grad = ref.all_reduce([weights(m) for m in tp], "SUM")[0] + (rank + 1) * weights(rank)
        assert got["x_grad"] == want_grad.tolist()
        assert got["z"] == ref.all_reduce([x * (m + 1) for m in dp], "SUM")[0].tolist()
        assert got["hooks"] == 1
        assert got["p_grad"] == [float(sum(dp))] * 3


# --- after run -----------------------------------------------------------------------------

_MISSING = object()


def frozen(value: Any) -> Any:
    """Identity of an object, contents (one level deep) of a container: a dict that
    was mutated in place must show up as changed."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, dict):
        return ("dict", id(value), tuple(sorted((id(k), id(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple, set)):
        return (type(value).__name__, id(value), tuple(sorted(id(v) for v in value)))
    return id(value)


def c10d_state() -> dict[str, Any]:
    """A comparable copy of c10d's global bookkeeping: the module namespaces of
    torch.distributed and distributed_c10d (the group registries are module
    globals there) and the fields of c10d's ``_world`` object."""
    state: dict[str, Any] = {}
    for module in (dist, c10d):
        for name, value in vars(module).items():
            if not name.startswith("__"):
                state[f"{module.__name__}.{name}"] = frozen(value)
    for name, value in vars(c10d._world).items():
        state[f"_world.{name}"] = frozen(value)
    state["is_initialized"] = dist.is_initialized()
    state["group.WORLD"] = id(dist.group.WORLD)
    return state


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [k for k in sorted(set(before) | set(after)) if before.get(k, _MISSING) != after.get(k, _MISSING)]


def collective_body(ctx: simdist.RankContext) -> float:
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t, group=ctx.groups.dp)
    dist.barrier()
    return t.item()


def real_gloo_round_trip(store: dist.Store) -> list[float]:
    """A real one-rank gloo world: init, a collective, a new group, destroy."""
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert dist.get_backend() == "gloo" and dist.get_rank() == 0
        t = torch.tensor([3.0])
        dist.all_reduce(t)
        sub = dist.new_group([0])
        dist.all_reduce(t, group=sub)
        return t.tolist()
    finally:
        dist.destroy_process_group()


def test_global_state_and_threads_are_restored_after_run(tmp_path: Any) -> None:
    threads_before = set(threading.enumerate())
    state_before = c10d_state()
    assert not dist.is_initialized()
    results = simdist.run(collective_body, layout=Layout(tp=2, dp=2), timeout=TIMEOUT)
    assert results == [2.0, 4.0, 2.0, 4.0]
    assert not dist.is_initialized()
    assert diff(state_before, c10d_state()) == []
    left = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert left == [], f"threads left running: {left}"
    # A real world can be created (and torn down) afterwards, with either store.
    assert real_gloo_round_trip(dist.HashStore()) == [3.0]
    assert real_gloo_round_trip(dist.FileStore(str(tmp_path / "store"), 1)) == [3.0]
    assert not dist.is_initialized()
    # And simulated worlds still run after the real one. (destroy_process_group
    # itself leaves c10d._backend set, so compare with a fresh snapshot.)
    state_between = c10d_state()
    assert simdist.run(collective_body, layout=Layout(dp=2), timeout=TIMEOUT) == [1.0, 1.0]
    assert diff(state_between, c10d_state()) == []


def test_run_leaves_a_caller_initialised_real_world_alone() -> None:
    """ "Exactly as before" includes a caller that already has a default group."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        default = dist.group.WORLD
        state_before = c10d_state()
        assert simdist.run(collective_body, layout=Layout(dp=3), timeout=TIMEOUT) == [3.0, 3.0, 3.0]
        assert dist.is_initialized() and dist.group.WORLD is default
        assert dist.get_backend() == "gloo" and dist.get_world_size() == 1
        assert diff(state_before, c10d_state()) == []
        t = torch.tensor([5.0])
        dist.all_reduce(t)
        assert t.tolist() == [5.0]
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()
