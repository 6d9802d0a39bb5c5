"""Faults always act, and act the same way every run.

``corrupt`` damages what a strided tensor sends; a typo in a fault is refused
before the run; a seeded random plan gives the same failed and released ranks
(and the same error) on every run, whatever the thread timing; a long
``delay`` ends when the watchdog fires instead of outliving ``run``.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import Fault, FaultPlan, Layout

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning"),
    pytest.mark.usefixtures("clean_world"),
]

TIMEOUT = 30.0
TP_DP = Layout(tp=2, dp=2)


# --- corrupt on strided tensors -----------------------------------------------------------


def strided_body(ctx: simdist.RankContext) -> dict[str, Any]:
    # all_reduce takes a non-contiguous tensor only when it is dense in its own
    # memory format (channels-last); all_gather takes any view as its input.
    base = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 2, 1, 2) * (ctx.rank + 1)
    reduced = base.to(memory_format=torch.channels_last)  # not contiguous
    dist.all_reduce(reduced)
    mine = (torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * (ctx.rank + 1)).t()
    slots = [torch.zeros(2, 2) for _ in range(ctx.world_size)]
    dist.all_gather(slots, mine)
    return {
        "reduced": reduced.reshape(2, 2).tolist(),
        "gathered": [s.tolist() for s in slots],
        "mine": mine.tolist(),
    }


@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
def test_corrupt_reaches_the_wire_from_a_non_contiguous_tensor(op: str) -> None:
    results = simdist.run(
        strided_body, world_size=2, timeout=TIMEOUT, faults=FaultPlan.corrupt(rank=0, mode="nan", op=op)
    )
    for out in results:
        got = out["reduced"] if op == "all_reduce" else out["gathered"][0]
        # Element [0, 0] of rank 0's contribution is NaN; nothing else is.
        assert math.isnan(got[0][0])
        assert not any(math.isnan(v) for row in got for v in row[1:])
        assert not any(math.isnan(v) for row in got[1:] for v in row)
    # all_gather sends a damaged copy: the caller's own input stays intact.
    assert results[0]["mine"] == [[1.0, 3.0], [2.0, 4.0]]


# --- typos are refused up front -------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, valid",
    [
        ({"op": "allreduce"}, "'all_reduce'"),
        ({"group": "tensor"}, "'tp'"),
        ({"mode": "zero"}, "'bitflip'"),
        ({"kind": "hang"}, "'delay'"),
    ],
    ids=["op", "axis", "mode", "kind"],
)
def test_unknown_fault_names_are_refused_with_the_valid_list(kwargs: dict[str, str], valid: str) -> None:
    fields = {"kind": "corrupt", "rank": 0, **kwargs}
    with pytest.raises(ValueError) as info:
        Fault(**fields)  # type: ignore[arg-type]
    name = next(iter(kwargs.values()))
    assert repr(name) in str(info.value) and valid in str(info.value)
    with pytest.raises(ValueError, match="allreduce"):
        FaultPlan.random(1, TP_DP, ops=("allreduce",))


def test_a_corruption_that_could_never_act_is_refused() -> None:
    with pytest.raises(ValueError, match="'recv' sends none"):
        FaultPlan.corrupt(rank=0, op="recv")
    with pytest.raises(ValueError, match="'barrier' sends none"):
        FaultPlan.corrupt(rank=0, op="barrier")


# --- seeded plans reproduce ---------------------------------------------------------------


def tp_dp_loop(ctx: simdist.RankContext) -> list[list[float]]:
    out = []
    for step in range(3):
        t = torch.tensor([float(ctx.rank + step), 1.0])
        dist.all_reduce(t, group=ctx.groups.tp)
        dist.all_reduce(t, group=ctx.groups.dp)
        out.append(t.tolist())
    return out


def outcome(plan: FaultPlan) -> tuple[Any, ...]:
    """Everything a run reports, without the flight recorder's timings."""
    try:
        results = simdist.run(tp_dp_loop, layout=TP_DP, faults=plan, timeout=TIMEOUT)
    except simdist.RankError as err:
        head = str(err).split("last calls per rank")[0]
        return (
            "RankError",
            sorted(err.failures),
            err.released,
            type(err.__cause__).__name__,
            str(err.__cause__),
            head,
        )
    except simdist.SimulationError as err:
        return (type(err).__name__, str(err).split("last calls per rank")[0])
    return ("ok", repr(results))


def test_an_abort_reports_the_same_ranks_every_run() -> None:
    # Rank 2 aborts tp [2, 3] at its 2nd tp call: rank 2 failed; rank 3's tp call
    # fails because of it, ranks 0 and 1 then wait on dp peers that are gone.
    plan = FaultPlan.abort(rank=2, op="all_reduce", group="tp", nth=2)
    for _ in range(10):
        kind, failed, released, cause, *_ = outcome(plan)
        assert (kind, failed, released, cause) == ("RankError", [2], (0, 1, 3), "DistBackendError")


def test_random_plans_give_the_same_outcome_on_every_run() -> None:
    kinds = ("crash", "timeout", "abort", "corrupt")  # delay only slows the loop down
    seen = set()
    for seed in range(120):
        plan = FaultPlan.random(seed, TP_DP, count=2, kinds=kinds)
        first, second = outcome(plan), outcome(plan)
        assert first == second, f"seed {seed} ({plan}) reported differently"
        seen.add(first[0])
    assert {"ok", "RankError"} <= seen


# --- a long delay ends with the run ----------------------------------------------------------


def test_a_long_delay_is_cut_short_by_the_watchdog() -> None:
    before = set(threading.enumerate())
    with pytest.raises(simdist.SimulationTimeout, match="still running"):
        simdist.run(
            tp_dp_loop,
            layout=TP_DP,
            timeout=0.5,
            faults=FaultPlan.delay(rank=0, seconds=60.0, op="all_reduce"),
        )
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == [], f"a delayed rank outlived run(): {left}"
    assert simdist.run(tp_dp_loop, layout=TP_DP, timeout=TIMEOUT)[0] == [[6.0, 4.0], [10.0, 4.0], [14.0, 4.0]]
