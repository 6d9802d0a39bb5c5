"""One set of run options (``RunOptions``) for ``simdist.run``, the pytest marker and ``run_processes``.

Every option the marker takes reaches the run; a mistake is refused with the
same words by all three; the timeout is one rule everywhere (positive and
finite); and arguments holding a view of another argument behave the same on
the simulator and on real processes.
"""

from __future__ import annotations

import fnmatch
import math
import sys

import pytest
import torch

import simdist
from simdist import run_processes

pytest_plugins = ["pytester"]

TIMEOUT = 60.0


def _noop(ctx: simdist.RankContext) -> None:
    pass


# Mistakes and simdist.run's words for them (the marker prefixes the test's name).
BAD_OPTIONS = [
    ({"timeout": math.inf}, ValueError, "timeout must be a positive number of seconds, got inf"),
    ({"timeout": math.nan}, ValueError, "timeout must be a positive number of seconds, got nan"),
    ({"timeout": 0}, ValueError, "timeout must be a positive number of seconds, got 0"),
    ({"timeout": True}, ValueError, "timeout must be a positive number of seconds, got True"),
    ({"timeout": "5"}, ValueError, "timeout must be a positive number of seconds, got '5'"),
    ({"flight_records": 0}, ValueError, "flight_records must be a positive int, got 0"),
    ({"schedule": "rnd"}, ValueError, "schedule must be one of 'rank', 'random', 'concurrent', got 'rnd'"),
    ({"schedule": "random", "schedule_seed": "s"}, TypeError, "schedule_seed must be an int, got str"),
    ({"share_args": "yes"}, TypeError, "share_args must be True or False, got 'yes'"),
    ({"strict_call_sites": 1}, TypeError, "strict_call_sites must be True or False, got 1"),
    ({"seed": "x"}, TypeError, "seed must be an int, got 'x'"),
    ({"seed": 1.0}, TypeError, "seed must be an int, got 1.0"),
    ({"attempt": -1}, ValueError, "attempt must be a non-negative int, got -1"),
    ({"faults": "crash"}, TypeError, "faults must be a simdist.FaultPlan, got str"),
    (
        {"schedule": "concurrent", "rank_local": ["json"]},
        ValueError,
        "rank_local needs a scheduled run (schedule='rank' or 'random'): with schedule='concurrent' "
        "every rank runs at once, so process-wide values cannot belong to one rank at a time",
    ),
]


@pytest.mark.parametrize("options, error, message", BAD_OPTIONS)
def test_run_refuses_a_bad_option_before_any_rank_starts(options: dict, error: type, message: str) -> None:
    started = []
    with pytest.raises(error) as info:
        simdist.run(lambda ctx: started.append(ctx.rank), world_size=2, **options)
    assert str(info.value) == message
    assert started == []


def test_the_marker_refuses_each_mistake_with_runs_words(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        **{
            # repr(math.inf) is "inf": the module defines the names the reprs use.
            f"test_bad{i}": "import math\nimport pytest\ninf, nan = math.inf, math.nan\n\n"
            f"@pytest.mark.simdist(world_size=2, **{options!r})\ndef test_bad{i}(ctx):\n    pass\n"
            for i, (options, _, _) in enumerate(BAD_OPTIONS)
        }
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=len(BAD_OPTIONS))
    out = result.stdout.str()
    for i, (_, error, message) in enumerate(BAD_OPTIONS):
        line = f"@pytest.mark.simdist on test_bad{i}: {message}"
        assert line in out, line
        assert f"{error.__name__}: {line}" in out


@pytest.mark.parametrize(
    "options, error",
    [
        ({"world_size": 0}, ValueError),
        ({"world_size": True}, ValueError),
        ({"layout": "tp2"}, TypeError),
        ({"layout": simdist.Layout(tp=2), "world_size": 3}, ValueError),
        ({"world_size": 2, "timeout": math.inf}, ValueError),
        ({"world_size": 2, "timeout": -1}, ValueError),
    ],
)
def test_run_processes_checks_world_and_timeout_in_runs_words(options: dict, error: type) -> None:
    with pytest.raises(error) as from_run:
        simdist.run(_noop, **options)
    with pytest.raises(error) as from_processes:
        run_processes(_noop, **options)
    assert str(from_processes.value) == str(from_run.value)


