"""torch.distributed's process-wide caches are audited, and those that hold
rank-specific values are each rank's own (simdist/_isolation/torch_caches.py).

The audit test walks every torch.distributed module in a fresh interpreter
(tests/isolation/torch_cache_walk.py) and fails on a cache that none of the
three tables classifies, so a torch release that adds one is caught. The
regression tests redistribute DTensors whose shards differ per rank and
compare every rank's local tensor with a float64 reference cut from the full
tensor in one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import simdist
from simdist._isolation import torch_caches

WALK = Path(__file__).with_name("torch_cache_walk.py")
TIMEOUT = 120


@pytest.fixture(scope="module")
def walked() -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(WALK)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    caches: list[dict[str, Any]] = json.loads(done.stdout)["caches"]
    return caches


def _per_rank_names() -> set[str]:
    return {f"{module}.{path}" for module, path, _ in torch_caches.PER_RANK}


def _classified() -> dict[str, str]:
    tables = [
        dict.fromkeys(_per_rank_names(), "per rank"),
        torch_caches.OWN_ALREADY,
        torch_caches.RANK_INDEPENDENT,
    ]
    for i, a in enumerate(tables):
        for b in tables[i + 1 :]:
            assert a.keys().isdisjoint(b.keys()), sorted(a.keys() & b.keys())
    return {k: v for table in tables for k, v in table.items()}


def test_every_cache_of_torch_distributed_is_classified(walked: list[dict[str, Any]]) -> None:
    classified = _classified()
    unknown = [c for c in walked if not any(n in classified for n in c["names"])]
    assert unknown == [], (
        "torch.distributed keeps caches simdist has not audited: decide for each whether its keys "
        "can be equal across ranks while its values are rank-specific (then PER_RANK) or not, in "
        f"simdist/_isolation/torch_caches.py: {json.dumps(unknown, indent=1)}"
    )
    found = {n for c in walked for n in c["names"]}
    stale = sorted(set(classified) - found)
    assert stale == [], f"listed in torch_caches but no longer in torch.distributed: {stale}"


def test_each_per_rank_cache_is_reached_only_through_its_own_name(walked: list[dict[str, Any]]) -> None:
    """Swapping rebinds the name; a second module-level name for the same
    object would keep the caller's cache shared (torch_caches' promise)."""
    names = _per_rank_names()
    for cache in walked:
        if names & set(cache["names"]):
            assert len(cache["names"]) == 1, cache


def test_the_walk_sees_the_known_caches(walked: list[dict[str, Any]]) -> None:
    found = {n for c in walked for n in c["names"]}
    assert _per_rank_names() <= found
    kinds = {c["kind"] for c in walked}
    assert {"lru_cache", "dict", "WeakKeyDictionary", "_local"} <= kinds, kinds


# -- values per rank ---------------------------------------------------------------


def _shard(t: torch.Tensor, dim: int, n: int, i: int) -> torch.Tensor:
    """DTensor's Shard(dim) piece i of n: torch.chunk, empty pieces at the end."""
    pieces = torch.chunk(t, n, dim)
    return pieces[i] if i < len(pieces) else t.narrow(dim, 0, 0)


def _local(
    full: torch.Tensor, coord: tuple[int, int], mesh: tuple[int, int], dims: tuple[int | None, ...]
) -> torch.Tensor:
    """The local tensor of placements [Shard(dims[0]) or Replicate, ...] at ``coord``,
    mesh dimensions applied left to right (DTensor's default shard order)."""
    out = full
    for mesh_dim, dim in enumerate(dims):
        if dim is not None:
            out = _shard(out, dim, mesh[mesh_dim], coord[mesh_dim])
    return out


def _placements(dims: tuple[int | None, ...]) -> list[Any]:
    from torch.distributed.tensor import Replicate, Shard

    return [Replicate() if d is None else Shard(d) for d in dims]


