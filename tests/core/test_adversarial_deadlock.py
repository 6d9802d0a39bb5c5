"""Deadlocks and failures a hostile body cannot hide.

A partial deadlock is reported while other ranks keep working; a body that
catches the report and retries, or catches a collective mismatch or an injected
crash and goes on, still fails the run; a group that escapes its run refuses
calls at once; the trace path is checked before any rank starts and a trace
that cannot be written never hides the run's own outcome. Every test checks
that no thread outlives the run and that the next run works.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import FaultPlan, Layout

TIMEOUT = 30.0


# --- a partial deadlock while other ranks keep working ------------------------------------


def partial_cycle_body(ctx: simdist.RankContext, reported: threading.Event) -> str:
    if ctx.rank in (0, 1):
        try:
            dist.send(torch.ones(2), dst=1 - ctx.rank)  # both send first: a cycle
        except simdist.DeadlockError:
            reported.set()
            raise
        return "unreachable"
    # Ranks 2 and 3 keep issuing collectives of their own and stop only once
    # the cycle has been reported (or after far longer than detection takes).
    # They agree on when to stop through the all_reduce itself.
    for _ in range(100_000):
        seen = torch.tensor([float(reported.is_set())])
        dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=ctx.groups.tp)
        if seen.item() == 1.0:
            return "saw the report"
    return "never saw it"


def test_partial_deadlock_is_reported_while_others_run(clean_world: None) -> None:
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(
            partial_cycle_body,
            layout=Layout(tp=2, dp=2),
            timeout=TIMEOUT,
            args=(threading.Event(),),
            share_args=True,
        )
    message = str(info.value)
    assert message.startswith("deadlock: rank(s) [0, 1] wait for each other in a cycle: 0 -> 1 -> 0")
    assert "rank 0 (tp=0 cp=0 dp=0 pp=0): waiting in send to rank 1 (tag 0)" in message
    assert "rank 1 (tp=1 cp=0 dp=0 pp=0): waiting in send to rank 0 (tag 0)" in message
    assert "test_adversarial_deadlock.py" in message  # the user's call sites
    assert "watchdog" not in message
    # The other TP group was never stopped: it learnt of the report and returned.
    assert info.value.results[2:] == ["saw the report", "saw the report"]


def retry_forever_body(ctx: simdist.RankContext) -> None:
    while True:
        try:
            dist.send(torch.ones(1), dst=1 - ctx.rank)
            dist.recv(torch.ones(1), src=1 - ctx.rank)
            return
        except simdist.DeadlockError:
            continue  # "transient": try again


def test_catch_and_retry_cannot_turn_a_deadlock_into_a_timeout(clean_world: None) -> None:
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(retry_forever_body, world_size=2, timeout=1.0)
    message = str(info.value)
    assert message.startswith("deadlock: every live rank is waiting")
    assert "rank(s) [0, 1] wait for each other in a cycle: 0 -> 1 -> 0" in message
    # The watchdog ended the retry loop; the report says so after the deadlock.
    assert "afterwards the watchdog fired" in message


# --- a group or work that escapes its run -------------------------------------------------


def escaping_body(ctx: simdist.RankContext) -> tuple[dist.ProcessGroup, Any]:
    work = None
    if ctx.rank == 0:
        work = dist.all_reduce(torch.ones(1), group=ctx.groups.world, async_op=True)
        dist.all_reduce(torch.ones(1), group=ctx.groups.world)  # completes seq 0 first
    else:
        dist.all_reduce(torch.ones(1), group=ctx.groups.world)
        dist.all_reduce(torch.ones(1), group=ctx.groups.world)
    return ctx.groups.world, work


def call_in_thread(fn: Any) -> BaseException | None:
    """Run ``fn`` in a helper thread, bounded: a hang fails the test, not the suite."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(10.0)
    assert not thread.is_alive(), "the call on a finished world blocked"
    return outcome[0]


