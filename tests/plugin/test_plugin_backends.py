"""--simdist-backend: the same marked tests on the simulator and on real gloo worlds,
skips with reasons where a backend cannot run a test, pytest-xdist and torchrun."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# torch.testing.assert_close imports this lazily. An in-process pytester run
# that triggers that import drops the module again when it restores
# sys.modules, and importing it a second time fails (c10d_functional is
# registered once per process), so it is imported before any such run.
import torch.distributed.tensor
from plugin_programs import FAILING_RANK_ONE

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent
SPMD_FILE = HERE / "test_plugin_spmd_draft_loss.py"
# World sizes 2 and 4: the vocab-parallel loss and a whole split step. The
# whole file runs on gloo in the nightly profile.
SUBSET = [
    "test_vocab_parallel_soft_ce_equals_the_full_vocabulary[tp2-dp1-pp1-cached]",
    "test_split_step_equals_the_float64_reference[tp2-dp2-pp1]",
]


def run_spmd(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, backend: str, tests: list[str]
) -> dict[str, object]:
    out = pytester.mkdir(f"results-{backend}")
    monkeypatch.setenv("SIMDIST_SPMD_RESULTS", str(out))
    targets = [f"{SPMD_FILE}::{test}" for test in tests] if tests else [str(SPMD_FILE)]
    result = pytester.runpytest("-p", "no:cacheprovider", f"--simdist-backend={backend}", *targets)
    result.assert_outcomes(passed=len(tests) if tests else 8)
    return {p.name: torch.load(p, weights_only=False) for p in sorted(out.iterdir())}


@pytest.mark.gloo
@pytest.mark.parametrize(
    "tests",
    [
        pytest.param(SUBSET, id="subset"),
        pytest.param([], id="whole-file", marks=pytest.mark.slow),
    ],
)
def test_draft_loss_on_gloo_agrees_with_sim(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tests: list[str]
) -> None:
    sim = run_spmd(pytester, monkeypatch, "sim", tests)
    gloo = run_spmd(pytester, monkeypatch, "gloo", tests)
    # Every rank of every world saved its results on both backends ...
    assert len(sim) == (2 + 4 if tests else 2 * (2 + 4) + (2 + 4) + (4 + 4)) and set(sim) == set(gloo)
    # ... and they agree: gloo sums in its own order, hence float64 rounding room.
    for name in sim:
        torch.testing.assert_close(gloo[name], sim[name], rtol=1e-6, atol=1e-9, msg=lambda m: f"{name}: {m}")


SIM_ONLY = """
import pytest
import simdist

@pytest.mark.simdist(world_size=2, sim_only=True)
def test_declared(ctx):
    pass

@pytest.mark.simdist(world_size=2, faults=simdist.FaultPlan.crash(rank=0, op="all_reduce"))
def test_faults(ctx):
    pass

@pytest.mark.simdist(world_size=2, reduction="ring")
def test_reduction(ctx):
    pass

@pytest.mark.simdist(world_size=2)
def test_unpicklable(ctx, request):
    pass
"""


def test_simulator_only_tests_are_skipped_on_real_backends_with_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SIM_ONLY)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--simdist-backend=gloo")
    result.assert_outcomes(skipped=3, failed=1)
    result.stdout.fnmatch_lines_random(
        [
            "SKIPPED [[]1[]] *: simulator only, not on --simdist-backend=gloo: sim_only=True: *",
            "SKIPPED [[]1[]] *: simulator only, not on --simdist-backend=gloo: faults=: fault injection exists only in the simulator",
            "SKIPPED [[]1[]] *: simulator only, not on --simdist-backend=gloo: reduction='ring': *",
            # A fixture value that cannot travel to another process is named, before anything is spawned.
            "E*TypeError: fixture 'request' (*) cannot be sent to the gloo ranks, which are separate processes*",
        ]
    )
    result = pytester.runpytest("-p", "no:cacheprovider")  # the simulator runs them all
    result.assert_outcomes(passed=4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reasons given where CUDA is missing")
def test_gpu_and_nccl_tests_say_why_they_are_skipped_without_cuda(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
import pytest

@pytest.mark.gpu
def test_gpu():
    pass

@pytest.mark.simdist(world_size=2)
def test_world(ctx):
    pass
""")
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--simdist-backend=nccl")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines_random(
        [
            "SKIPPED [[]1[]] *: gpu: CUDA is not available here",
            "SKIPPED [[]1[]] *: nccl: world2 needs 2 GPUs (one per rank); this machine has 0",
        ]
    )


