"""Fault injection: crash, timeout, abort, corrupt and delay, on each group axis,
selected by global rank or by layout coordinates, by n-th call or by sequence
number; plans that add up or come from a seed; and the retry API.

Expected values are computed here from the inputs (exact dyadic numbers, or
numpy bit manipulation for bit flips), never read back from simdist.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import FaultPlan, Layout

pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")

TIMEOUT = 60.0
AXES = ("tp", "cp", "dp", "pp")
FULL = Layout(tp=2, cp=2, dp=2, pp=2)
VICTIM_COORDS = {"tp": 1, "cp": 0, "dp": 1, "pp": 1}
VICTIM = FULL.rank_of(**VICTIM_COORDS)
BackendError = dist.DistBackendError


def contribution(rank: int, rnd: int, axis: str) -> list[float]:
    # Small dyadic numbers: every sum of a few of them is exact in float32, so the
    # expected values do not depend on summation order.
    return [rank + 1.0 + 0.25 * rnd, 2.0 + rnd + AXES.index(axis), -0.5 * (rank % 3) - 1.0]


def axes_body(ctx: simdist.RankContext, rounds: int) -> dict[str, torch.Tensor]:
    """``rounds`` rounds of one all_reduce on each of tp, cp, dp, pp."""
    out = {}
    for rnd in range(rounds):
        for axis in AXES:
            t = torch.tensor(contribution(ctx.rank, rnd, axis))
            dist.all_reduce(t, group=ctx.groups[axis])
            out[f"{rnd}/{axis}"] = t
    return out


def expected_sum(layout: Layout, rank: int, rnd: int, axis: str) -> list[float]:
    members = layout.group_of(axis, rank)
    return [sum(contribution(m, rnd, axis)[i] for m in members) for i in range(3)]


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point:
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.view(ints), b.view(ints))
    return torch.equal(a, b)


def results_bitwise_equal(x: list[dict[str, torch.Tensor]], y: list[dict[str, torch.Tensor]]) -> bool:
    return len(x) == len(y) and all(
        a.keys() == b.keys() and all(bitwise_equal(a[k], b[k]) for k in a) for a, b in zip(x, y)
    )


def label(layout: Layout, axis: str, rank: int) -> str:
    return f"{axis} {layout.group_of(axis, rank)}"


# --- crash ------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", AXES)
def test_crash_on_each_axis_by_coordinates(axis: str) -> None:
    plan = FaultPlan.crash(rank=VICTIM_COORDS, op="all_reduce", group=axis, nth=2)
    with pytest.raises(simdist.RankError) as info:
        simdist.run(axes_body, layout=FULL, faults=plan, timeout=TIMEOUT, args=(2,))
    err = info.value
    assert sorted(err.failures) == [VICTIM]
    assert VICTIM not in err.released
    assert isinstance(err.__cause__, simdist.InjectedFault)
    # The 2nd call on the axis group is that group's sequence number 1.
    assert f"all_reduce on {label(FULL, axis, VICTIM)} seq 1" in str(err.__cause__)
    assert f"rank {VICTIM} (tp=1 cp=0 dp=1 pp=1) failed: InjectedFault" in str(err)


def test_crash_selected_by_sequence_number() -> None:
    plan = FaultPlan.crash(rank=VICTIM, group="pp", seq=2)
    with pytest.raises(simdist.RankError) as info:
        simdist.run(axes_body, layout=FULL, faults=plan, timeout=TIMEOUT, args=(3,))
    assert f"all_reduce on {label(FULL, 'pp', VICTIM)} seq 2" in str(info.value.__cause__)


def test_nth_counts_every_matching_call_of_the_rank() -> None:
    # No group filter: the 3rd all_reduce of the victim is its first dp call.
    plan = FaultPlan.crash(rank=VICTIM, op="all_reduce", nth=3)
    with pytest.raises(simdist.RankError) as info:
        simdist.run(axes_body, layout=FULL, faults=plan, timeout=TIMEOUT, args=(1,))
    assert f"all_reduce on {label(FULL, 'dp', VICTIM)} seq 0" in str(info.value.__cause__)


@pytest.mark.parametrize(
    "plan",
    [
        FaultPlan.crash(rank=VICTIM, op="broadcast"),  # the body never broadcasts
        FaultPlan.crash(rank=VICTIM, group="tp", nth=3),  # only two tp calls
        FaultPlan.crash(rank=VICTIM, group="dp", seq=5),
    ],
    ids=["other-op", "nth-beyond-calls", "seq-beyond-calls"],
)
def test_faults_that_match_no_call_change_nothing(plan: FaultPlan) -> None:
    clean = simdist.run(axes_body, layout=FULL, timeout=TIMEOUT, args=(2,))
    assert results_bitwise_equal(
        simdist.run(axes_body, layout=FULL, faults=plan, timeout=TIMEOUT, args=(2,)), clean
    )
    for rank, out in enumerate(clean):
        for rnd in range(2):
            for axis in AXES:
                assert out[f"{rnd}/{axis}"].tolist() == expected_sum(FULL, rank, rnd, axis)


def p2p_body(ctx: simdist.RankContext) -> list[float]:
    t = torch.full((2,), 1.5)
    if ctx.rank == 0:
        dist.send(t, dst=1)
    else:
        dist.recv(t, src=0)
    return t.tolist()


def test_crash_on_a_recv() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(p2p_body, world_size=2, faults=FaultPlan.crash(rank=1, op="recv"), timeout=TIMEOUT)
    assert sorted(info.value.failures) == [1]
    assert isinstance(info.value.__cause__, simdist.InjectedFault)


# --- timeout -----------------------------------------------------------------------------


@pytest.mark.parametrize("axis", AXES)
def test_timeout_fails_every_member_of_the_group(axis: str) -> None:
    plan = FaultPlan.timeout(rank=VICTIM_COORDS, op="all_reduce", group=axis, nth=2)
    with pytest.raises(simdist.RankError) as info:
        simdist.run(axes_body, layout=FULL, faults=plan, timeout=TIMEOUT, args=(2,))
    err = info.value
    members = FULL.group_of(axis, VICTIM)
    assert sorted(err.failures) == sorted(members)
    for exc in err.failures.values():
        assert isinstance(exc, BackendError)
        assert "injected watchdog timeout" in str(exc)
        assert f"all_reduce on {label(FULL, axis, VICTIM)} seq 1" in str(exc)
    assert isinstance(err.__cause__, BackendError)


def test_timeout_on_a_send_fails_the_sender_with_a_backend_error() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(p2p_body, world_size=2, faults=FaultPlan.timeout(rank=0, op="send"), timeout=TIMEOUT)
    assert sorted(info.value.failures) == [0] and info.value.released == (1,)
    assert isinstance(info.value.__cause__, BackendError)


# --- abort -------------------------------------------------------------------------------


def abort_tolerant_body(ctx: simdist.RankContext, rounds: int) -> dict[str, Any]:
    """Like ``axes_body`` but records a backend error instead of dying on it."""
    out: dict[str, Any] = {}
    for rnd in range(rounds):
        for axis in AXES:
            t = torch.tensor(contribution(ctx.rank, rnd, axis))
            try:
                dist.all_reduce(t, group=ctx.groups[axis])
                out[f"{rnd}/{axis}"] = t.tolist()
            except BackendError as exc:
                out[f"{rnd}/{axis}"] = f"error: {exc}"
    return out


@pytest.mark.parametrize("axis", AXES)
def test_abort_fails_the_group_for_all_members_and_only_that_group(axis: str) -> None:
    plan = FaultPlan.abort(rank=VICTIM_COORDS, group=axis, nth=2)
    results = simdist.run(abort_tolerant_body, layout=FULL, faults=plan, timeout=TIMEOUT, args=(3,))
    members = FULL.group_of(axis, VICTIM)
    for rank, out in enumerate(results):
        for rnd in range(3):
            for ax in AXES:
                got = out[f"{rnd}/{ax}"]
                if rank in members and ax == axis and rnd >= 1:
                    # The call that aborted and every later one on that communicator.
                    assert isinstance(got, str) and "was aborted" in got, (rank, rnd, ax, got)
                    assert label(FULL, axis, VICTIM) in got
                else:
                    assert got == expected_sum(FULL, rank, rnd, ax), (rank, rnd, ax, got)


def abort_pending_body(ctx: simdist.RankContext, victim: int, peer: int) -> dict[str, Any]:
    """``peer`` joins a dp all_reduce without waiting, tells ``victim`` so over
    the world group, and only then does the victim's call abort the communicator:
    the peer's call is pending when the abort happens, whatever the timing."""
    out: dict[str, Any] = {}
    t = torch.ones(2)
    try:
        if ctx.rank == peer:
            work = dist.all_reduce(t, group=ctx.groups.dp, async_op=True)
            dist.send(torch.ones(1), dst=victim)
            work.wait()
        elif ctx.rank == victim:
            dist.recv(torch.zeros(1), src=peer)
            dist.all_reduce(t, group=ctx.groups.dp)
        else:
            dist.all_reduce(t, group=ctx.groups.dp)
        out["first"] = t.tolist()
    except BackendError as exc:
        out["first"] = f"error: {exc}"
    try:
        dist.all_reduce(torch.ones(1), group=ctx.groups.dp)
        out["later"] = "completed"
    except BackendError as exc:
        out["later"] = f"error: {exc}"
    s = torch.ones(1)
    dist.all_reduce(s, group=ctx.groups.tp)
    out["tp"] = s.item()
    return out


