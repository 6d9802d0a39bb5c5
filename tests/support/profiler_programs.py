"""A program that profiles its own collectives, for simdist and a real gloo world alike.

Every rank opens ``torch.autograd.profiler.profile(record_shapes=True)`` (or
``torch.profiler.profile``) around the same calls and returns what its
session saw of them: the ``gloo:*`` events (name, asynchronous or not, input
shapes), and whether its own tensor op and ``record_function`` range are
there. A rank's result depends only on what that rank did, so simdist's and
gloo's must be equal.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _calls(rank: int, world: int) -> None:
    t = torch.full((2, 3), float(rank))
    dist.all_reduce(t)
    dist.broadcast(t, src=world - 1)
    dist.reduce(t, dst=0)
    outs = [torch.empty(2, 3) for _ in range(world)]
    dist.all_gather(outs, t)
    flat = torch.empty(2 * world, 3)
    dist.all_gather_into_tensor(flat, t)
    dist.reduce_scatter_tensor(torch.empty(2, 3), flat)
    dist.all_to_all_single(torch.empty(world, 4), torch.ones(world, 4))
    dist.all_reduce_coalesced([torch.ones(3), torch.ones(2, 2)])
    c = torch.ones(4, dtype=torch.complex64)
    dist.all_reduce(c)
    w = dist.all_reduce(torch.ones(5), async_op=True)
    w.wait()
    dist.barrier()
    gathered = [torch.empty(3) for _ in range(world)] if rank == 1 else None
    dist.gather(torch.full((3,), float(rank)), gathered, dst=1)
    parts = [torch.full((2,), float(r)) for r in range(world)] if rank == 0 else None
    dist.scatter(torch.empty(2), parts, src=0)
    lists = [[torch.empty(2), torch.empty(1, 3)] for _ in range(world)]
    dist.all_gather_coalesced(lists, [torch.ones(2), torch.ones(1, 3)])
    if rank == 0:
        for _ in range(world - 1):
            dist.recv(torch.empty(7))
    else:
        dist.isend(torch.ones(7), 0).wait()
    # Before any later send reaches rank 0: an any-source recv would take it.
    dist.barrier()
    peer = (rank + 1) % world
    src = (rank - 1) % world
    if rank % 2 == 0:
        dist.send(torch.ones(rank + 1), peer)
        dist.recv(torch.empty(src + 1), src)
    else:
        dist.recv(torch.empty(src + 1), src)
        dist.send(torch.ones(rank + 1), peer)


def profiled_calls(ctx: Any, kind: str = "autograd") -> dict[str, Any]:
    """Profile ``_calls`` on this rank; what the session saw of them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if kind == "autograd":
        ctx: Any = torch.autograd.profiler.profile(record_shapes=True)
    else:
        ctx = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
    with ctx as prof:
        with torch.autograd.profiler.record_function(f"step_of_rank_{rank}"):
            torch.mul(torch.ones(2), rank)
            _calls(rank, world)
    events = prof.function_events if kind == "autograd" else prof.events()
    backend = f"{dist.get_backend()}:"  # simdist's own worlds report "simdist"
    gloo = [
        (e.name[len(backend) :], bool(e.is_async), [list(s) for s in e.input_shapes], e.count)
        for e in events
        if e.name.startswith(backend)
    ]
    names = {e.name for e in events}
    return {
        "gloo": sorted(gloo, key=repr),
        "own_range": f"step_of_rank_{rank}" in names,
        "peer_ranges": sorted(
            n for n in names if n.startswith("step_of_rank_") and n != f"step_of_rank_{rank}"
        ),
        "mul": "aten::mul" in names,
        "enabled_after": torch.autograd._profiler_enabled(),
    }
