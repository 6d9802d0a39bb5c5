"""Per-rank process state: generators, args copies, rank-local globals.

References are a real gloo world (``simdist.run_processes``) or values worked
out by hand from the program, never simdist's own output.
"""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import Layout

TIMEOUT = 60.0


def seeded_body(ctx: simdist.RankContext) -> dict[str, object]:
    torch.manual_seed(1234 + ctx.rank)
    random.seed(99 + ctx.rank)
    np.random.seed(7 + ctx.rank)
    first = torch.randn(4)
    total = first.clone()
    dist.all_reduce(total, op=dist.ReduceOp.MAX)  # exact in any order; ranks switch here
    dropped = torch.nn.functional.dropout(torch.ones(8), p=0.5)
    dist.barrier()
    return {
        "first": first,
        "total": total,
        "dropped": dropped,
        "after": torch.randn(3),
        "py": random.random(),
        "np": float(np.random.rand()),
    }


def assert_same(a: list[dict[str, object]], b: list[dict[str, object]]) -> None:
    assert len(a) == len(b)
    for rank, (x, y) in enumerate(zip(a, b)):
        for key in x:
            if isinstance(x[key], torch.Tensor):
                assert torch.equal(x[key], y[key]), f"rank {rank} {key}: {x[key]} != {y[key]}"
            else:
                assert x[key] == y[key], f"rank {rank} {key}: {x[key]} != {y[key]}"


def test_seeded_randomness_per_rank_equals_a_gloo_world_bitwise() -> None:
    gloo = simdist.run_processes(seeded_body, world_size=3, timeout=120.0)
    for schedule in ("rank", "random", "rank"):
        sim = simdist.run(seeded_body, world_size=3, timeout=TIMEOUT, schedule=schedule)
        assert_same(sim, gloo)


def draw_body(ctx: simdist.RankContext) -> tuple[torch.Tensor, float, float]:
    t = torch.ones(1)
    dist.all_reduce(t)
    return torch.rand(2), random.random(), float(np.random.rand())


def test_every_rank_starts_from_the_callers_state_which_is_put_back() -> None:
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    want = (torch.rand(2), random.random(), float(np.random.rand()))  # what a forked process draws
    torch.set_rng_state(before[0])
    random.setstate(before[1])
    np.random.seed(5)
    results = simdist.run(draw_body, world_size=4, timeout=TIMEOUT)
    for rank, (t, py, npv) in enumerate(results):
        assert torch.equal(t, want[0]) and py == want[1] and npv == want[2], f"rank {rank}"
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])


def reduce_in_place_body(ctx: simdist.RankContext, x: torch.Tensor) -> torch.Tensor:
    x.mul_(ctx.rank + 1)
    dist.all_reduce(x)
    return x


def test_the_same_tensor_passed_to_every_rank_gives_the_gloo_result_every_time() -> None:
    x = torch.arange(4, dtype=torch.float64)
    gloo = simdist.run_processes(reduce_in_place_body, world_size=3, args=(x,), timeout=120.0)
    assert torch.equal(gloo[0], x * 6)  # 1 + 2 + 3 times each rank's own copy
    for _ in range(5):
        sim = simdist.run(reduce_in_place_body, world_size=3, timeout=TIMEOUT, args=(x,))
        assert all(torch.equal(s, g) for s, g in zip(sim, gloo))
    assert torch.equal(x, torch.arange(4, dtype=torch.float64)), "the caller's tensor is untouched"


def test_share_args_gives_every_rank_the_same_objects() -> None:
    box: list[int] = []
    simdist.run(
        lambda ctx, b: b.append(ctx.rank), world_size=3, args=(box,), share_args=True, timeout=TIMEOUT
    )
    assert sorted(box) == [0, 1, 2]
    copied: list[int] = []
    simdist.run(lambda ctx, b: b.append(ctx.rank), world_size=3, args=(copied,), timeout=TIMEOUT)
    assert copied == [], "by default each rank appends to its own copy"


def test_arguments_that_cannot_be_copied_are_refused_before_any_rank_starts() -> None:
    import threading

    started: list[int] = []
    with pytest.raises(TypeError, match="share_args=True"):
        simdist.run(
            lambda ctx, lock: started.append(1), world_size=2, args=(threading.Lock(),), timeout=TIMEOUT
        )
    assert started == []
    with pytest.raises(TypeError, match="share_args must be True or False"):
        simdist.run(lambda ctx: None, world_size=2, share_args="yes", timeout=TIMEOUT)