def test_a_group_used_after_its_run_raises_at_once(clean_world: None) -> None:
    results = simdist.run(escaping_body, world_size=2, timeout=TIMEOUT)
    group, _ = results[0]
    error = call_in_thread(lambda: group.allreduce([torch.ones(1)]).wait())
    assert isinstance(error, simdist.SimulationError)
    assert "belongs to simdist.run #" in str(error) and "escaping_body" in str(error)
    assert "has already ended" in str(error)
    error = call_in_thread(lambda: group.send([torch.ones(1)], 1, 0).wait())
    assert isinstance(error, simdist.SimulationError) and "has already ended" in str(error)


cached_groups: dict[str, Any] = {}


def caching_body(ctx: simdist.RankContext) -> None:
    cached_groups["pair"] = dist.new_group([0, 1])
    cached_groups["world"] = dist.group.WORLD


@pytest.mark.parametrize("which", ["pair", "world"])
def test_a_group_kept_in_a_global_and_used_by_the_next_run_names_its_run(
    clean_world: None, which: str
) -> None:
    """Through torch's own collectives (which look the group up in c10d's map
    first), not the group's methods: the error names the run it belonged to."""
    cached_groups.clear()
    simdist.run(caching_body, world_size=2, timeout=TIMEOUT)

    def next_run(ctx: simdist.RankContext) -> None:
        dist.all_reduce(torch.ones(1), group=cached_groups[which])

    with pytest.raises(simdist.RankError) as caught:
        simdist.run(next_run, world_size=2, timeout=TIMEOUT)
    for failure in caught.value.failures.values():
        assert isinstance(failure, simdist.SimulationError)
        assert "caching_body" in str(failure) and "has already ended" in str(failure)


def escaping_then_timing_out_body(ctx: simdist.RankContext) -> Any:
    escaped.append(ctx.groups.world)
    if ctx.rank == 0:
        while True:  # the watchdog aborts the world mid-run
            time.sleep(0.01)
    return None


escaped: list[Any] = []


def test_a_group_of_a_world_aborted_mid_run_names_its_run(clean_world: None) -> None:
    escaped.clear()
    with pytest.raises(simdist.SimulationTimeout):
        simdist.run(escaping_then_timing_out_body, world_size=2, timeout=0.5)
    error = call_in_thread(lambda: escaped[0].allreduce([torch.ones(1)]).wait())
    assert isinstance(error, simdist.SimulationError)
    assert "escaping_then_timing_out_body" in str(error) and "has already ended" in str(error)


# --- failures that a body catches ---------------------------------------------------------


def swallow_mismatch_body(ctx: simdist.RankContext) -> str:
    try:
        dist.all_reduce(torch.ones(2 + ctx.rank))
    except Exception as exc:
        return f"logged: {type(exc).__name__}"
    return "ok"


def test_a_caught_mismatch_still_fails_the_run(clean_world: None) -> None:
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.run(swallow_mismatch_body, world_size=2, timeout=TIMEOUT)
    assert "shape=(2,)" in str(info.value) and "shape=(3,)" in str(info.value)
    assert info.value.results == ["logged: CollectiveMismatchError"] * 2


def swallow_crash_body(ctx: simdist.RankContext) -> str:
    try:
        dist.barrier()
    except simdist.InjectedFault:
        pass
    dist.barrier()  # "retry": every rank crashed in the first one and goes on
    return "ignored the crash"


def test_a_caught_injected_crash_still_fails_the_run(clean_world: None) -> None:
    plan = FaultPlan.crash(rank=0) + FaultPlan.crash(rank=1)
    with pytest.raises(simdist.RankError) as info:
        simdist.run(swallow_crash_body, world_size=2, timeout=TIMEOUT, faults=plan)
    err = info.value
    assert sorted(err.failures) == [0, 1] and isinstance(err.__cause__, simdist.InjectedFault)
    assert "injected crash at barrier on world [0, 1] seq 0 (rank 0" in str(err.__cause__)
    for rank in (0, 1):
        assert f"rank {rank} (rank {rank} of 2) caught InjectedFault and went on" in str(err)


def fallback_body(ctx: simdist.RankContext) -> str:
    t = torch.zeros(1)
    if ctx.rank == 0:
        dist.send(torch.ones(1), dst=1)
        return "sent"
    try:
        dist.all_reduce(t.to_sparse(), op=dist.ReduceOp.MAX)  # gloo sums sparse tensors only
    except simdist.UnsupportedOperationError:
        dist.recv(t, src=0)  # the "fallback"
    return "received"


