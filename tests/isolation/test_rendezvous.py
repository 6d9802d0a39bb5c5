"""``init_process_group`` with ``env://`` or ``tcp://`` inside a rank meets
at the run's own store, not at a TCP store: a TCPStore's master waits in C++
for its workers while it holds the run token, so the workers could never run
to connect (the run hung until its timeout)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import simdist


def reinit_program(ctx: simdist.RankContext) -> list[float]:
    dist.destroy_process_group()
    dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.world_size)
    t = torch.full((2,), ctx.rank + 1.0)
    dist.all_reduce(t)
    dist.destroy_process_group()
    # a second rendezvous, by URL, meets at a fresh prefix of the run's store
    dist.init_process_group("gloo", init_method="tcp://localhost:1", rank=ctx.rank, world_size=ctx.world_size)
    u = torch.ones(1)
    dist.all_reduce(u)
    store_ranks = dist.get_world_size()
    return [*t.tolist(), *u.tolist(), float(store_ranks)]


def test_env_and_tcp_rendezvous_meet_in_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "1")  # nothing listens there: no TCP is used
    world = 3
    results = simdist.run(reinit_program, world_size=world, timeout=60)
    assert results == [[6.0, 6.0, float(world), float(world)]] * world
