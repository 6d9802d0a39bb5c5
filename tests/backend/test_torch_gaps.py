"""The backend calls PyTorch's own distributed tests make, each as gloo answers it.

Backend names (``get_backend`` reports what the program asked for), torch's
``_find_or_create_pg_by_ranks_and_tag``, ``all_gather_coalesced``, sparse
``all_reduce``, ``recv`` without ``src``, ``monitored_barrier`` and waits with
an explicit timeout. The ``gloo``-marked tests run the same programs in a real
gloo world and compare; the others pin simdist's side with values measured on
gloo (torch 2.13) or computed independently (dense float64 sums).
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import simdist
from simdist import CollectiveMismatchError, DeadlockError

TIMEOUT = 60.0


def _caught(fn: Any) -> tuple[str, str]:
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


# -- the backend name ------------------------------------------------------------------


def names_body(ctx: Any) -> tuple[str, str, str, str, str]:
    gloo = dist.new_group([0, 1], backend="gloo")
    mixed = dist.new_group([0, 1], backend="cpu:gloo,cuda:nccl")
    return (
        dist.get_backend(gloo),
        gloo._get_backend_name(),
        str(c10d._world.pg_backend_config[gloo]),
        dist.get_backend(mixed),
        dist.get_backend(),
    )


def test_groups_report_the_backend_the_program_asked_for() -> None:
    # gloo reports ("gloo", "gloo", "cpu:gloo,cuda:gloo") for such a group;
    # simdist.run's own world stays "simdist".
    got = simdist.run(names_body, world_size=2, timeout=TIMEOUT)
    assert got == [("gloo", "gloo", "cpu:gloo,cuda:gloo", "cpu:gloo,cuda:nccl", "simdist")] * 2


def ddp_on_gloo_group_body(ctx: Any) -> list[float]:
    group = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1), process_group=group)
    model(torch.full((1, 2), float(ctx.rank + 1))).sum().backward()
    weight = model.module.weight.grad
    assert weight is not None
    return weight.flatten().tolist()


def test_ddp_on_a_group_asked_for_as_gloo() -> None:
    # DDP's C++ logger reads getBackendName(): for "gloo" it would look up a
    # gloo backend the group does not have, so that one keeps "simdist".
    got = simdist.run(ddp_on_gloo_group_body, world_size=2, timeout=TIMEOUT)
    assert got == [[1.5, 1.5]] * 2  # the weight's gradient averaged over inputs 1 and 2


# -- torch's _find_or_create_pg_by_ranks_and_tag ------------------------------------------


def tagged_groups_body(ctx: Any, stride: int) -> tuple[float, bool, list[int]]:
    n = dist.get_world_size()
    pg = c10d._find_or_create_pg_by_ranks_and_tag("mytag", list(range(n)), stride)
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t, group=pg)
    again = c10d._find_or_create_pg_by_ranks_and_tag("mytag", list(range(n)), stride)
    return t.item(), again is pg, dist.get_process_group_ranks(pg)


@pytest.mark.parametrize("stride", [2, 4])
def test_find_or_create_pg_by_ranks_and_tag(stride: int) -> None:
    # Each rank creates only its own set's group: [0, 1] and [2, 3] get one
    # c10d name and are separate communicators.
    got = simdist.run(tagged_groups_body, world_size=4, args=(stride,), timeout=TIMEOUT)
    if stride == 2:
        assert got == [(3.0, True, [0, 1])] * 2 + [(7.0, True, [2, 3])] * 2
    else:
        assert got == [(10.0, True, [0, 1, 2, 3])] * 4


def overlapping_body(ctx: Any) -> None:
    dist.new_group([0, 1] if ctx.rank < 2 else [1, 2])


def test_overlapping_rank_sets_under_one_name_are_still_a_mismatch() -> None:
    with pytest.raises(CollectiveMismatchError, match="with ranks"):
        simdist.run(overlapping_body, world_size=3, timeout=TIMEOUT)


# -- all_gather_coalesced and sparse all_reduce -------------------------------------------


def gather_coalesced_body(ctx: Any) -> tuple[list[list[list[float]]], list[int]]:
    n, r = dist.get_world_size(), ctx.rank
    outs = [[torch.zeros(2), torch.zeros(1, 3)] for _ in range(n)]
    dist.all_gather_coalesced(outs, [torch.full((2,), float(r)), torch.full((1, 3), 10.0 * r)])
    return [[o.flatten().tolist() for o in per_rank] for per_rank in outs], [
        o._version for per_rank in outs for o in per_rank
    ]


def test_all_gather_coalesced() -> None:
    got = simdist.run(gather_coalesced_body, world_size=3, timeout=TIMEOUT)
    expected = [[[float(r)] * 2, [10.0 * r] * 3] for r in range(3)]
    # gloo moves every output's version counter once (measured)
    assert got == [(expected, [1] * 6)] * 3


def _sparse_input(rank: int) -> torch.Tensor:
    """An uncoalesced COO tensor (a repeated index) on even ranks."""
    if rank % 2 == 0:
        idx, val = [[0, 1, 1, 0], [2, 0, 2, 2]], [1.0, 2.0, 3.0, 0.25]
    else:
        idx, val = [[1, 0], [2, 1]], [10.0, 20.0]
    return torch.sparse_coo_tensor(torch.tensor(idx), torch.tensor(val) * (rank + 1), (2, 3))


def sparse_body(ctx: Any) -> tuple[bool, list[list[int]], list[float], int, bool]:
    s = _sparse_input(ctx.rank)
    work = dist.all_reduce(s, async_op=True)
    work.wait()
    return s.is_coalesced(), s._indices().tolist(), s._values().tolist(), s._version, work.result()[0] is s


def test_sparse_all_reduce_sums_and_coalesces() -> None:
    n = 4
    dense = sum(_sparse_input(r).to_dense().double() for r in range(n))
    assert isinstance(dense, torch.Tensor)
    ref = dense.to_sparse()  # coalesced, indices in order
    got = simdist.run(sparse_body, world_size=n, timeout=TIMEOUT)
    for coalesced, indices, values, version, same in got:
        assert coalesced and same and version == 1  # as gloo: coalesced, in place, counter +1
        assert indices == ref._indices().tolist()
        assert values == pytest.approx(ref._values().tolist())


def sparse_max_body(ctx: Any) -> tuple[str, str]:
    return _caught(lambda: dist.all_reduce(_sparse_input(ctx.rank), op=dist.ReduceOp.MAX))


def test_sparse_all_reduce_refuses_other_ops_as_gloo() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(sparse_max_body, world_size=2, timeout=TIMEOUT)
    assert "allreduce of sparse tensors only works with ReduceOp.SUM" in str(info.value)


# -- recv without src -----------------------------------------------------------------------


def any_source_body(ctx: Any) -> list[tuple[int, float]] | None:
    r, n = ctx.rank, dist.get_world_size()
    if r == 0:
        dist.barrier()  # every sender's isend is queued by now
        got = []
        for _ in range(n - 1):
            t = torch.zeros(1)
            got.append((dist.recv(t), t.item()))
        work = dist.irecv(torch.zeros(1))
        dist.send(torch.ones(1), n - 1)  # the last rank answers: the only sender left
        work.wait()
        got.append((work._source_rank(), -1.0))
        return got
    work = dist.isend(torch.tensor([float(r)]), 0)
    dist.barrier()
    work.wait()
    if r == n - 1:
        dist.recv(torch.zeros(1), 0)
        dist.send(torch.zeros(1), 0)
    return None


@pytest.mark.parametrize("schedule", ["default", "random"])
def test_recv_any_source_takes_the_lowest_ranked_waiting_sender(schedule: str) -> None:
    extra = {} if schedule == "default" else {"schedule": "random", "schedule_seed": 3}
    got = simdist.run(any_source_body, world_size=4, timeout=TIMEOUT, **extra)
    assert got[0] == [(1, 1.0), (2, 2.0), (3, 3.0), (3, -1.0)]


def first_sender_body(ctx: Any) -> list[int] | None:
    if ctx.rank == 0:
        return [dist.recv(torch.zeros(1)) for _ in range(2)]
    dist.send(torch.zeros(1), 0)
    return None


def test_explore_varies_which_sender_an_any_source_recv_takes() -> None:
    # Rank order: rank 0 waits first, rank 1 sends first. Another schedule
    # lets rank 2 send first: the match follows the schedule, and only it.
    assert simdist.run(first_sender_body, world_size=3, timeout=TIMEOUT)[0] == [1, 2]
    found = simdist.explore(first_sender_body, world_size=3, schedules=20, timeout=TIMEOUT)
    assert found.found and found.outcome[0] == [2, 1]


def any_source_late_body(ctx: Any) -> int | None:
    # Rank 1 waits on rank 0 (which waits on any rank), rank 2 still runs and
    # sends: not a deadlock, whatever rank 1 does.
    if ctx.rank == 0:
        sender = dist.recv(torch.zeros(1))
        dist.send(torch.zeros(1), 1)
        return sender
    if ctx.rank == 1:
        dist.recv(torch.zeros(1), 0)
    else:
        time.sleep(0.05)
        dist.send(torch.ones(1), 0)
    return None


def test_recv_any_source_waits_while_a_sender_can_still_come() -> None:
    assert simdist.run(any_source_late_body, world_size=3, timeout=TIMEOUT)[0] == 2


def any_source_alone_body(ctx: Any) -> None:
    if ctx.rank == 0:
        dist.recv(torch.zeros(1))


def test_recv_any_source_with_no_sender_left_is_a_deadlock() -> None:
    with pytest.raises(DeadlockError, match="recv from any rank"):
        simdist.run(any_source_alone_body, world_size=3, timeout=TIMEOUT)


# -- waits with a timeout ---------------------------------------------------------------------


def group_timeout_body(ctx: Any) -> tuple[tuple[str, str], str, tuple[str, str]] | None:
    timed = dist.new_group([0, 1, 2], timeout=timedelta(seconds=1))
    if ctx.rank != 0:
        return None
    cause = ""
    try:
        dist.barrier(group=timed)
        first = ("ok", "")
    except RuntimeError as exc:
        first, cause = (type(exc).__name__, str(exc)), type(exc.__cause__).__name__
    later = _caught(lambda: dist.all_reduce(torch.ones(1), group=timed))
    return first, cause, later


def test_group_timeout_raises_gloo_error_at_once() -> None:
    got = simdist.run(group_timeout_body, world_size=3, timeout=TIMEOUT)[0]
    assert got is not None
    (kind, message), cause, later = got
    assert kind == "RuntimeError" and "Timed out waiting 1000ms for recv operation to complete" in message
    assert cause == "DeadlockError"  # the report stays available
    # gloo closes the timed-out rank's connections: the group is unusable after
    assert "Application timeout caused pair closure" in later[1]


def call_timeouts_body(ctx: Any) -> tuple[tuple[str, str], tuple[str, str]] | None:
    generous = dist.new_group(timeout=timedelta(seconds=300))
    other = dist.new_group()
    if ctx.rank != 0:
        return None
    barrier = _caught(lambda: dist.barrier(group=generous, timeout=timedelta(seconds=0.001)))
    work = dist.all_reduce(torch.ones(1), group=other, async_op=True)
    waited = _caught(lambda: work.wait(timeout=timedelta(seconds=2)))
    return barrier, waited


def test_barrier_and_work_wait_timeouts() -> None:
    got = simdist.run(call_timeouts_body, world_size=2, timeout=TIMEOUT)[0]
    assert got is not None
    barrier, waited = got
    assert barrier[0] == "RuntimeError" and "Timed out waiting 1ms" in barrier[1]
    assert waited == ("RuntimeError", "Operation timed out!")


def rescue_body(ctx: Any) -> tuple[str, float]:
    # Rank 1 waits (timeout 10 s) for rank 0, which waits (timeout 1 s) for
    # rank 1: rank 0 times out first, then sends, and rank 1 completes.
    a = dist.new_group([0, 1])
    b = dist.new_group([0, 1], timeout=timedelta(seconds=10))
    if ctx.rank == 0:
        work = dist.irecv(torch.zeros(1), src=1, group=a)
        kind, _ = _caught(lambda: work.wait(timeout=timedelta(seconds=1)))
        dist.send(torch.full((1,), 7.0), 1, group=b)
        return kind, 0.0
    t = torch.zeros(1)
    dist.recv(t, 0, group=b)
    return "ok", t.item()


def test_the_shortest_timeout_fires_and_the_rank_it_rescues_completes() -> None:
    assert simdist.run(rescue_body, world_size=2, timeout=TIMEOUT) == [("RuntimeError", 0.0), ("ok", 7.0)]


def store_waiters_body(ctx: Any) -> str:
    # The others wait on a store key only rank 0 sets, after its barrier
    # timed out (as PyTorch's harness does): no wait-for edge names rank 0.
    timed = dist.new_group(timeout=timedelta(seconds=1))
    store = c10d._get_default_store()
    if ctx.rank == 0:
        kind, _ = _caught(lambda: dist.barrier(group=timed))
        store.set("timed out", kind)
        return kind
    store.wait(["timed out"])
    return store.get("timed out").decode()


def test_a_timed_wait_fires_when_the_others_wait_on_the_store() -> None:
    assert simdist.run(store_waiters_body, world_size=3, timeout=TIMEOUT) == ["RuntimeError"] * 3


def completes_late_body(ctx: Any) -> str:
    timed = dist.new_group([0, 1], timeout=timedelta(seconds=0.01))
    if ctx.rank == 1:
        time.sleep(0.2)  # past the timeout in wall time; simdist keeps no clock
    dist.barrier(group=timed)
    return "passed"


def test_a_wait_that_completes_never_times_out() -> None:
    assert simdist.run(completes_late_body, world_size=2, timeout=TIMEOUT) == ["passed"] * 2


# -- monitored_barrier ------------------------------------------------------------------------


def monitored_body(ctx: Any, case: str) -> tuple[str, str] | None:
    r = ctx.rank
    group = dist.new_group([0, 1, 2], backend="gloo")
    one_s = timedelta(seconds=1)
    if case == "passes":
        dist.monitored_barrier(group, timeout=one_s)
        return _caught(lambda: dist.monitored_barrier(group, timeout=one_s, wait_all_ranks=True))
    if case == "rank 2 missing" and r != 2:
        return _caught(lambda: dist.monitored_barrier(group, timeout=one_s))
    if case == "wait all" and r == 0:
        return _caught(lambda: dist.monitored_barrier(group, timeout=one_s, wait_all_ranks=True))
    if case == "no time" and r == 0:
        return _caught(lambda: group.monitored_barrier(timedelta(seconds=0)))
    if case == "subgroup":
        sub = dist.new_group([0, 1], backend="gloo")
        if r == 0:
            return _caught(lambda: dist.monitored_barrier(sub, 0.1))
        if r == 2:
            return _caught(lambda: dist.monitored_barrier(sub, 0.1))  # not a member: a no-op
    return None


MONITORED = {
    "passes": [("ok", "")] * 3,
    "rank 2 missing": [
        (
            "RuntimeError",
            r"^\[Rank 0\]: Rank 2 failed to pass monitoredBarrier in 1000 ms\n Original exception",
        ),
        (
            "RuntimeError",
            r"^Rank 1 successfully reached monitoredBarrier, but received errors while waiting for "
            r"send/recv from rank 0\. Please check rank 0 logs for faulty rank\.",
        ),
        None,
    ],
    "wait all": [
        ("RuntimeError", r"^\[Rank 0\]: Ranks 1, 2 failed to pass monitoredBarrier in 1000 ms$"),
        None,
        None,
    ],
    "no time": [
        (
            "RuntimeError",
            r"Rank 1 failed to pass monitoredBarrier in 0 ms.*Rank 0 timed out in monitoredBarrier",
        ),
        None,
        None,
    ],
    "subgroup": [("RuntimeError", r"Rank 1 failed to pass monitoredBarrier in 100 ms"), None, ("ok", "")],
}


@pytest.mark.parametrize("case", list(MONITORED))
def test_monitored_barrier_names_the_missing_ranks_as_gloo(case: str) -> None:
    got = simdist.run(monitored_body, world_size=3, args=(case,), timeout=TIMEOUT)
    for rank, (seen, expected) in enumerate(zip(got, MONITORED[case], strict=True)):
        if expected is None:
            assert seen is None, rank
            continue
        assert seen is not None and seen[0] == expected[0], (rank, seen)
        assert re.search(expected[1], seen[1], re.S), (rank, seen[1])


# -- the same programs on a real gloo world ------------------------------------------------------


def gloo_twin_body(ctx: Any) -> dict[str, Any]:
    """The observations above in one world (gloo, or simdist asked for gloo)."""
    out: dict[str, Any] = {}
    group = dist.new_group(backend="gloo")
    out["names"] = (
        dist.get_backend(group),
        group._get_backend_name(),
        str(c10d._world.pg_backend_config[group]),
    )
    s = _sparse_input(ctx.rank)
    dist.all_reduce(s, group=group)
    out["sparse"] = (s.is_coalesced(), s._indices().tolist(), s._values().tolist(), s._version)
    outs = [[torch.zeros(2), torch.zeros(1, 3)] for _ in range(dist.get_world_size())]
    dist.all_gather_coalesced(outs, [torch.full((2,), float(ctx.rank)), torch.full((1, 3), 10.0 * ctx.rank)])
    out["gathered"] = (
        [[o.flatten().tolist() for o in per] for per in outs],
        [o._version for per in outs for o in per],
    )
    if ctx.rank == 0:
        senders = []
        for _ in range(dist.get_world_size() - 1):
            t = torch.zeros(1)
            senders.append((dist.recv(t, group=group), t.item()))
        out["senders"] = sorted(senders)  # the order is gloo's timing; the pairing is not
    else:
        dist.send(torch.tensor([float(ctx.rank)]), 0, group=group)
    return out


@pytest.mark.gloo
def test_gaps_match_a_gloo_world() -> None:
    gloo = simdist.run_processes(gloo_twin_body, world_size=3, timeout=120.0)
    sim = simdist.run(gloo_twin_body, world_size=3, timeout=TIMEOUT)
    for g, s in zip(gloo, sim, strict=True):
        assert s["names"] == g["names"] == ("gloo", "gloo", "cpu:gloo,cuda:gloo")
        assert s["gathered"] == g["gathered"]
        assert s["sparse"][:2] == g["sparse"][:2] and s["sparse"][3] == g["sparse"][3]
        assert s["sparse"][2] == pytest.approx(g["sparse"][2])
    assert sim[0]["senders"] == gloo[0]["senders"] == [(1, 1.0), (2, 2.0)]


def gloo_timeouts_body(ctx: Any, linger: float) -> dict[str, tuple[str, str]]:
    """Rank 0 times out in a group's barrier and a Work.wait; rank 2 misses a
    monitored_barrier. ``linger``: how long the others stay (a gloo world
    whose peer exits reports a closed connection instead)."""
    out: dict[str, tuple[str, str]] = {}
    timed = dist.new_group(timeout=timedelta(seconds=1))
    monitored = dist.new_group(backend="gloo")
    waited = dist.new_group()
    if ctx.rank == 0:
        out["barrier"] = _caught(lambda: dist.barrier(group=timed))
        work = dist.all_reduce(torch.ones(1), group=waited, async_op=True)
        out["wait"] = _caught(lambda: work.wait(timeout=timedelta(seconds=1)))
    if ctx.rank != 2:
        out["monitored"] = _caught(lambda: dist.monitored_barrier(monitored, timeout=timedelta(seconds=1)))
    time.sleep(linger)
    return out


KEY_WORDS = {
    "barrier": r"Timed out waiting 1000ms for recv operation to complete",
    "wait": r"^Operation timed out!$",
    "monitored": r"^\[Rank 0\]: Rank 2 failed to pass monitoredBarrier in 1000 ms|^Rank 1 successfully reached "
    r"monitoredBarrier, but received errors while waiting for send/recv from rank 0",
}


@pytest.mark.gloo
def test_timeouts_match_a_gloo_world() -> None:
    gloo = simdist.run_processes(gloo_timeouts_body, world_size=3, args=(4.0,), timeout=120.0)
    sim = simdist.run(gloo_timeouts_body, world_size=3, args=(0.0,), timeout=TIMEOUT)
    for rank, (g, s) in enumerate(zip(gloo, sim, strict=True)):
        assert sorted(g) == sorted(s), rank
        for case, (kind, message) in s.items():
            assert kind == g[case][0] == "RuntimeError", (rank, case, g[case], s[case])
            assert re.search(KEY_WORDS[case], g[case][1]), (rank, case, g[case])
            assert re.search(KEY_WORDS[case], message), (rank, case, message)


def nccl_group_refused_call_body(ctx: Any) -> None:
    group = dist.new_group([0, 1], backend="nccl")
    dist.all_reduce(torch.ones(4)[::2], group=group)  # strided: simdist refuses it, naming the strides


def test_an_error_on_a_group_asked_for_as_nccl_is_not_hidden_on_a_torch_without_nccl() -> None:
    # c10d's error logger asks torch.cuda.nccl for its version when a call on a
    # group reporting "nccl" raises; without NCCL built in that raised
    # AttributeError in the rank, in place of simdist's refusal.
    if dist.is_nccl_available():
        pytest.skip("this torch has NCCL: the group reports nccl and the logger finds its version")
    with pytest.raises(simdist.RankError) as info:
        simdist.run(nccl_group_refused_call_body, world_size=2, timeout=TIMEOUT)
    assert isinstance(info.value.__cause__, ValueError), repr(info.value.__cause__)
    assert "contiguous" in str(info.value.__cause__)