def test_abort_fails_a_pending_call_and_later_calls(tmp_path: Path) -> None:
    layout = Layout(tp=2, dp=2)
    victim, peer = 1, 3  # the dp group [1, 3]
    trace = tmp_path / "abort.json"
    results = simdist.run(
        abort_pending_body,
        layout=layout,
        faults=FaultPlan.abort(rank=victim, group="dp", nth=1),
        timeout=TIMEOUT,
        args=(victim, peer),
        trace=str(trace),
    )
    for rank in (victim, peer):
        assert "was aborted" in results[rank]["first"] and "dp/dp_cp [1, 3]" in results[rank]["first"]
        assert "was aborted" in results[rank]["later"]
    for rank in (0, 2):  # the other dp communicator is untouched
        assert results[rank]["first"] == [2.0, 2.0] and results[rank]["later"] == "completed"
    assert [r["tp"] for r in results] == [2.0] * 4
    # The peer's pending call is recorded as failed, not left "started".
    slices = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    peer_dp = [
        e
        for e in slices
        if e["tid"] == peer
        and e["name"] == "all_reduce"
        and e["args"]["seq"] == 0
        and e["cat"].startswith("dp")
    ]
    assert [e["args"]["state"] for e in peer_dp] == ["failed"]


def abort_race_body(ctx: simdist.RankContext) -> str:
    t = torch.ones(1)
    dist.all_reduce(t)
    try:
        dist.all_reduce(t)
        return "completed"
    except BackendError:
        return "aborted"