def test_run_processes_without_a_world_says_who_needs_one() -> None:
    with pytest.raises(ValueError, match=r"^run\(\) needs layout=Layout\(\.\.\.\) or world_size=N$"):
        simdist.run(_noop)
    with pytest.raises(ValueError, match=r"^run_processes needs layout=Layout\(\.\.\.\) or world_size=N$"):
        run_processes(_noop)


def test_an_infinite_session_timeout_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--simdist-timeout=inf")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--simdist-timeout must be a positive number of seconds, got inf*"])


# ------------------------------------------------- every option reaches the run

MARKED = """
import pytest
import torch
import torch.distributed as dist
import simdist
from simdist._run import RunObserver, observe

ORDER = []


def take_turns(ctx):
    for _ in range(3):
        ORDER.append(ctx.rank)
        dist.barrier()


@pytest.mark.simdist(world_size=4, schedule="random", schedule_seed=5)
def test_random_schedule(ctx):
    take_turns(ctx)


def test_the_marker_ran_the_random_schedule():
    got = list(ORDER)
    ORDER.clear()
    simdist.run(take_turns, world_size=4, schedule="random", schedule_seed=5)
    random_order = list(ORDER)
    ORDER.clear()
    simdist.run(take_turns, world_size=4)
    assert got == random_order, (got, random_order)
    assert got != ORDER, "schedule_seed=5 happens to give rank order: pick another seed"


class Holder:
    value = -1


HOLDER = Holder()


@pytest.mark.simdist(world_size=3, rank_local=[(HOLDER, "value")])
def test_rank_local(ctx):
    HOLDER.value = ctx.rank
    dist.barrier()
    assert HOLDER.value == ctx.rank


def test_rank_local_was_put_back():
    assert HOLDER.value == -1


@pytest.fixture
def seen():
    return []


@pytest.mark.simdist(world_size=3, share_args=False)
def test_own_fixture_copy(ctx, seen):
    seen.append(ctx.rank)
    dist.barrier()
    assert seen == [ctx.rank]


@pytest.mark.simdist(world_size=3)
def test_fixtures_shared_by_default(ctx, seen):
    seen.append(ctx.rank)
    dist.barrier()
    assert sorted(seen) == [0, 1, 2]


@pytest.mark.simdist(world_size=2, device="meta")
def test_device(ctx):
    assert ctx.device == torch.device("meta")


OPTIONS = []


class Watch(RunObserver):
    keeps_all_records = False

    def run_ended(self, world):
        OPTIONS.append(world.options)


@pytest.fixture
def watch():
    with observe(Watch()):
        yield


@pytest.mark.simdist(
    world_size=2, flight_records=3, attempt=2, strict_call_sites=True, timeout=77,
    schedule="concurrent", schedule_seed=9, seed=4, reduction="tree",
)
def test_the_rest(ctx, watch):
    assert (ctx.attempt, ctx.seed) == (2, 4)


def test_the_rest_reached_the_run():
    (o,) = OPTIONS
    assert (o.flight_records, o.attempt, o.strict_call_sites, o.timeout) == (3, 2, True, 77.0)
    assert (o.schedule, o.schedule_seed, o.seed, o.reduction) == ("concurrent", 9, 4, "tree")
"""


def test_every_run_option_given_to_the_marker_reaches_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=9)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where CUDA is missing")
def test_a_marked_cuda_test_is_collected_and_fails_when_it_runs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.simdist(world_size=2, device='cuda')\ndef test_cuda(ctx):\n    pass\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert fnmatch.fnmatch(
        result.stdout.str(), "*device='cuda' was asked for, but torch.cuda.is_available() is False*"
    )


# ------------------------------------------ a view argument and its base (17.14)


def write_through_views(ctx: simdist.RankContext, base: torch.Tensor, *, views: dict) -> torch.Tensor:
    for view in views.values():
        view.add_(ctx.rank + 1)
    return base