XDIST_SUITE = """
import pytest
import torch
import torch.distributed as dist
from simdist import Layout

@pytest.mark.simdist(layouts=[Layout(tp=2, dp=2), Layout(tp=2)])
@pytest.mark.parametrize("n", range(2))
def test_sum(ctx, n):
    t = torch.full((2,), float(ctx.rank + n))
    dist.all_reduce(t)
    size = ctx.world_size
    assert t.tolist() == [size * (size - 1) / 2 + size * n] * 2
"""


# Nightly: two worker interpreters importing torch cost about 10 s on the CI
# machine, and CI's own `pytest -n 2` runs every marked test under xdist anyway.
@pytest.mark.slow
def test_xdist_workers_run_worlds_side_by_side(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(XDIST_SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider", "-n", "2", "-v")
    result.assert_outcomes(passed=4)
    # Both workers ran worlds (each its own process: nothing shared to collide on).
    result.stdout.fnmatch_lines_random(["*[[]gw0[]]*PASSED*", "*[[]gw1[]]*PASSED*"])


TORCHRUN_SUITE = """
import pytest
import torch
import torch.distributed as dist
from simdist import Layout

@pytest.mark.simdist(layouts=[Layout(tp=2, dp=2), Layout(dp=2)])
def test_sum(ctx):
    t = torch.ones(1) * (ctx.rank + 1)
    dist.all_reduce(t, group=ctx.groups.dp)
    assert t.item() == 3

@pytest.mark.simdist(world_size=2)
def test_rank_one_fails(ctx):
    dist.barrier()
    assert ctx.rank == 0, "only rank 0 is right"

@pytest.mark.simdist(world_size=2)
def test_rank_one_skips(ctx):
    if ctx.rank == 1:
        pytest.skip("rank one says no")
"""


@pytest.mark.slow
@pytest.mark.gloo
def test_under_torchrun_every_rank_joins_the_launched_world(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(TORCHRUN_SUITE)
    result = torchrun_pytest(pytester, monkeypatch)
    out = result.stdout.str()
    # Each rank prints its own session: both skip the 4-rank layout, pass the
    # 2-rank one, report rank 1's failure and skip where rank 1 skipped.
    assert out.count("1 failed, 1 passed, 2 skipped") == 2, out
    assert out.count("rank one says no") == 2
    assert out.count("tp2-dp2-pp1 needs 4 ranks; torchrun started 2") == 2
    assert "RankFailed: rank 1 of 2 failed: AssertionError: only rank 0 is right" in out
    assert "this process is rank 0, which passed" in out


def torchrun_pytest(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.RunResult:
    root = str(HERE.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    return pytester.run(
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        "-rs",
        "--simdist-backend=gloo",
        timeout=240,
    )


@pytest.mark.slow
@pytest.mark.gloo
def test_under_torchrun_ranks_that_collected_different_tests_stop(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile("""
import os
import pytest

@pytest.mark.simdist(world_size=2)
def test_everywhere(ctx):
    pass

if os.environ["RANK"] == "1":
    @pytest.mark.simdist(world_size=2)
    def test_only_on_rank_one(ctx):
        pass
""")
    result = torchrun_pytest(pytester, monkeypatch)
    err = result.stderr.str()
    assert err.count("simdist under torchrun: the ranks collected different simdist tests") == 2, err
    assert "rank 0: 1 tests" in err and "rank 1: 2 tests" in err


@pytest.mark.slow
@pytest.mark.gloo
def test_a_failing_gloo_rank_is_reported_with_its_assertion(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(FAILING_RANK_ONE.format(layout="Layout(dp=2)", axis="dp"))
    result = pytester.runpytest("-p", "no:cacheprovider", "--simdist-backend=gloo")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            '*assert seen == 2, "dp sum is off"',
            "AssertionError: dp sum is off",
            "assert 3 == 2",  # pytest's rewriting, inside the rank's process
            "E*RankFailed: rank 1 (tp=0 cp=0 dp=1 pp=0) failed: AssertionError: dp sum is off [[]...[]]",
            "*released by that failure (not failures of their own): rank(s) 0",
        ]
    )