def test_abort_reaches_a_member_already_inside_its_call() -> None:
    # Rank 0 passes the aborted-group check, then is held by a delay; rank 1
    # aborts the group meanwhile. Rank 0's call must still fail with the abort.
    plan = (
        FaultPlan.delay(rank=1, seconds=0.3, nth=2)
        + FaultPlan.abort(rank=1, nth=2)
        + FaultPlan.delay(rank=0, seconds=1.0, nth=2)
    )
    assert simdist.run(abort_race_body, world_size=2, faults=plan, timeout=TIMEOUT) == ["aborted", "aborted"]


# --- corrupt -----------------------------------------------------------------------------


def flip_expected(value: float | int, dtype: torch.dtype) -> float | int:
    """The documented bit flip, done with numpy: the top exponent bit of a float,
    the lowest bit of an integer."""
    if dtype == torch.float32:
        return float((np.array([value], np.float32).view(np.uint32) ^ np.uint32(1 << 30)).view(np.float32)[0])
    if dtype == torch.float64:
        return float((np.array([value], np.float64).view(np.uint64) ^ np.uint64(1 << 62)).view(np.float64)[0])
    if dtype == torch.float16:
        return float((np.array([value], np.float16).view(np.uint16) ^ np.uint16(1 << 14)).view(np.float16)[0])
    if dtype == torch.bfloat16:
        # bf16 is the top half of a float32; the value must be bf16-exact.
        bits = int(np.array([value], np.float32).view(np.uint32)[0])
        assert bits & 0xFFFF == 0
        flipped = ((bits >> 16) ^ (1 << 14)) << 16
        return float(np.array([flipped], np.uint32).view(np.float32)[0])
    return int(value) ^ 1


