"""Promises of the backend rebuilt: call sites, dispatch modes, random fault plans, the store.

Each test here failed before the rebuild (simdist 4934cfa): call sites were
torch's wrappers, CommDebugMode saw no plain c10d call, FaultPlan.random drew
invalid faults, and the world's store refused num_keys/delete_key through c10d.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor.debug import CommDebugMode

import simdist
from simdist import FaultPlan, Layout

TIMEOUT = 60.0
HERE = r"test_backend_promises\.py"


# --- call sites are the user's lines ------------------------------------------------


def wrapped_calls(ctx: simdist.RankContext) -> None:
    n = ctx.world_size
    dist.all_gather_into_tensor(torch.zeros(2 * n), torch.ones(2))  # deprecation-wrapped on 2.13
    dist.reduce_scatter_tensor(torch.zeros(1), torch.ones(n))
    funcol.wait_tensor(funcol.all_reduce(torch.ones(2), "sum", ctx.groups.world))  # through torch/_ops.py


def test_call_sites_behind_torch_wrappers_are_the_users_lines() -> None:
    with simdist.CommStats() as stats:
        simdist.run(wrapped_calls, world_size=2, timeout=TIMEOUT)
    for op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"):
        assert stats.count(op=op, site="test_backend_promises.py").calls == 2, (op, stats._counts)
        assert stats.count(op=op).calls == 2


def mismatched_wrapped(ctx: simdist.RankContext) -> None:
    if ctx.rank == 0:
        dist.all_gather_into_tensor(torch.zeros(4), torch.ones(2))
    else:
        dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(4))


def test_a_mismatch_table_names_the_users_lines_behind_the_deprecation_wrapper() -> None:
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.run(mismatched_wrapped, world_size=2, timeout=TIMEOUT)
    table = str(info.value).split("last calls per rank")[0]
    assert "typing_extensions" not in table
    assert len(re.findall(rf"at \S*{HERE}:\d+", table)) == 2, table


# --- CommDebugMode sees the dispatcher ops it sees on gloo --------------------------


def counted_by_comm_debug_mode(ctx: simdist.RankContext) -> list[tuple[str, int]]:
    n, root = ctx.world_size, ctx.rank == 0
    t = torch.ones(2)
    with CommDebugMode() as mode:
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        dist.reduce(t, 0)
        dist.all_gather([torch.zeros(2) for _ in range(n)], t)
        dist.all_gather_into_tensor(torch.zeros(2 * n), t)
        dist.reduce_scatter(torch.zeros(2), [torch.ones(2) for _ in range(n)])
        dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * n))
        dist.gather(t, [torch.zeros(2) for _ in range(n)] if root else None, dst=0)
        dist.scatter(torch.zeros(2), [torch.ones(2) for _ in range(n)] if root else None, src=0)
        dist.all_to_all([torch.zeros(2) for _ in range(n)], [torch.ones(2) for _ in range(n)])
        dist.all_to_all_single(torch.zeros(2 * n), torch.ones(2 * n))
        dist.all_reduce(t, async_op=True).wait()
        dist.barrier()
        funcol.wait_tensor(funcol.all_reduce(t, "sum", ctx.groups.world))
        if ctx.rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
    return sorted((str(op), count) for op, count in mode.get_comm_counts().items())


@pytest.mark.gloo
def test_comm_debug_mode_counts_the_same_ops_as_on_gloo() -> None:
    gloo = simdist.run_processes(counted_by_comm_debug_mode, world_size=2, backend="gloo", timeout=120)
    sim = simdist.run(counted_by_comm_debug_mode, world_size=2, timeout=TIMEOUT)
    assert sim == gloo
    counts = dict(sim[0])
    assert counts["c10d.allreduce_"] == 2 and counts["c10d._allgather_base_"] == 1
    assert counts["c10d_functional.all_reduce"] == 1


def seen_outside_mode(ctx: simdist.RankContext) -> float:
    t = torch.ones(2)
    with CommDebugMode():
        dist.all_reduce(t)  # the shadow call must not change the data or run the op twice
    dist.all_reduce(t)
    return t[0].item()


def test_a_dispatch_mode_does_not_change_the_result() -> None:
    assert simdist.run(seen_outside_mode, world_size=3, timeout=TIMEOUT) == [9.0] * 3


# --- FaultPlan.random draws only valid faults ----------------------------------------


def test_fault_plan_random_draws_only_valid_faults_for_the_ops_given() -> None:
    layout = Layout(tp=2, dp=2)
    drawn: set[tuple[str, str | None]] = set()
    for seed in range(400):
        plan = FaultPlan.random(seed, world=layout, count=3, ops=("all_reduce", "send", "recv"))
        for fault in plan.faults:
            assert not (fault.kind == "corrupt" and fault.op == "recv"), (seed, fault)
            drawn.add((fault.kind, fault.op))
    # Every valid pair is still drawn: recv with the other kinds, corrupt with the rest.
    assert ("corrupt", "send") in drawn and ("corrupt", "all_reduce") in drawn
    assert {("crash", "recv"), ("timeout", "recv"), ("delay", "recv")} <= drawn


def test_fault_plan_random_with_no_valid_pair_says_why() -> None:
    with pytest.raises(ValueError, match=r"no valid fault.*corrupt fault needs an op that sends data"):
        FaultPlan.random(0, world=2, kinds=("corrupt",), ops=("recv", "barrier"))


def test_fault_plan_random_keeps_the_plan_of_a_seed_that_was_valid() -> None:
    # kinds and ops given once each: the draw order is the documented one.
    plan = FaultPlan.random(7, world=4, count=2, kinds=("crash",), ops=("all_reduce",), max_nth=1)
    assert [f.kind for f in plan.faults] == ["crash", "crash"]
    assert all(f.op == "all_reduce" and f.nth == 1 for f in plan.faults)


# --- the world's store: num_keys and delete_key through c10d --------------------------


def store_ops(store: Any) -> list[Any]:
    nested = dist.PrefixStore("mine", store)
    base = store.num_keys()
    out: list[Any] = []
    store.set("a", "1")
    nested.set("b", "2")
    out.append(store.num_keys() - base)
    out.append(store.delete_key("a"))
    out.append(store.delete_key("a"))
    out.append(nested.delete_key("a"))  # another prefix: not there
    out.append(nested.delete_key("b"))
    out.append(store.num_keys() - base)
    out.append(store.check(["a"]))
    return out


def default_store_ops(ctx: simdist.RankContext) -> list[Any]:
    return store_ops(dist.distributed_c10d._get_default_store())


def test_the_default_store_counts_and_deletes_keys_as_a_hash_store_does() -> None:
    want = store_ops(dist.PrefixStore("default_pg", dist.HashStore()))
    assert want == [2, True, False, False, True, 0, False]
    assert simdist.run(default_store_ops, world_size=1, timeout=TIMEOUT) == [want]


def deleted_key_wait(ctx: simdist.RankContext) -> bytes:
    store = dist.distributed_c10d._get_default_store()
    if ctx.rank == 0:
        store.set("k", "old")
        store.delete_key("k")
    dist.barrier()
    if ctx.rank == 1:
        store.set("k", "new")
    return store.get("k")  # rank 0 must wait for rank 1's key, not see the deleted one


def test_a_deleted_key_is_gone_for_every_rank() -> None:
    assert simdist.run(deleted_key_wait, world_size=2, timeout=TIMEOUT) == [b"new", b"new"]


# --- strict call sites -----------------------------------------------------------------


def skipped_forward(ctx: simdist.RankContext) -> float:
    t = torch.ones(2)
    if ctx.rank != 1:
        dist.all_reduce(t)  # forward all_reduce: rank 1 skips it
    dist.all_reduce(t)  # backward all_reduce
    return t[0].item()


def test_strict_call_sites_catch_a_skipped_forward_all_reduce() -> None:
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.run(skipped_forward, world_size=3, timeout=TIMEOUT, strict_call_sites=True)
    message = str(info.value)
    assert message.startswith("collective mismatch on world [0, 1, 2] at sequence number 0")
    assert "different call sites" in message
    lines = set(re.findall(rf"at \S*({HERE}:\d+)", message.split("last calls per rank")[0]))
    assert len(lines) == 2, message


def test_any_failed_run_points_out_members_that_met_from_different_call_sites() -> None:
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(skipped_forward, world_size=3, timeout=TIMEOUT)
    message = str(info.value)
    assert "from different call sites" in message
    note = message.split("from different call sites")[-1]
    assert "all_reduce on world [0, 1, 2] seq 0" in note
    assert len(set(re.findall(rf"{HERE}:\d+", note))) == 2


def same_call_two_lines(ctx: simdist.RankContext) -> float:
    t = torch.ones(2)
    if ctx.rank == 0:
        dist.all_reduce(t)
    else:
        dist.all_reduce(t)
    return t[0].item()


def test_two_lines_for_one_call_pass_unless_strict() -> None:
    assert simdist.run(same_call_two_lines, world_size=2, timeout=TIMEOUT) == [2.0, 2.0]
    with pytest.raises(simdist.CollectiveMismatchError, match="different call sites"):
        simdist.run(same_call_two_lines, world_size=2, timeout=TIMEOUT, strict_call_sites=True)


def test_strict_call_sites_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="strict_call_sites must be True or False, got 'yes'"):
        simdist.run(same_call_two_lines, world_size=2, strict_call_sites="yes")  # type: ignore[arg-type]
