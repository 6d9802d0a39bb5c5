"""@pytest.mark.simdist, run by pytest itself (pytester): collection, ids, fixtures, reports."""

from __future__ import annotations

import json
import re

import pytest
from plugin_programs import FAILING_RANK_ONE

pytest_plugins = ["pytester"]

HEADER = """
import time
import pytest
import torch
import torch.distributed as dist
import simdist
from simdist import Layout
"""


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(HEADER + source)
    return pytester.runpytest("-p", "no:cacheprovider", *args)


# ----------------------------------------------------------- collection


def test_worlds_become_parameters_with_readable_ids(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.simdist(layouts=[Layout(tp=2, dp=2), Layout(dp=2, pp=2), Layout(tp=2, cp=2)])
def test_layouts(ctx):
    pass

@pytest.mark.simdist(world_size=3)
def test_flat(ctx):
    pass

@pytest.mark.simdist(layout=Layout(tp=2))
@pytest.mark.parametrize("n", [1, 2])
def test_combined(ctx, n):
    pass

def test_plain():
    pass
""",
        "--collect-only",
        "-q",
    )
    result.stdout.fnmatch_lines(
        [
            "*::test_layouts[[]tp2-dp2-pp1[]]",
            "*::test_layouts[[]tp1-dp2-pp2[]]",
            "*::test_layouts[[]tp2-cp2-dp1-pp1[]]",
            "*::test_flat[[]world3[]]",
            "*::test_combined[[]tp2-dp1-pp1-1[]]",
            "*::test_combined[[]tp2-dp1-pp1-2[]]",
            "*::test_plain",
            "7 tests collected*",
        ]
    )


def test_body_runs_on_every_rank_beside_ordinary_fixtures(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
SEEN = []

@pytest.fixture
def answer():
    return 42

@pytest.mark.simdist(layout=Layout(tp=2, dp=2), seed=5)
def test_every_rank(ctx, answer, tmp_path):
    SEEN.append((ctx.rank, ctx.coords, ctx.seed, answer, tmp_path))
    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.groups.dp)
    assert t.item() == 2
    return "ignored"   # a value returned by a body is ignored, without warning

def test_after():
    assert sorted(r for r, *_ in SEEN) == [0, 1, 2, 3]
    assert {s for _, _, s, _, _ in SEEN} == {5} and {a for *_, a, _ in SEEN} == {42}
    assert SEEN[0][1] is not None and len({p for *_, p in SEEN}) == 1  # one fixture value, shared

class TestInAClass:
    pytestmark = pytest.mark.simdist(world_size=2)

    def test_method(self, ctx):
        assert ctx.world_size == 2 and ctx.coords is None
""",
    )
    result.assert_outcomes(passed=3, warnings=0)


BAD_MARKERS = [
    ("layuot=Layout(tp=2)", "ctx", "unknown argument(s) layuot; expected layout, layouts, world_size*"),
    ("Layout(tp=2)", "ctx", "takes keyword arguments only*"),
    (
        "layout=Layout(tp=2), world_size=2",
        "ctx",
        "give exactly one of layout=, layouts=, world_size=; got layout, world_size",
    ),
    ("world_size=2", "context", "the test must take a `ctx` argument*"),
    ("layouts=[Layout(tp=2), 4]", "ctx", "layouts= takes simdist.Layout objects, got int 4"),
    ("layouts=[Layout(tp=2), Layout(tp=2)]", "ctx", "layouts= lists the same layout twice (tp2-dp1-pp1)"),
    ("world_size=0", "ctx", "world_size must be a positive int*got 0"),
    ("world_size=2, reduction='rnig'", "ctx", "reduction='rnig': reduction must be one of*"),
    ("world_size=2, timeout=-1", "ctx", "timeout must be a positive number of seconds, got -1"),
]


def test_a_bad_marker_fails_collection_naming_the_test(pytester: pytest.Pytester) -> None:
    # One module per mistake, all in one session.
    pytester.makepyfile(
        **{
            f"test_bad{i}": HEADER
            + f"\n@pytest.mark.simdist({marker})\ndef test_bad{i}({signature}):\n    pass\n"
            for i, (marker, signature, _) in enumerate(BAD_MARKERS)
        }
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=len(BAD_MARKERS))
    result.stdout.fnmatch_lines_random(
        [f"*@pytest.mark.simdist on test_bad{i}: {message}" for i, (_, _, message) in enumerate(BAD_MARKERS)]
    )


# -------------------------------------------------------------- reports