def corrupt_expected(x0: float, mode: str) -> float:
    return {
        "nan": float("nan"),
        "inf": float("inf"),
        "sign": -x0,
        "bitflip": flip_expected(x0, torch.float32),
    }[mode]


def check_corrupted_run(layout: Layout, axis: str, mode: str) -> None:
    # Index 1 on every axis the layout has: a rank away from the all-zero corner.
    victim = layout.rank_of(**{a: min(1, getattr(layout, a) - 1) for a in AXES})
    plan = FaultPlan.corrupt(rank=victim, mode=mode, group=axis, nth=2)
    results = simdist.run(axes_body, layout=layout, faults=plan, timeout=TIMEOUT, args=(2,))
    members = layout.group_of(axis, victim)
    for rank, out in enumerate(results):
        for rnd in range(2):
            for ax in AXES:
                got = out[f"{rnd}/{ax}"]
                want = expected_sum(layout, rank, rnd, ax)
                if rank in members and ax == axis and rnd == 1:
                    parts = [np.float32(contribution(m, rnd, ax)[0]) for m in members if m != victim]
                    parts.append(np.float32(corrupt_expected(contribution(victim, rnd, ax)[0], mode)))
                    want[0] = float(np.sum(np.array(parts, np.float32), dtype=np.float32))
                    if mode == "nan":
                        assert torch.isnan(got[0]) and got[1:].tolist() == want[1:]
                        continue
                assert got.tolist() == want, (rank, rnd, ax, mode)


@pytest.mark.parametrize("axis", AXES)
def test_corrupt_on_each_axis(axis: str) -> None:
    check_corrupted_run(FULL, axis, "sign")


@pytest.mark.parametrize("mode", ["nan", "inf", "sign", "bitflip"])
def test_corrupt_modes(mode: str) -> None:
    check_corrupted_run(Layout(tp=2, dp=2), "dp", mode)


def bitflip_body(ctx: simdist.RankContext, dtype: torch.dtype, value: float) -> torch.Tensor:
    t = torch.tensor([value, 5], dtype=dtype) if ctx.rank == 1 else torch.zeros(2, dtype=dtype)
    dist.all_reduce(t)
    return t


@pytest.mark.parametrize(
    "dtype, value",
    [
        (torch.float32, 0.75),
        (torch.float64, 0.75),
        (torch.float16, 0.75),
        (torch.bfloat16, 0.75),
        (torch.int32, 6),
        (torch.int64, 6),
    ],
)
def test_bitflip_per_dtype(dtype: torch.dtype, value: float) -> None:
    results = simdist.run(
        bitflip_body,
        world_size=2,
        faults=FaultPlan.corrupt(rank=1, mode="bitflip"),
        timeout=TIMEOUT,
        args=(dtype, value),
    )
    want = torch.tensor([flip_expected(value, dtype), 5], dtype=dtype)
    assert flip_expected(value, dtype) != value
    for got in results:
        assert bitwise_equal(got, want), (got, want)