# --- rank_local: module globals, like Megatron's parallel_state --------------------------


def make_parallel_state() -> types.ModuleType:
    """A module that keeps its groups in globals and refuses a second init."""
    module = types.ModuleType("fake_parallel_state")
    exec(
        "_DP = None\n"
        "def initialize(group):\n"
        "    global _DP\n"
        "    if _DP is not None:\n"
        "        raise RuntimeError('data parallel group is already initialized')\n"
        "    _DP = group\n"
        "def ranks():\n"
        "    import torch.distributed as dist\n"
        "    return dist.get_process_group_ranks(_DP)\n",
        module.__dict__,
    )
    return module


def parallel_state_body(ctx: simdist.RankContext, state: types.ModuleType) -> list[int]:
    state.initialize(ctx.groups.dp)
    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.groups.dp)  # others initialise while this rank waits
    return state.ranks()


def test_module_globals_shared_by_ranks_fail_as_megatron_does() -> None:
    state = make_parallel_state()
    with pytest.raises(simdist.RankError, match="already initialized"):
        simdist.run(
            parallel_state_body, layout=Layout(tp=2, dp=2), args=(state,), share_args=True, timeout=TIMEOUT
        )


@pytest.mark.parametrize("by", ["module", "name"])
def test_rank_local_module_gives_each_rank_its_own_globals(by: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    state = make_parallel_state()
    monkeypatch.setitem(sys.modules, "fake_parallel_state", state)
    layout = Layout(tp=2, dp=2)
    entry = state if by == "module" else "fake_parallel_state"
    results = simdist.run(
        parallel_state_body,
        layout=layout,
        args=(state,),
        share_args=True,
        rank_local=[entry],
        schedule="random",
        timeout=TIMEOUT,
    )
    assert results == [list(layout.group_of("dp", r)) for r in range(4)]
    assert state._DP is None, "the run-start value is put back"


class Counter:
    calls = 0


def test_rank_local_attribute() -> None:
    Counter.calls = 10

    # Every rank must take part in the same number of barriers.
    def body(ctx: simdist.RankContext) -> int:
        for i in range(3):
            if i <= ctx.rank:
                Counter.calls += 1
            dist.barrier()
        return Counter.calls

    assert simdist.run(body, world_size=3, rank_local=[(Counter, "calls")], timeout=TIMEOUT) == [11, 12, 13]
    assert Counter.calls == 10
    shared = simdist.run(body, world_size=3, timeout=TIMEOUT)
    assert shared == [16, 16, 16], "without rank_local every rank sees every increment"


def test_bad_rank_local_entries_are_refused() -> None:
    with pytest.raises(ValueError, match=r"rank_local\[0\]: cannot import module 'no_such_mod_xyz'"):
        simdist.run(lambda ctx: None, world_size=2, rank_local=["no_such_mod_xyz"])
    with pytest.raises(TypeError, match=r"rank_local\[1\] must be"):
        simdist.run(lambda ctx: None, world_size=2, rank_local=[random, 42])
    with pytest.raises(TypeError, match="rank_local must be a list"):
        simdist.run(lambda ctx: None, world_size=2, rank_local="random")
    with pytest.raises(ValueError, match="rank_local needs a scheduled run"):
        simdist.run(lambda ctx: None, world_size=2, rank_local=[random], schedule="concurrent")


def gauss_body(ctx: simdist.RankContext) -> list[float]:
    dist.barrier()
    return [float(v) for v in np.random.randn(3)] + [random.gauss(0.0, 1.0)]


def test_numpy_state_including_a_cached_gaussian_is_each_ranks_own() -> None:
    np.random.seed(11)
    np.random.randn()  # leaves the second value of a pair cached
    random.seed(11)
    random.gauss(0.0, 1.0)  # so does random.gauss
    start, py_start = np.random.get_state(), random.getstate()
    want = [float(v) for v in np.random.randn(3)] + [
        random.gauss(0.0, 1.0)
    ]  # what every forked process draws
    np.random.set_state(start)
    random.setstate(py_start)
    assert simdist.run(gauss_body, world_size=3, timeout=TIMEOUT) == [want] * 3
    np.random.seed(12)
    random.seed(12)
    start, py_start = np.random.get_state(), random.getstate()
    want = [float(v) for v in np.random.randn(3)] + [random.gauss(0.0, 1.0)]
    np.random.set_state(start)
    random.setstate(py_start)
    assert simdist.run(gauss_body, world_size=3, timeout=TIMEOUT, schedule="random") == [want] * 3