CASES = {
    # uneven nested sharding: 7 rows over 2, then 4/3 rows over 2 again
    "nested_uneven_to_transposed": ((2, 2), (7, 5), (0, 0), (1, 0)),
    "nested_uneven_to_one_dim": ((2, 2), (7, 5), (0, 0), (None, 1)),
    # shard-dim changes on a (2, 3) mesh: the first stopped with a
    # CollectiveMismatchError (ranks followed different ranks' plans)
    "shard_dim_change_mismatch": ((2, 3), (5, 7), (1, 1), (0, 1)),
    "shard_dim_change_values": ((2, 3), (5, 7), (0, 1), (0, 0)),
    "shard_dims_swapped": ((2, 3), (5, 7), (0, 1), (1, 0)),
}


def _redistribute(
    ctx: simdist.RankContext, mesh_shape: tuple[int, int], shape: tuple[int, int], src: Any, dsts: list[Any]
) -> list[torch.Tensor]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", mesh_shape)
    full = torch.arange(shape[0] * shape[1], dtype=torch.float32).view(shape)
    d = distribute_tensor(full, mesh, _placements(src))
    # Twice: the second call is the one that finds a cached plan.
    return [d.redistribute(mesh, _placements(dst)).to_local() for dst in dsts for _ in range(2)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_redistribute_gives_every_rank_its_own_shard(case: str) -> None:
    mesh, shape, src, dst = CASES[case]
    results = simdist.run(
        _redistribute, world_size=mesh[0] * mesh[1], args=(mesh, shape, src, [dst]), timeout=TIMEOUT
    )
    full = torch.arange(shape[0] * shape[1], dtype=torch.float64).view(shape)
    for rank, locals_ in enumerate(results):
        coord = divmod(rank, mesh[1])
        want = _local(full, coord, mesh, dst)
        for got in locals_:
            assert got.shape == want.shape, (rank, got.shape, want.shape)
            assert torch.equal(got.double(), want), (rank, got, want)


def test_ranks_start_with_empty_caches_and_the_callers_come_back() -> None:
    import torch.distributed.tensor._redistribute as redistribute

    before = redistribute._gen_transform_infos, redistribute._planner_cache

    def body(ctx: simdist.RankContext) -> tuple[int, int, bool]:
        started = redistribute._gen_transform_infos.cache_info().currsize, len(redistribute._planner_cache)
        _redistribute(ctx, (2, 2), (7, 5), (0, 0), [(1, 0)])
        return (*started, redistribute._gen_transform_infos is before[0])

    assert simdist.run(body, world_size=4, timeout=TIMEOUT) == [(0, 0, False)] * 4
    assert (redistribute._gen_transform_infos, redistribute._planner_cache) == before


def test_fresh_cache_renews_each_kind() -> None:
    import functools

    @functools.lru_cache(maxsize=3, typed=True)
    def f(x: int) -> int:
        return x

    f(1)
    g = torch_caches.fresh_cache(f)
    assert g is not f and g.cache_info().currsize == 0 and g.cache_parameters() == f.cache_parameters()
    assert g(2) == 2 and g.__wrapped__ is f.__wrapped__
    s = torch_caches.fresh_cache(staticmethod(f))
    assert isinstance(s, staticmethod) and s.__func__ is not f
    assert torch_caches.fresh_cache({"a": 1}) == {}
    with pytest.raises(TypeError, match="not a cache simdist knows how to renew: list"):
        torch_caches.fresh_cache([])


def test_caches_are_per_rank_when_a_rank_imports_dtensor_first() -> None:
    """A test module that imports DTensor lazily: the caches' module is first
    imported inside a rank, and each rank must still get its own."""
    program = f"""
import sys
sys.path.insert(0, {str(WALK.parent)!r})
import torch, simdist
assert "torch.distributed.tensor" not in sys.modules
from test_torch_caches import _local, _redistribute
assert "torch.distributed.tensor" not in sys.modules
mesh, shape, src, dst = (2, 2), (7, 5), (0, 0), (1, 0)
results = simdist.run(_redistribute, world_size=4, args=(mesh, shape, src, [dst]), timeout=120)
full = torch.arange(35, dtype=torch.float64).view(shape)
for rank, locals_ in enumerate(results):
    want = _local(full, divmod(rank, 2), mesh, dst)
    assert all(torch.equal(g.double(), want) for g in locals_), (rank, locals_, want)
print("OK")
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-3000:]