def test_corrupt_nan_on_an_integer_tensor_is_refused_clearly() -> None:
    with pytest.raises(simdist.RankError, match="needs a floating tensor"):
        simdist.run(
            bitflip_body,
            world_size=2,
            faults=FaultPlan.corrupt(rank=1, mode="nan"),
            timeout=TIMEOUT,
            args=(torch.int32, 6),
        )


def test_corrupt_a_send_reaches_the_receiver_only() -> None:
    results = simdist.run(
        p2p_body, world_size=2, faults=FaultPlan.corrupt(rank=0, mode="sign", op="send"), timeout=TIMEOUT
    )
    assert results == [[1.5, 1.5], [-1.5, 1.5]]


def test_coordinates_can_select_several_ranks() -> None:
    # {"dp": 1} picks every rank with dp=1: each corrupts its first tp contribution.
    layout = Layout(tp=2, dp=2)
    plan = FaultPlan.corrupt(rank={"dp": 1}, mode="sign", group="tp", nth=1)
    results = simdist.run(axes_body, layout=layout, faults=plan, timeout=TIMEOUT, args=(1,))
    for rank, out in enumerate(results):
        members = layout.group_of("tp", rank)
        want = [
            sum(
                (-1 if layout.coords(m).dp == 1 and i == 0 else 1) * contribution(m, 0, "tp")[i]
                for m in members
            )
            for i in range(3)
        ]
        assert out["0/tp"].tolist() == want


def gather_body(ctx: simdist.RankContext) -> list[float]:
    out = torch.empty(4)
    dist.all_gather_into_tensor(out, torch.full((2,), float(ctx.rank + 1)))
    return out.tolist()


def test_corrupt_an_all_gather_contribution() -> None:
    plan = FaultPlan.corrupt(rank=1, mode="inf", op="all_gather_into_tensor")
    results = simdist.run(gather_body, world_size=2, faults=plan, timeout=TIMEOUT)
    assert results == [[1.0, 1.0, float("inf"), 2.0]] * 2


def composite_body(ctx: simdist.RankContext, axis: str) -> None:
    dist.all_reduce(torch.ones(1), group=ctx.groups[axis])


@pytest.mark.parametrize(
    "layout, axis, group_text",
    [
        (Layout(cp=2, dp=2), "dp_cp", "dp_cp [0, 1, 2, 3]"),
        (Layout(tp=2, dp=2), "dp_cp", "dp/dp_cp [1, 3]"),  # cp=1: the dp group is also dp_cp
        (Layout(tp=2, dp=2), "world", "world [0, 1, 2, 3]"),
    ],
)
def test_fault_group_may_name_a_composite_axis(layout: Layout, axis: str, group_text: str) -> None:
    victim = layout.world_size - 1
    with pytest.raises(simdist.RankError) as info:
        simdist.run(
            composite_body,
            layout=layout,
            faults=FaultPlan.crash(rank=victim, group=axis),
            timeout=TIMEOUT,
            args=(axis,),
        )
    assert sorted(info.value.failures) == [victim]
    assert f"all_reduce on {group_text} seq 0" in str(info.value.__cause__)


# --- delay ---------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", AXES)
def test_delay_on_each_axis_changes_no_result(axis: str) -> None:
    clean = simdist.run(axes_body, layout=FULL, timeout=TIMEOUT, args=(2,))
    delayed = simdist.run(
        axes_body,
        layout=FULL,
        timeout=TIMEOUT,
        args=(2,),
        faults=FaultPlan.delay(rank=VICTIM_COORDS, seconds=0.05, group=axis, nth=1),
    )
    assert results_bitwise_equal(delayed, clean)


# --- plans -----------------------------------------------------------------------------