def test_a_caught_unsupported_operation_still_fails_the_run(clean_world: None) -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(fallback_body, world_size=2, timeout=TIMEOUT)
    err = info.value
    assert sorted(err.failures) == [1]
    assert isinstance(err.__cause__, simdist.UnsupportedOperationError)
    assert "rank 1 (rank 1 of 2) caught UnsupportedOperationError and went on" in str(err)
    assert "sparse" in str(err)


def wrapped_release_body(ctx: simdist.RankContext) -> None:
    if ctx.rank == 0:
        raise KeyError("rank 0 breaks")
    try:
        dist.all_reduce(torch.ones(1))
    except simdist.PeerFailedError as err:
        raise RuntimeError("training step failed") from err


def test_a_release_wrapped_by_the_body_is_still_a_release(clean_world: None) -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(wrapped_release_body, world_size=3, timeout=TIMEOUT)
    err = info.value
    assert sorted(err.failures) == [0] and err.released == (1, 2)
    assert isinstance(err.__cause__, KeyError)


def independent_failures_body(ctx: simdist.RankContext) -> None:
    if ctx.rank == 1:
        time.sleep(0.05)  # rank 3 usually fails first in time; rank order decides all the same
    if ctx.rank in (1, 3):
        raise ValueError(f"rank {ctx.rank} breaks")
    dist.all_reduce(torch.ones(1))


def test_independent_failures_are_reported_in_rank_order(clean_world: None) -> None:
    messages = set()
    for _ in range(5):
        with pytest.raises(simdist.RankError) as info:
            simdist.run(independent_failures_body, world_size=4, timeout=TIMEOUT)
        err = info.value
        assert sorted(err.failures) == [1, 3] and err.released == (0, 2)
        assert str(err.__cause__) == "rank 1 breaks"  # the lowest failed rank, every time
        messages.add(str(err).split("last calls per rank")[0])
    assert len(messages) == 1


# --- the trace file -------------------------------------------------------------------------


def deadlock_body(ctx: simdist.RankContext, ran: list[int]) -> None:
    ran.append(ctx.rank)
    if ctx.rank == 0:
        dist.barrier()


def test_a_trace_path_in_a_missing_directory_is_refused_before_the_run(
    clean_world: None, tmp_path: Path
) -> None:
    ran: list[int] = []
    target = tmp_path / "missing" / "trace.json"
    with pytest.raises(FileNotFoundError, match="directory does not exist"):
        simdist.run(deadlock_body, world_size=2, timeout=TIMEOUT, trace=target, args=(ran,))
    assert ran == [], "no rank may start when the trace cannot be written"


def remove_folder_then_deadlock(ctx: simdist.RankContext, folder: str) -> None:
    if ctx.rank == 0:
        shutil.rmtree(folder)
        dist.barrier()


def test_a_trace_that_cannot_be_written_never_hides_the_outcome(clean_world: None, tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(
            remove_folder_then_deadlock,
            world_size=2,
            timeout=TIMEOUT,
            trace=folder / "t.json",
            args=(str(folder),),
        )
    assert "the trace could not be written" in str(info.value)
    assert not os.path.exists(folder)


# --- the wait-for graph, without threads ------------------------------------------------------


def test_the_wait_for_graph_finds_exactly_the_closed_sets() -> None:
    from simdist._core.waitfor import cannot_complete, find_cycle

    running = {5}.__contains__  # rank 5 runs; 6 has left; every key waits
    graph = {
        0: [1],
        1: [0],  # a cycle
        2: [0],  # waits on the cycle
        3: [5],
        4: [3],  # a chain that ends at a running rank
        7: [6],  # waits on a rank that has left
        8: [5, 1],  # needs a running rank and a stuck one: stuck
    }
    assert cannot_complete(graph, running) == {0, 1, 2, 7, 8}
    assert find_cycle(graph, {0, 1, 2, 7, 8}) == [0, 1]
    assert find_cycle(graph, {2, 7, 8}) == []