def test_a_failing_rank_is_reported_once_with_coordinates_assertion_and_flight_recorder(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(FAILING_RANK_ONE.format(layout="Layout(tp=2, dp=2)", axis="tp"))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            # pytest's own assertion introspection, inside the body
            '>*assert seen == 2, "tp sum is off"',
            "E*AssertionError: tp sum is off",
            "E*assert 3 == 2",
            # one line naming the rank, its coordinates and the assertion
            "E*RankFailed: rank 1 (tp=1 cp=0 dp=0 pp=0) failed: AssertionError: tp sum is off [[]...[]]",
            "*released by that failure (not failures of their own): rank(s) 0, 2, 3",
            "*- simdist flight recorder -*",
            "last calls per rank (flight recorder):",
            "  rank 0:",
            "    all_reduce on world [[]0, 1, 2, 3[]] seq 0 shapes [[][[]1[]][]] float32 4 B at test_*.py:*: started*",
            "FAILED *test_fails[[]tp2-dp2-pp1[]]*",
        ]
    )
    # Released ranks are a line, not tracebacks of their own; no c10d log noise.
    assert "PeerFailedError" not in out
    assert out.count("Traceback") == 0 and "c10d_logger" not in out


def test_independent_failures_are_each_named(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.simdist(world_size=4)
def test_two_fail(ctx):
    assert ctx.rank not in (1, 3), f"rank {ctx.rank} disagrees"
""",
    )
    result.stdout.fnmatch_lines(
        [
            "E*RankFailed: rank 1 of 4 failed: AssertionError: rank 1 disagrees [[]...[]]",
            "*rank 3 of 4 failed: AssertionError: rank 3 disagrees [[]...[]]",
        ]
    )


def test_deadlock_mismatch_and_timeout_appear_as_such(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.simdist(world_size=2)
def test_deadlock(ctx):
    if ctx.rank == 0:
        dist.barrier()

@pytest.mark.simdist(world_size=2)
def test_mismatch(ctx):
    dist.all_reduce(torch.ones(2 + ctx.rank))

@pytest.mark.simdist(world_size=2, timeout=0.5)
def test_timeout(ctx):
    while ctx.rank == 1:
        time.sleep(0.01)
""",
    )
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "E*DeadlockError: deadlock: every live rank is waiting and no pending call can complete",
            "*rank 0 (rank 0 of 2): waiting in barrier on world [[]0, 1[]] seq 0; still missing rank(s) [[]1[]]",
            "*- simdist flight recorder -*",
            "E*CollectiveMismatchError: collective mismatch on world [[]0, 1[]] at sequence number 0*",
            "E*SimulationTimeout: watchdog: 1 rank(s) still running after 0.5 s",
        ]
    )


def test_marker_options_reach_the_run(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.simdist(world_size=2, faults=simdist.FaultPlan.crash(rank=1, op="all_reduce", nth=1))
def test_faults(ctx):
    dist.all_reduce(torch.ones(1))

@pytest.mark.simdist(world_size=3, reduction="shuffled", seed=3)
def test_reduction(ctx):
    assert ctx.seed == 3
    t = torch.tensor([1.0, 1e-8, -1.0], dtype=torch.float32)[ctx.rank:ctx.rank + 1].clone()
    dist.all_reduce(t)

@pytest.mark.simdist(world_size=2, trace=True)
def test_traced(ctx):
    dist.barrier()
    assert False, "look at the trace"
""",
    )
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "E*RankFailed: rank 1 of 2 failed: InjectedFault: injected crash at all_reduce*",
            "*- simdist trace -*",
            "Chrome/Perfetto trace of every call: *test_traced_world2_.json",
        ]
    )
    path = re.search(r"trace of every call: (\S+\.json)", result.stdout.str()).group(1)
    with open(path, encoding="utf-8") as fh:
        events = json.load(fh)["traceEvents"]
    assert sorted(e["tid"] for e in events if e.get("name") == "barrier") == [0, 1]


def test_skip_and_xfail_inside_the_body_are_the_outcome(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
@pytest.mark.simdist(world_size=2)
def test_skips(ctx):
    if ctx.rank == 1:
        pytest.skip("not on this layout")

@pytest.mark.simdist(world_size=2)
def test_xfails(ctx):
    pytest.xfail("known problem")
""",
        "-rsx",
    )
    result.assert_outcomes(skipped=1, xfailed=1)
    result.stdout.fnmatch_lines_random(
        ["SKIPPED [[]1[]] *: not on this layout", "XFAIL *test_xfails* - known problem"]
    )


def test_the_markers_help_names_every_run_option(pytester: pytest.Pytester) -> None:
    """``pytest --markers`` lists every keyword ``simdist.run`` takes (the
    marker accepts them all), read here from run's own signature."""
    import inspect

    import simdist

    result = pytester.runpytest("--markers")
    line = next(ln for ln in result.outlines if ln.startswith("@pytest.mark.simdist("))
    options = set(inspect.signature(simdist.run).parameters) - {
        "fn",
        "layout",
        "world_size",
        "args",
        "kwargs",
    }
    missing = sorted(name for name in options if f"{name}=" not in line)
    assert missing == [], line