def test_plans_add_up_and_every_fault_fires() -> None:
    a = FaultPlan.corrupt(rank=0, mode="sign", group="tp", nth=1)
    b = FaultPlan.corrupt(rank=3, mode="inf", group="dp", nth=2)
    assert (a + b).faults == a.faults + b.faults
    assert not FaultPlan() and (a + b)
    with pytest.raises(TypeError):
        a + 1  # type: ignore[operator]
    layout = Layout(tp=2, dp=2)
    results = simdist.run(axes_body, layout=layout, faults=a + b, timeout=TIMEOUT, args=(2,))
    # Rank 0's first tp contribution flipped sign; rank 3's second dp one became inf.
    tp_sum = -contribution(0, 0, "tp")[0] + contribution(1, 0, "tp")[0]
    assert results[0]["0/tp"][0].item() == tp_sum == results[1]["0/tp"][0].item()
    assert results[1]["1/dp"][0].item() == float("inf") == results[3]["1/dp"][0].item()
    assert results[0]["1/dp"].tolist() == expected_sum(layout, 0, 1, "dp")


def test_invalid_faults_are_refused() -> None:
    for make in (
        lambda: FaultPlan.crash(rank=-1),
        lambda: FaultPlan.crash(rank=0, group="ep"),
        lambda: FaultPlan.crash(rank=0, nth=0),
        lambda: FaultPlan.crash(rank=0, seq=-1),
        lambda: FaultPlan.crash(rank={"ep": 1}),
        lambda: FaultPlan.corrupt(rank=0, mode="zero"),
        lambda: FaultPlan.delay(rank=0, seconds=-1.0),
    ):
        with pytest.raises(ValueError):
            make()


def test_coordinates_in_a_flat_world_are_refused() -> None:
    with pytest.raises(ValueError, match="no layout"):
        simdist.run(p2p_body, world_size=2, faults=FaultPlan.crash(rank={"dp": 1}), timeout=TIMEOUT)


