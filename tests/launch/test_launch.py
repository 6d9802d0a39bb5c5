"""``simdist.launch.run_processes``: real gloo worlds of spawned processes."""

from __future__ import annotations

import multiprocessing
import os
import re
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from simdist import Layout, RankContext, RankError, SimulationTimeout
from simdist.launch import RemoteTraceback, run_processes

pytestmark = pytest.mark.gloo


# Bodies are module-level: ranks unpickle them by reference in their process.


def describe_rank(ctx: RankContext, scale: int) -> dict:
    assert ctx.layout is not None
    t = torch.full((2,), float(ctx.rank * scale))
    dist.all_reduce(t, group=ctx.groups.dp)
    return {
        "rank": (ctx.rank, dist.get_rank(), ctx.world_size, dist.get_world_size()),
        "coords": ctx.coords,
        "device": str(ctx.device),
        "groups": {axis: dist.get_process_group_ranks(ctx.groups[axis]) for axis in ("tp", "dp", "pp", "mp")},
        "dp_sum": t,
    }


def fail_on_rank_one(ctx: RankContext) -> int:
    if ctx.rank == 1:
        raise ValueError("rank one refuses")
    dist.all_reduce(torch.ones(1))  # peers wait here for rank 1, which never comes
    return ctx.rank


def fail_everywhere(ctx: RankContext) -> None:
    raise KeyError(f"missing key on {ctx.rank}")


def sleep_on_rank_zero(ctx: RankContext) -> None:
    if ctx.rank == 0:
        time.sleep(600)
    dist.barrier()


def exit_abruptly(ctx: RankContext) -> None:
    dist.barrier()
    if ctx.rank == 1:
        os._exit(3)
    dist.barrier()


def return_unpicklable(ctx: RankContext) -> object:
    return (x for x in range(ctx.rank))


def test_results_indexed_by_rank_with_layout_groups() -> None:
    layout = Layout(tp=2, pp=2)
    results = run_processes(describe_rank, layout=layout, args=(3,))
    assert len(results) == 4
    for rank, got in enumerate(results):
        assert got["rank"] == (rank, rank, 4, 4)
        assert got["coords"] == layout.coords(rank)
        assert got["device"] == "cpu"
        for axis in ("tp", "dp", "pp", "mp"):
            assert got["groups"][axis] == layout.group_of(axis, rank)
        # dp has one rank here: the all_reduce leaves the value alone.
        assert torch.equal(got["dp_sum"], torch.full((2,), float(rank * 3)))


def test_flat_world_sums_over_every_rank() -> None:
    results = run_processes(describe_rank, layout=Layout(dp=3), kwargs={"scale": 2})
    for got in results:
        assert torch.equal(got["dp_sum"], torch.full((2,), float(2 * (0 + 1 + 2))))


def test_failing_rank_is_named_with_its_traceback() -> None:
    with pytest.raises(RankError) as info:
        run_processes(fail_on_rank_one, world_size=3, timeout=60)
    error = info.value
    assert error.ranks == (1,)
    assert isinstance(error.failures[1], ValueError)
    assert error.__cause__ is error.failures[1]
    assert "rank 1 raised ValueError: rank one refuses" in str(error)
    # Peers only lost their partner: reported as released, not as failures.
    assert sorted(error.released) == [0, 2]
    remote = error.failures[1].__cause__
    assert isinstance(remote, RemoteTraceback)
    assert "fail_on_rank_one" in remote.text


def test_every_independent_failure_is_reported() -> None:
    with pytest.raises(RankError) as info:
        run_processes(fail_everywhere, world_size=2)
    assert info.value.ranks == (0, 1)
    assert all(isinstance(exc, KeyError) for exc in info.value.failures.values())


def test_timeout_kills_the_world() -> None:
    with pytest.raises(SimulationTimeout, match=r"timeout=1.5s.*ranks \[0, 1\] were still running"):
        run_processes(sleep_on_rank_zero, world_size=2, timeout=1.5)
    assert not multiprocessing.active_children()


def test_rank_that_exits_without_a_result() -> None:
    with pytest.raises(RankError, match="rank 1 exited with code 3") as info:
        run_processes(exit_abruptly, world_size=2, timeout=60)
    assert 1 in info.value.failures


def test_unpicklable_result_is_a_rank_error() -> None:
    with pytest.raises(RankError, match="must be picklable") as info:
        run_processes(return_unpicklable, world_size=2)
    assert info.value.ranks == (0, 1)


def test_temporary_files_are_removed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_processes(describe_rank, layout=Layout(tp=2), args=(1,))
    with pytest.raises(RankError):
        run_processes(fail_everywhere, world_size=2)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"world_size": 0}, "world_size must be a positive int, got 0"),
        ({"layout": Layout(tp=2), "world_size": 3}, "world_size=3 disagrees"),
        ({}, "needs layout=Layout"),
        ({"world_size": 2, "backend": "mpi"}, "backend must be 'gloo' or 'nccl', got 'mpi'"),
        ({"world_size": 2, "backend": "nccl"}, "pass device='cuda'"),
        ({"world_size": 2, "timeout": 0}, "timeout must be a positive number of seconds, got 0"),
        ({"world_size": 2, "start_method": "fork"}, "start_method must be one of"),
    ],
)
def test_bad_arguments_are_rejected_before_spawning(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        run_processes(describe_rank, **kwargs)
    assert not multiprocessing.active_children()


def test_lambda_is_rejected_with_advice() -> None:
    with pytest.raises(TypeError, match="module level"):
        run_processes(lambda ctx: ctx.rank, world_size=2)


@pytest.mark.skipif(torch.cuda.device_count() >= 64, reason="needs a machine with fewer than 64 GPUs")
def test_cuda_needs_one_gpu_per_rank() -> None:
    with pytest.raises(ValueError, match="64 ranks need 64 GPUs"):
        run_processes(describe_rank, world_size=64, device="cuda")


TORCHRUN_SCRIPT = """
import sys
import torch, torch.distributed as dist
from simdist import Layout
from simdist.launch import run_torchrun_rank, under_torchrun

def body(ctx, k):
    t = torch.ones(1) * (ctx.rank + k)
    dist.all_reduce(t, group=ctx.groups.dp)
    return ctx.rank, t.item(), dist.get_process_group_ranks(ctx.groups.tp)

if __name__ == "__main__":
    assert under_torchrun()
    result = run_torchrun_rank(body, layout=Layout(tp=2, dp=2), args=(10,))
    # One write of the whole line: the four processes share torchrun's stdout,
    # and print's pieces ("RESULT", then the value) can interleave with theirs.
    sys.stdout.write(f"RESULT {result!r}\\n")
    sys.stdout.flush()
"""


@pytest.mark.slow
def test_torchrun_rank_runs_the_body_in_process(tmp_path: Path) -> None:
    import ast
    import subprocess
    import sys

    script = tmp_path / "body.py"
    script.write_text(TORCHRUN_SCRIPT)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", str(script)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, (
        f"torchrun exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )
    results = sorted(
        ast.literal_eval(line[len("RESULT ") :])
        for line in done.stdout.splitlines()
        if line.startswith("RESULT ")
    )
    # dp groups of Layout(tp=2, dp=2) are {0, 2} and {1, 3}: sums 10+12 and 11+13.
    assert results == [(0, 22.0, [0, 1]), (1, 24.0, [0, 1]), (2, 22.0, [2, 3]), (3, 24.0, [2, 3])]
