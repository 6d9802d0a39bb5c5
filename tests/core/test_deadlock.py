"""Exact deadlock detection: a program that can never finish raises
``DeadlockError`` (never a watchdog timeout: every run here has a generous
``timeout=``), with every rank's state, pending call, group, sequence number,
coordinates and the user's own stack; programs that only look slow do not.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import Layout

TIMEOUT = 60.0
THIS_FILE = "test_deadlock.py"
PIPE = Layout(tp=2, dp=2, pp=2)


def line_of(fn: Callable[..., Any], needle: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if needle in text)


def site(fn: Callable[..., Any], needle: str) -> str:
    return f"{THIS_FILE}:{line_of(fn, needle)} in {fn.__name__}"


def coords_text(layout: Layout, rank: int) -> str:
    c = layout.coords(rank)
    return f"tp={c.tp} cp={c.cp} dp={c.dp} pp={c.pp}"


def deadlock_message(body: Callable[..., Any], **run_kwargs: Any) -> str:
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(body, timeout=TIMEOUT, **run_kwargs)
    assert type(info.value) is simdist.DeadlockError
    return str(info.value)


def state_lines(message: str) -> dict[int, str]:
    """The report's one line per rank (``  rank R (...): state``)."""
    found: dict[int, str] = {}
    for line in message.split("last calls per rank")[0].splitlines():
        m = re.match(r"^  rank (\d+) \(", line)
        if m:
            assert int(m.group(1)) not in found, f"rank listed twice:\n{message}"
            found[int(m.group(1))] = line
    return found