@pytest.mark.parametrize(
    "plan, world",
    [
        (FaultPlan.crash(rank=5), {"world_size": 2}),
        (FaultPlan.crash(rank={"dp": 3}), {"layout": Layout(dp=2)}),
        (FaultPlan.crash(rank=0, group="tp"), {"world_size": 2}),
    ],
    ids=["rank", "coordinate", "axis"],
)
def test_faults_outside_the_world_are_refused(plan: FaultPlan, world: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        simdist.run(p2p_body, faults=plan, timeout=TIMEOUT, **world)


def test_random_plans_are_deterministic_per_seed() -> None:
    plans = [FaultPlan.random(seed, FULL, count=4) for seed in range(8)]
    assert plans == [FaultPlan.random(seed, FULL, count=4) for seed in range(8)]
    assert len(set(plans)) > 1
    for plan in plans:
        assert len(plan.faults) == 4
        assert all(0 <= f.rank < FULL.world_size and f.op == "all_reduce" for f in plan.faults)
    only = FaultPlan.random(3, 4, count=6, kinds=("delay", "corrupt"))
    assert {f.kind for f in only.faults} <= {"delay", "corrupt"}


def test_random_plan_runs_reproduce_bitwise() -> None:
    layout = Layout(tp=2, dp=2)
    plan = FaultPlan.random(11, layout, count=3, kinds=("corrupt", "delay"))
    first = simdist.run(axes_body, layout=layout, faults=plan, timeout=TIMEOUT, args=(3,))
    second = simdist.run(axes_body, layout=layout, faults=plan, timeout=TIMEOUT, args=(3,))
    assert results_bitwise_equal(first, second)
    assert any(f.kind == "corrupt" for f in plan.faults)
    clean = simdist.run(axes_body, layout=layout, timeout=TIMEOUT, args=(3,))
    assert not results_bitwise_equal(first, clean), "the drawn corruption must have fired"
    crash = FaultPlan.random(
        5, layout, count=1, kinds=("crash",)
    )  # one: which of two crashes first is a race
    errors = []
    for _ in range(2):
        with pytest.raises(simdist.RankError) as info:
            simdist.run(axes_body, layout=layout, faults=crash, timeout=TIMEOUT, args=(3,))
        errors.append(str(info.value.__cause__))
    assert errors[0] == errors[1]


# --- retry -----------------------------------------------------------------------------


def train_step_body(ctx: simdist.RankContext) -> dict[str, Any]:
    """One data-parallel SGD step of a linear model; the grad all_reduce's order
    follows the run's reduction model and seed."""
    gen = torch.Generator().manual_seed(1234)
    weight = torch.randn(4, 3, generator=gen).requires_grad_()
    data = torch.Generator().manual_seed(100 + ctx.coords.dp)
    x, y = torch.randn(8, 4, generator=data), torch.randn(8, 3, generator=data)
    ((x @ weight - y) ** 2).mean().backward()
    grad = weight.grad
    assert grad is not None
    dist.all_reduce(grad, group=ctx.groups.dp)
    with torch.no_grad():
        weight -= 0.1 * grad / ctx.layout.dp
    return {"weight": weight.detach(), "attempt": ctx.attempt}


def test_retry_after_abort_equals_a_clean_run_bitwise() -> None:
    kwargs = dict(layout=Layout(dp=4), reduction="shuffled", seed=7, timeout=TIMEOUT)
    clean = simdist.run(train_step_body, **kwargs)
    outcome = simdist.run_with_retry(
        train_step_body, faults=FaultPlan.abort(rank=2, group="dp", nth=1), retries=1, **kwargs
    )
    assert outcome.attempts == 2
    assert len(outcome.errors) == 1 and isinstance(outcome.errors[0], simdist.RankError)
    assert isinstance(outcome.errors[0].__cause__, BackendError)
    assert [r["attempt"] for r in clean] == [0] * 4
    assert [r["attempt"] for r in outcome.results] == [1] * 4
    for got, want in zip(outcome.results, clean):
        assert bitwise_equal(got["weight"], want["weight"])


def test_retry_without_failure_runs_once() -> None:
    outcome = simdist.run_with_retry(train_step_body, layout=Layout(dp=2), timeout=TIMEOUT, retries=3)
    assert outcome.attempts == 1 and outcome.errors == []
    assert [r["attempt"] for r in outcome.results] == [0, 0]


def test_retry_raises_the_last_error_when_every_attempt_fails() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run_with_retry(
            train_step_body,
            layout=Layout(dp=2),
            timeout=TIMEOUT,
            retries=2,
            faults=FaultPlan.crash(rank=0),
            retry_faults=FaultPlan.crash(rank=1),
        )
    assert sorted(info.value.failures) == [1]
    with pytest.raises(simdist.RankError):
        simdist.run_with_retry(
            train_step_body, layout=Layout(dp=2), timeout=TIMEOUT, retries=0, faults=FaultPlan.crash(rank=0)
        )
    with pytest.raises(ValueError, match="retries"):
        simdist.run_with_retry(train_step_body, layout=Layout(dp=2), retries=-1)


# --- who failed on its own ---------------------------------------------------------------


def crash_after_peer_failed_body(ctx: simdist.RankContext, signal: Any) -> None:
    if ctx.rank == 0:
        signal.set()
        raise KeyError("rank 0 fails first")
    signal.wait(TIMEOUT)
    time.sleep(0.5)  # let rank 0's failure abort the world first
    dist.barrier()  # rank 1's own injected crash fires here, before any wait


def test_an_injected_crash_after_a_peer_failed_is_still_a_failure() -> None:
    # Rank 1 never waited on anything: its own injected crash is a failure, not a release.
    with pytest.raises(simdist.RankError) as info:
        simdist.run(
            crash_after_peer_failed_body,
            world_size=2,
            faults=FaultPlan.crash(rank=1),
            timeout=TIMEOUT,
            args=(threading.Event(),),
            share_args=True,
        )
    assert sorted(info.value.failures) == [0, 1]
    assert isinstance(info.value.failures[1], simdist.InjectedFault)
    assert info.value.released == ()
