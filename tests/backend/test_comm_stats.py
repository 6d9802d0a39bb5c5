"""simdist.CommStats: calls and bytes per rank, group and op; tables and budgets.

Expected counts are written out by hand from the bodies (so many calls of so
many float32 elements), never read back from the code under test.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import CommCount, CommStats, Layout

LAYOUT = Layout(tp=2, dp=2)  # ranks 0..3; tp pairs (0,1) (2,3), dp pairs (0,2) (1,3)


def body(ctx: simdist.RankContext) -> None:
    t = torch.ones(3)  # 12 bytes
    dist.all_reduce(t, group=ctx.groups.tp)
    dist.all_reduce(t, group=ctx.groups.tp)
    out = [torch.empty(5, dtype=torch.float64) for _ in range(2)]  # 2 x 40 bytes out
    dist.all_gather(out, torch.zeros(5, dtype=torch.float64), group=ctx.groups.dp)  # + 40 in
    if ctx.rank == 0:
        dist.send(torch.zeros(4), dst=1)  # 16 bytes
    elif ctx.rank == 1:
        dist.recv(torch.zeros(4), src=0)


def test_counts_calls_and_bytes_per_rank_group_and_op() -> None:
    with CommStats() as stats:
        simdist.run(body, layout=LAYOUT)
    assert stats.runs == 1
    for rank in range(4):
        assert stats.count(rank=rank, group="tp", op="all_reduce") == CommCount(2, 24)
        assert stats.count(rank=rank, group="dp", op="all_gather") == CommCount(1, 120)
    assert stats.count(op="send") == CommCount(1, 16)
    assert stats.count(op="recv") == CommCount(1, 16)
    assert stats.count(rank=2, op="send") == CommCount()
    assert stats.per_rank(group="tp") == {r: CommCount(2, 24) for r in range(4)}
    assert stats.count() == CommCount(4 * 3 + 2, 4 * (24 + 120) + 32)
    # Axes with the same members share a communicator (dp/dp_cp, tp/mp here); any name selects it.
    assert stats.count(group="dp_cp") == stats.count(group="dp")
    assert stats.count(group="mp") == stats.count(group="tp")
    assert stats.count(group="pp") == CommCount()


def test_table_lists_each_rank_group_and_op() -> None:
    with CommStats() as stats:
        simdist.run(body, layout=LAYOUT)
    lines = stats.table().splitlines()
    assert lines[0].split() == ["rank", "group", "op", "calls", "bytes"]
    rows = [line.split() for line in lines[2:]]
    assert ["0", "tp/mp", "all_reduce", "2", "24"] in rows
    assert ["3", "dp/dp_cp", "all_gather", "1", "120"] in rows
    assert ["0", "world", "send", "1", "16"] in rows
    assert len(rows) == 4 * 2 + 2
    assert str(stats) == stats.table()


def test_budget_passes_at_the_limit_and_names_the_rank_above_it() -> None:
    with CommStats() as stats:
        simdist.run(body, layout=LAYOUT)
    stats.assert_at_most({"tp:all_reduce": 2, "dp": 1, "*:send": 1, "*": 4}, bytes={"tp": 24})
    with pytest.raises(AssertionError, match=r"rank 0: 2 calls on 'tp', budget 1") as info:
        stats.assert_at_most({"tp": 1})
    assert "rank 3: 2 calls on 'tp', budget 1" in str(info.value)
    assert "rank  group" in str(info.value)  # the table comes with it
    with pytest.raises(AssertionError, match=r"rank 1: 120 bytes on 'dp:all_gather', budget 119"):
        stats.assert_at_most(bytes={"dp:all_gather": 119})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs a calls budget"),
        ({"calls": {"tp": -1}}, r"calls limit for 'tp' must be an int >= 0, got -1"),
        ({"calls": {"tp": 1.5}}, r"must be an int >= 0, got 1.5"),
        ({"bytes": {"": 3}}, "a budget key must be"),
    ],
)
def test_bad_budgets_are_refused(kwargs: dict, message: str) -> None:
    with CommStats() as stats:
        simdist.run(body, layout=LAYOUT)
    with pytest.raises(ValueError, match=message):
        stats.assert_at_most(**kwargs)


def flat(ctx: simdist.RankContext) -> None:
    dist.all_reduce(torch.ones(1), group=ctx.groups.world)


def test_only_runs_inside_the_block_of_this_thread_count() -> None:
    simdist.run(body, layout=LAYOUT)  # before: not counted
    other: list[CommStats] = []

    def elsewhere() -> None:  # a run in another thread while the block is open
        simdist.run(body, layout=LAYOUT)

    with CommStats() as outer:
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        simdist.run(flat, world_size=2)
        with CommStats() as inner:
            simdist.run(body, layout=LAYOUT)
        other.append(inner)
    simdist.run(body, layout=LAYOUT)  # after: not counted
    assert outer.runs == 2 and other[0].runs == 1
    assert other[0].count(group="tp") == CommCount(8, 96)
    assert other[0].count(group="world", op="all_reduce") == CommCount()
    assert outer.count(group="tp") == CommCount(8, 96)
    assert outer.count(group="world", op="all_reduce") == CommCount(2, 8)


def test_a_failed_run_still_counts_the_calls_made_before_the_failure() -> None:
    def failing(ctx: simdist.RankContext) -> None:
        dist.all_reduce(torch.ones(2), group=ctx.groups.tp)
        dist.barrier()  # every tp call has completed before rank 1 fails
        if ctx.rank == 1:
            raise RuntimeError("boom")
        dist.all_reduce(torch.ones(2), group=ctx.groups.dp)

    with CommStats() as stats:
        with pytest.raises(simdist.RankError):
            simdist.run(failing, layout=LAYOUT)
    assert stats.count(group="tp") == CommCount(4, 32)
    assert stats.count(op="barrier").calls == 4


def test_same_as_shows_the_difference() -> None:
    def fewer(ctx: simdist.RankContext) -> None:
        dist.all_reduce(torch.ones(3), group=ctx.groups.tp)

    with CommStats() as a:
        simdist.run(body, layout=LAYOUT)
    with CommStats() as b:
        simdist.run(body, layout=LAYOUT)
    with CommStats() as c:
        simdist.run(fewer, layout=LAYOUT)
    a.assert_same_as(b)
    c.assert_same_as(a, group="tp", op="barrier")  # nothing selected on either side
    with pytest.raises(
        AssertionError, match=r"rank 0 tp/mp all_reduce: 2 calls / 24 B here, 1 calls / 12 B there"
    ):
        a.assert_same_as(c)


def test_a_block_cannot_be_entered_twice() -> None:
    stats = CommStats()
    with stats:
        with pytest.raises(RuntimeError, match="already active"):
            stats.__enter__()
    with stats:  # but reused after it was left
        pass