@pytest.mark.gloo
def test_views_share_their_base_on_the_simulator_and_on_processes() -> None:
    base = torch.zeros(4)
    # A slice, and a strided view of a view (base[0] and base[2]), in kwargs
    # while the base is in args: one copy of everything per rank keeps them
    # one storage, as one process holding them all would.
    views = {"slice": base[1:3], "strided": base.view(2, 2).t()[0]}
    expected = [[r + 1.0, r + 1.0, 2.0 * (r + 1), 0.0] for r in range(2)]
    sim = simdist.run(write_through_views, world_size=2, args=(base,), kwargs={"views": views})
    real = run_processes(
        write_through_views, world_size=2, args=(base,), kwargs={"views": views}, timeout=TIMEOUT
    )
    for name, got in (("simdist.run", sim), ("run_processes", real)):
        assert [t.tolist() for t in got] == expected, name
    assert base.tolist() == [0.0] * 4  # every rank wrote its own copy


def test_run_options_are_frozen_and_a_replaced_copy_is_checked_again() -> None:
    import dataclasses

    from simdist._run import RunOptions

    options = RunOptions(world_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.timeout = math.inf  # type: ignore[misc]  # the point: it cannot be set
    with pytest.raises(ValueError, match=r"^timeout must be a positive number of seconds, got inf$"):
        options.replace(timeout=math.inf)
    assert options.replace(timeout=5).timeout == 5.0 and options.timeout == 300.0


def test_the_marker_refuses_what_is_no_run_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.simdist(world_size=2, caller='me', shedule='random')\n"
        "def test_typo(ctx):\n    pass\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*unknown argument(s) caller, shedule; expected layout, layouts, world_size*"]
    )


def test_a_world_too_large_for_the_os_is_refused_at_once_naming_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from simdist._run import options, runner

    monkeypatch.setattr(options, "thread_limits", lambda: {"kernel.threads-max": 5000})

    def built(*args: object, **kwargs: object) -> None:
        raise AssertionError("per-rank state was built for a world that cannot run")

    with monkeypatch.context() as nothing_built:  # refused before anything per rank is built
        nothing_built.setattr(options.RunOptions, "devices", built)
        nothing_built.setattr(runner, "World", built)
        nothing_built.setattr(runner, "rank_inputs", built)
        for kwargs in ({"world_size": 10**8, "timeout": 2}, {"layout": simdist.Layout(dp=10**8)}):
            with pytest.raises(
                ValueError, match=r"world_size 100000000 cannot run here.*kernel.threads-max = 5000"
            ):
                simdist.run(lambda ctx: None, **kwargs)
    assert simdist.run(lambda ctx: ctx.rank, world_size=3) == [0, 1, 2]  # within the limit: runs


def test_the_os_limits_are_read_where_the_os_tells_them() -> None:
    from simdist._run.options import thread_limits

    found = thread_limits()
    assert all(isinstance(v, int) and v > 0 for v in found.values())
    if sys.platform.startswith("linux"):
        assert "kernel.threads-max" in found


def test_a_start_that_passes_the_timeout_ends_the_run_before_any_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # timeout= bounds the run from its call: thousands of new rank threads
    # under a short timeout used to be started to the last before the watchdog
    # began (8192 ranks, timeout=2: about 12 s). The starters' clock is moved
    # past every deadline, so each new thread is due after the timeout.
    import time as real_time
    from types import SimpleNamespace

    from simdist._core import pool

    monkeypatch.setattr(pool, "time", SimpleNamespace(monotonic=lambda: real_time.monotonic() + 10**6))
    ran: list[int] = []
    size = pool.idle_count() + 16  # more ranks than parked threads: new ones must start
    with pytest.raises(
        simdist.SimulationTimeout,
        match=rf"the run's start passed its timeout of 30 s: \d+ of the {size} ranks",
    ):
        simdist.run(lambda ctx: ran.append(ctx.rank), world_size=size, timeout=30)
    assert ran == []  # no body began
    monkeypatch.undo()
    assert simdist.run(lambda ctx: ctx.rank, world_size=size) == list(range(size))  # the next run is whole