def stack_under(message: str, rank: int) -> list[str]:
    """The stack lines printed under ``rank``'s state line, file names without
    their directory (reports are relative to the working directory)."""
    lines = message.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  rank {rank} ("))
    out = []
    for line in lines[start + 1 :]:
        if not line.startswith("      "):
            break
        out.append(line.strip().rsplit("/", 1)[-1])
    return out


def at_site(text: str, fn: Callable[..., Any], needle: str) -> str:
    """A regex for ``text at [dir/]file:line``."""
    return re.escape(text) + r" at (\S*/)?" + re.escape(f"{THIS_FILE}:{line_of(fn, needle)}")


# --- the pipeline stage that skips a collective -------------------------------------


def clip_grad_norm(grad: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    norm_sq = grad.pow(2).sum()
    dist.all_reduce(norm_sq, group=group)  # norm all_reduce
    return norm_sq


def pp_skip_body(ctx: simdist.RankContext) -> None:
    grad = torch.ones(4) * ctx.rank
    for _ in range(2):  # two steps on which every stage takes part
        clip_grad_norm(grad, ctx.groups.pp)
    if ctx.coords.pp == ctx.layout.pp - 1:
        clip_grad_norm(grad, ctx.groups.pp)  # only the last stage


def test_pp_stage_skipping_a_collective() -> None:
    message = deadlock_message(pp_skip_body, layout=PIPE)
    assert "wait on a peer that has already finished or failed" in message
    states = state_lines(message)
    assert sorted(states) == list(range(PIPE.world_size)), "every rank's state is listed"
    for rank, line in states.items():
        assert f"rank {rank} ({coords_text(PIPE, rank)})" in line
    # The report is a snapshot taken the moment the deadlock became certain:
    # the ranks it names as stuck are exact, the others may still be moving.
    stuck = [
        int(r) for r in re.search(r"rank\(s\) \[([\d, ]+)\] wait on a peer", message).group(1).split(", ")
    ]
    for rank in stuck:
        assert PIPE.coords(rank).pp == 1
        peer = PIPE.group_of("pp", rank)[0]
        assert states[peer].endswith(": finished")
        assert states[rank].endswith(
            f"waiting in all_reduce on pp {PIPE.group_of('pp', rank)} seq 2; still missing rank(s) [{peer}]"
        )
        # The user's frames, outermost first, and none of simdist's or torch's.
        assert stack_under(message, rank) == [
            site(pp_skip_body, "only the last stage"),
            site(clip_grad_norm, "norm all_reduce"),
        ]


# --- point to point -----------------------------------------------------------------------


def pp_send_body(ctx: simdist.RankContext) -> None:
    if ctx.rank == 3:
        dist.send(torch.ones(2), group=ctx.groups.pp, group_dst=1)  # lonely send


def test_send_without_recv_on_a_pp_group() -> None:
    message = deadlock_message(pp_send_body, layout=PIPE)
    states = state_lines(message)
    assert states[3] == (
        f"  rank 3 ({coords_text(PIPE, 3)}): waiting in send to rank 7 (tag 0) on pp [3, 7]; still missing rank(s) [7]"
    )
    assert states[7].endswith(": finished")
    assert stack_under(message, 3) == [site(pp_send_body, "lonely send")]
    assert re.search(
        at_site("rank 3: send to rank 7 (tag 0) on pp [3, 7]", pp_send_body, "lonely send"), message
    )


def microbatch_body(ctx: simdist.RankContext, sends: int, recvs: int) -> None:
    act = torch.zeros(3)
    if ctx.coords.pp == 0:
        for _ in range(sends):
            dist.send(torch.ones(3), group=ctx.groups.pp, group_dst=1)
    else:
        for _ in range(recvs):
            dist.recv(act, group=ctx.groups.pp, group_src=0)  # stage 1 recv


def test_pipeline_microbatch_count_mismatch() -> None:
    layout = Layout(pp=2)
    assert simdist.run(microbatch_body, layout=layout, timeout=TIMEOUT, args=(3, 3)) == [None, None]
    message = deadlock_message(microbatch_body, layout=layout, args=(2, 3))
    assert "rank 1 (tp=0 cp=0 dp=0 pp=1): waiting in recv from rank 0 (tag 0) on pp" in message
    assert stack_under(message, 1) == [site(microbatch_body, "stage 1 recv")]
    # The flight recorder shows the two receives that did complete.
    assert message.count("recv on pp") == 3 and message.count(": completed") >= 4


def tag_body(ctx: simdist.RankContext) -> None:
    if ctx.rank == 0:
        dist.send(torch.ones(1), dst=1, tag=1)
    else:
        dist.recv(torch.zeros(1), src=0, tag=2)


def test_tags_that_never_match() -> None:
    message = deadlock_message(tag_body, world_size=2)
    assert "every live rank is waiting and no pending call can complete" in message
    assert "waiting in send to rank 1 (tag 1)" in message
    assert "waiting in recv from rank 0 (tag 2)" in message


def send_first_ring_body(ctx: simdist.RankContext) -> None:
    # Legal with buffered sends, a deadlock with NCCL's rendezvous semantics.
    n = ctx.world_size
    dist.send(torch.ones(1), dst=(ctx.rank + 1) % n)
    dist.recv(torch.zeros(1), src=(ctx.rank - 1) % n)


def test_blocking_send_ring_deadlocks() -> None:
    message = deadlock_message(send_first_ring_body, world_size=3)
    states = state_lines(message)
    for rank in range(3):
        assert f"waiting in send to rank {(rank + 1) % 3}" in states[rank]


def isend_never_waited_body(ctx: simdist.RankContext) -> None:
    if ctx.rank == 0:
        dist.isend(torch.ones(2), dst=1)  # never waited, never received


def irecv_never_waited_body(ctx: simdist.RankContext) -> None:
    if ctx.rank == 1:
        dist.irecv(torch.zeros(2), src=0)  # never waited, never sent


@pytest.mark.parametrize(
    "body, expected",
    [
        (isend_never_waited_body, "rank 0: send to rank 1 (tag 0) on world [0, 1]"),
        (irecv_never_waited_body, "rank 1: recv from rank 0 (tag 0) on world [0, 1]"),
    ],
)
def test_async_p2p_never_matched_is_reported_when_ranks_return(
    body: Callable[..., Any], expected: str
) -> None:
    message = deadlock_message(body, world_size=2)
    assert "every rank returned, but calls that were issued but never completed" in message
    assert re.search(at_site(expected, body, "never waited"), message)


def async_collective_alone_body(ctx: simdist.RankContext) -> None:
    if ctx.rank == 0:
        dist.all_reduce(torch.ones(1), async_op=True)


def test_async_collective_joined_by_one_rank_only() -> None:
    message = deadlock_message(async_collective_alone_body, world_size=2)
    assert "all_reduce on world [0, 1] seq 0: joined by group ranks [0]" in message


def batch_both_send_body(ctx: simdist.RankContext) -> None:
    ops = [dist.P2POp(dist.isend, torch.ones(2), 1 - ctx.rank)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def batch_size_mismatch_body(ctx: simdist.RankContext) -> None:
    peer = 1 - ctx.rank
    ops = [
        dist.P2POp(dist.isend, torch.ones(2 + ctx.rank), peer),
        dist.P2POp(dist.irecv, torch.zeros(2 + ctx.rank), peer),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def test_batch_isend_irecv_with_no_receives_deadlocks() -> None:
    message = deadlock_message(batch_both_send_body, world_size=2)
    assert "every live rank is waiting" in message
    assert "rank 0: send to rank 1 (tag 0)" in message and "rank 1: send to rank 0 (tag 0)" in message


def test_batch_isend_irecv_size_mismatch() -> None:
    with pytest.raises(
        simdist.CollectiveMismatchError, match=r"send/recv mismatch between rank \d and rank \d"
    ):
        simdist.run(batch_size_mismatch_body, world_size=2, timeout=TIMEOUT)


# --- collectives on different groups ------------------------------------------------------


def cycle_body(ctx: simdist.RankContext) -> None:
    t = torch.ones(1)
    first, second = (ctx.groups.dp, ctx.groups.tp) if ctx.coords.tp == 0 else (ctx.groups.tp, ctx.groups.dp)
    dist.all_reduce(t, group=first)
    dist.all_reduce(t, group=second)
    # A world all_reduce whose order differs between ranks 0 and 1 closes a cycle.
    if ctx.rank == 0:
        dist.all_reduce(t)
        dist.all_reduce(t, group=ctx.groups.tp)
    elif ctx.rank == 1:
        dist.all_reduce(t, group=ctx.groups.tp)
        dist.all_reduce(t)
    else:
        dist.all_reduce(t)


def test_cycle_across_groups_with_sequence_numbers() -> None:
    layout = Layout(tp=2, dp=2)
    message = deadlock_message(cycle_body, layout=layout)
    states = state_lines(message)
    # Found as soon as ranks 0 and 1 close the cycle, whether or not ranks 2
    # and 3 have reached the world all_reduce yet.
    assert message.startswith("deadlock: ")
    assert "rank(s) [0, 1] wait for each other in a cycle: 0 -> 1 -> 0" in message
    assert "rank 2" not in message.splitlines()[0] and "rank 3" not in message.splitlines()[0]
    assert "waiting in all_reduce on world [0, 1, 2, 3] seq 0; still missing rank(s) [1" in states[0]
    assert "waiting in all_reduce on tp/mp [0, 1] seq 1; still missing rank(s) [0]" in states[1]
    for rank in (2, 3):
        assert (
            states[rank].endswith(": running")
            or "waiting in all_reduce on world [0, 1, 2, 3] seq 0" in states[rank]
        )


def early_return_while_others_work_body(ctx: simdist.RankContext, steps: int) -> int:
    if ctx.rank == 2:
        return 0
    t = torch.ones(1)
    for _ in range(steps):
        dist.all_reduce(t, group=ctx.groups.dp)
    return int(t.item())


def test_detected_while_other_groups_keep_working() -> None:
    # Ranks 1 and 3 (the other dp group) have plenty of work of their own; the
    # report must not wait for them, nor for the watchdog.
    message = deadlock_message(early_return_while_others_work_body, layout=Layout(tp=2, dp=2), args=(200,))
    assert "rank 2 (tp=0 cp=0 dp=1 pp=0): finished" in message
    assert "waiting in all_reduce on dp/dp_cp [0, 2] seq 0; still missing rank(s) [2]" in message


def raising_peer_body(ctx: simdist.RankContext) -> None:
    if ctx.rank == 1:
        raise KeyError("missing batch")
    dist.all_reduce(torch.ones(1))


def test_a_raising_peer_is_a_rank_error_not_a_deadlock() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(raising_peer_body, world_size=3, timeout=TIMEOUT)
    err = info.value
    assert type(err) is simdist.RankError
    assert isinstance(err.__cause__, KeyError)
    assert sorted(err.failures) == [1] and sorted(err.released) == [0, 2]


def swallowing_body(ctx: simdist.RankContext) -> str:
    try:
        if ctx.rank == 0:
            dist.all_reduce(torch.ones(1))
    except simdist.SimulationError:
        return "caught"
    return "returned"


def test_a_body_that_swallows_the_deadlock_still_fails_the_run() -> None:
    # The world is over once a deadlock is certain: catching the error in a
    # rank must not turn the run into a pass.
    message = deadlock_message(swallowing_body, world_size=2)
    assert "waiting in all_reduce on world [0, 1] seq 0; still missing rank(s) [1]" in message


# --- no false positives -------------------------------------------------------------------


def slow_rank_body(ctx: simdist.RankContext) -> float:
    t = torch.ones(1) * (ctx.rank + 1)
    if ctx.rank == 1:
        time.sleep(0.2)  # plain compute: not waiting on anything
    dist.all_reduce(t)
    return t.item()


def late_sender_body(ctx: simdist.RankContext) -> float:
    t = torch.zeros(1)
    if ctx.rank == 0:
        time.sleep(0.2)
        dist.send(torch.full((1,), 7.0), dst=1)
    else:
        dist.recv(t, src=0)
    return t.item()


def async_ring_body(ctx: simdist.RankContext) -> float:
    n = ctx.world_size
    got = torch.zeros(1)
    reqs = [
        dist.isend(torch.full((1,), float(ctx.rank)), dst=(ctx.rank + 1) % n),
        dist.irecv(got, src=(ctx.rank - 1) % n),
    ]
    pending = dist.all_reduce(torch.ones(1), async_op=True)
    for req in reqs:
        req.wait()
    pending.wait()
    return got.item()


def unneeded_rank_returns_body(ctx: simdist.RankContext) -> float:
    # Ranks 0 and 2 return at once; ranks 1 and 3 still complete their dp work.
    if ctx.coords.tp == 0:
        return 0.0
    t = torch.ones(1)
    if ctx.rank == 3:
        time.sleep(0.1)
    dist.all_reduce(t, group=ctx.groups.dp)
    return t.item()


def test_slow_programs_are_not_deadlocks() -> None:
    assert simdist.run(slow_rank_body, world_size=3, timeout=TIMEOUT) == [6.0, 6.0, 6.0]
    assert simdist.run(late_sender_body, world_size=2, timeout=TIMEOUT) == [0.0, 7.0]
    assert simdist.run(async_ring_body, world_size=4, timeout=TIMEOUT) == [3.0, 0.0, 1.0, 2.0]
    assert simdist.run(unneeded_rank_returns_body, layout=Layout(tp=2, dp=2), timeout=TIMEOUT) == [
        0.0,
        2.0,
        0.0,
        2.0,
    ]
