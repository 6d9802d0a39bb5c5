"""Flight recorder (the tail of each rank's calls, quoted in every error) and the
Chrome/Perfetto trace written by ``run(..., trace=path)``."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import FaultPlan, Layout

TIMEOUT = 60.0
THIS_FILE = "test_trace.py"
TAIL = "last calls per rank (flight recorder):"


def line_of(fn: Callable[..., Any], needle: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if needle in text)


def tail_of(message: str, rank: int) -> list[str]:
    """The flight-recorder lines of ``rank`` in an error message."""
    tail = message.split(TAIL, 1)[1].splitlines()
    start = tail.index(f"  rank {rank}:")
    out = []
    for line in tail[start + 1 :]:
        if not line.startswith("    "):
            break
        out.append(line.strip())
    return out


# --- flight recorder in errors -------------------------------------------------------------


def steps_then_early_return_body(ctx: simdist.RankContext, steps: int) -> None:
    t = torch.ones(2, 3, dtype=torch.float64)
    for _ in range(steps):
        dist.all_reduce(t)  # every step
    if ctx.rank == 0:
        dist.all_reduce(t)  # rank 0 only


def test_deadlock_quotes_each_ranks_recent_calls() -> None:
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(steps_then_early_return_body, world_size=2, timeout=TIMEOUT, args=(3,))
    message = str(info.value)
    step_site = f"{THIS_FILE}:{line_of(steps_then_early_return_body, 'every step')}"
    last_site = f"{THIS_FILE}:{line_of(steps_then_early_return_body, 'rank 0 only')}"
    rank0, rank1 = tail_of(message, 0), tail_of(message, 1)
    assert len(rank0) == 4 and len(rank1) == 3
    pattern = r"all_reduce on world \[0, 1\] seq {seq} shapes \[\[2, 3\]\] float64 48 B at (\S*/)?{site}: {state} \(t="
    for seq in range(3):
        for line in (rank0[seq], rank1[seq]):
            assert re.match(pattern.format(seq=seq, site=re.escape(step_site), state="completed"), line), line
    assert re.match(pattern.format(seq=3, site=re.escape(last_site), state="started"), rank0[3]), rank0[3]


def test_flight_records_bounds_what_is_kept() -> None:
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(steps_then_early_return_body, world_size=2, timeout=TIMEOUT, args=(5,), flight_records=2)
    rank0 = tail_of(str(info.value), 0)
    assert [re.search(r"seq (\d+)", line).group(1) for line in rank0] == ["4", "5"]  # type: ignore[union-attr]
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="flight_records"):
            simdist.run(steps_then_early_return_body, world_size=2, args=(1,), flight_records=bad)


def p2p_then_crash_body(ctx: simdist.RankContext) -> None:
    t = torch.zeros(4, dtype=torch.int32)
    if ctx.rank == 0:
        dist.send(t, dst=1)
    else:
        dist.recv(t, src=0)
    dist.barrier()


def test_rank_error_quotes_the_recorder_too() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(
            p2p_then_crash_body, world_size=2, faults=FaultPlan.crash(rank=1, op="barrier"), timeout=TIMEOUT
        )
    message = str(info.value)
    assert tail_of(message, 0)[0].startswith("send on world [0, 1] shapes [[4]] int32 16 B at ")
    assert tail_of(message, 1)[0].startswith("recv on world [0, 1] shapes [[4]] int32 16 B at ")
    assert "completed" in tail_of(message, 1)[0]
    assert tail_of(message, 1)[1].startswith("barrier on world [0, 1] seq 0")


def barrier_then_spin_body(ctx: simdist.RankContext) -> None:
    dist.barrier()
    if ctx.rank == 1:
        while True:
            pass


def test_watchdog_timeout_quotes_the_recorder() -> None:
    with pytest.raises(simdist.SimulationTimeout) as info:
        simdist.run(barrier_then_spin_body, world_size=2, timeout=1.0)
    message = str(info.value)
    assert "rank 1 (rank 1 of 2):" in message
    assert f"{THIS_FILE}:{line_of(barrier_then_spin_body, 'while True')} in barrier_then_spin_body" in message
    for rank in (0, 1):
        assert "barrier on world [0, 1] seq 0" in tail_of(message, rank)[0]
        assert ": completed" in tail_of(message, rank)[0]


# --- Chrome trace ----------------------------------------------------------------------------

PIPE = Layout(tp=2, dp=2, pp=2)
TP_STEPS = 3


def step_body(ctx: simdist.RankContext) -> None:
    x = torch.ones(5)
    for _ in range(TP_STEPS):
        dist.all_reduce(x, group=ctx.groups.tp)
    dist.broadcast(x, group=ctx.groups.dp, group_src=0)
    act = torch.zeros(2, 2)
    if ctx.coords.pp == 0:
        dist.send(act, group=ctx.groups.pp, group_dst=1)
    else:
        dist.recv(act, group=ctx.groups.pp, group_src=0)


def load_trace(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(meta) + len(slices) == len(events)
    return meta, slices


def group_members(category: str) -> list[int]:
    return json.loads(category.split(" ", 1)[1])


def test_trace_has_one_track_per_rank_and_one_slice_per_call(tmp_path: Path) -> None:
    path = tmp_path / "step.json"
    simdist.run(step_body, layout=PIPE, timeout=TIMEOUT, trace=path)  # a PathLike is accepted
    meta, slices = load_trace(path)
    names = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert names == {
        r: f"rank {r} (tp={c.tp} cp={c.cp} dp={c.dp} pp={c.pp})"
        for r, c in ((r, PIPE.coords(r)) for r in range(PIPE.world_size))
    }
    colour: dict[str, str] = {}
    for rank in range(PIPE.world_size):
        mine = sorted((e for e in slices if e["tid"] == rank), key=lambda e: e["ts"])
        kinds = [(e["name"], e["cat"].split(" ")[0]) for e in mine]
        p2p = "send" if PIPE.coords(rank).pp == 0 else "recv"
        assert kinds == [("all_reduce", "tp")] * TP_STEPS + [("broadcast", "dp/dp_cp"), (p2p, "pp")], kinds
        assert [e["args"]["seq"] for e in mine] == list(range(TP_STEPS)) + [0, -1]
        for event in mine:
            assert rank in group_members(event["cat"])
            assert event["args"]["group"] == event["cat"]
            assert event["args"]["state"] == "completed"
            assert event["ts"] >= 0 and event["dur"] > 0
            assert colour.setdefault(event["cat"], event["cname"]) == event["cname"], "one colour per group"
        assert mine[0]["args"]["shapes"] == [[5]] and mine[0]["args"]["bytes"] == 20
        assert mine[-1]["args"]["shapes"] == [[2, 2]] and mine[-1]["args"]["dtypes"] == ["float32"]
        assert mine[0]["args"]["site"].endswith(f"{THIS_FILE}:{line_of(step_body, 'group=ctx.groups.tp')}")


def test_trace_is_written_when_the_run_fails(tmp_path: Path) -> None:
    path = tmp_path / "deadlock.json"
    with pytest.raises(simdist.DeadlockError):
        simdist.run(steps_then_early_return_body, world_size=2, timeout=TIMEOUT, args=(1,), trace=str(path))
    _, slices = load_trace(path)
    states = sorted((e["tid"], e["args"]["seq"], e["args"]["state"]) for e in slices)
    assert states == [(0, 0, "completed"), (0, 1, "started"), (1, 0, "completed")]
