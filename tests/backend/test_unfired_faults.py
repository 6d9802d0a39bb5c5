"""A FaultPlan that matched no call is reported: the run tested a clean world, not a fault.

``simdist.run`` warns (``UnfiredFaultPlanWarning``, naming every rule and the
calls the run made); a plan that fired, an empty plan or no plan says
nothing. The same holds through the pytest marker, through
``run_with_retry`` and when the run fails for another reason.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import FaultPlan, Layout, UnfiredFaultPlanWarning
from simdist.faults import on_unfired

pytest_plugins = ["pytester"]


def _tp_all_reduce(ctx):
    t = torch.ones(2)
    dist.all_reduce(t, group=ctx.groups.tp)
    return t


def _unfired(record: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, UnfiredFaultPlanWarning)]


def test_a_plan_that_matches_no_call_warns_naming_its_rules_and_the_calls_made():
    plan = FaultPlan.crash(rank=0, op="all_reduce", group="dp") + FaultPlan.corrupt(rank=1, op="broadcast")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        results = simdist.run(_tp_all_reduce, layout=Layout(tp=2), faults=plan)
    assert [r.tolist() for r in results] == [[2.0, 2.0], [2.0, 2.0]]  # a clean run
    [warning] = _unfired(record)
    text = str(warning.message)
    assert "matched no call" in text and "2 rule(s)" in text
    assert "crash rank 0 at call #1 of all_reduce on dp" in text
    assert "corrupt rank 1 at call #1 of broadcast on any group" in text
    assert "all_reduce on tp" in text  # what the run did call
    assert warning.filename == __file__  # points at the user's call, not into simdist


def test_an_nth_past_the_last_call_warns():
    plan = FaultPlan.crash(rank=0, op="all_reduce", nth=2)
    with pytest.warns(UnfiredFaultPlanWarning, match=r"call #2 of all_reduce"):
        simdist.run(_tp_all_reduce, layout=Layout(tp=2), faults=plan)


@pytest.mark.parametrize("faults", [None, FaultPlan()], ids=["no-plan", "empty-plan"])
def test_no_plan_or_an_empty_plan_does_not_warn(faults):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnfiredFaultPlanWarning)
        simdist.run(_tp_all_reduce, layout=Layout(tp=2), faults=faults)


def test_a_plan_that_fires_does_not_warn():
    plan = FaultPlan.crash(rank=1, op="all_reduce", group="tp") + FaultPlan.crash(rank=0, op="broadcast")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnfiredFaultPlanWarning)
        with pytest.raises(simdist.RankError) as info:
            simdist.run(_tp_all_reduce, layout=Layout(tp=2), faults=plan)
    assert isinstance(info.value.__cause__, simdist.InjectedFault)


def test_a_fault_that_only_delays_fires_and_does_not_warn():
    plan = FaultPlan.delay(rank=0, op="all_reduce", seconds=0.001)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnfiredFaultPlanWarning)
        simdist.run(_tp_all_reduce, layout=Layout(tp=2), faults=plan)


def test_a_run_that_fails_before_the_fault_still_warns_besides_its_error():
    def body(ctx):
        if ctx.rank == 1:
            raise ValueError("bad batch on rank 1")
        return _tp_all_reduce(ctx)

    plan = FaultPlan.crash(rank=0, op="all_reduce", nth=5)
    with pytest.warns(UnfiredFaultPlanWarning), pytest.raises(simdist.RankError, match="bad batch"):
        simdist.run(body, layout=Layout(tp=2), faults=plan)


def test_run_with_retry_warns_only_for_the_attempt_whose_plan_never_fired():
    fired = FaultPlan.crash(rank=0, op="all_reduce")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnfiredFaultPlanWarning)
        outcome = simdist.run_with_retry(_tp_all_reduce, layout=Layout(tp=2), faults=fired, retries=1)
    assert outcome.attempts == 2
    with pytest.warns(UnfiredFaultPlanWarning):
        simdist.run_with_retry(
            _tp_all_reduce, layout=Layout(tp=2), faults=FaultPlan.crash(rank=0, op="gather"), retries=1
        )


def test_listeners_see_every_unfired_run_and_can_be_removed_from_another_thread():
    seen = []
    remove = on_unfired(lambda state: seen.append(state.plan))
    plan = FaultPlan.crash(rank=0, op="gather")
    try:
        with pytest.warns(UnfiredFaultPlanWarning):
            simdist.run(_tp_all_reduce, layout=Layout(tp=2), faults=plan)
    finally:
        remover = threading.Thread(target=remove)
        remover.start()
        remover.join()
    assert seen == [plan]
    remove()  # twice is harmless
    with pytest.warns(UnfiredFaultPlanWarning):
        simdist.run(_tp_all_reduce, layout=Layout(tp=2), faults=plan)
    assert seen == [plan]


MARKED = """
import torch
import torch.distributed as dist
import pytest
import simdist


@pytest.mark.simdist(world_size=2, faults=simdist.FaultPlan.crash(rank=1, op="broadcast"))
def test_plan_never_fires(ctx):
    dist.all_reduce(torch.ones(1))


@pytest.mark.simdist(world_size=2, faults=simdist.FaultPlan.delay(rank=1, op="all_reduce", seconds=0.001))
def test_plan_fires(ctx):
    dist.all_reduce(torch.ones(1))
"""


def test_through_the_pytest_marker_only_the_never_firing_plan_warns(pytester: pytest.Pytester):
    pytester.makepyfile(MARKED)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-rA", "-W", "always::simdist.UnfiredFaultPlanWarning"
    )
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        ["*test_plan_never_fires*", "*UnfiredFaultPlanWarning: the FaultPlan matched no call*broadcast*"]
    )
    text = result.stdout.str()
    summary = text[text.index("warnings summary") :]
    assert "test_plan_fires" not in summary.split("-- Docs")[0]
