"""DistributedDataParallel, unmodified, against the single-process full batch.

Several buckets (a tiny ``bucket_cap_mb``), ``no_sync`` accumulation, and comm
hooks (torch's ``default_hooks.allreduce_hook`` and a user hook that averages
with its own all_reduce) must all give the gradients of the whole batch.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from client_models import assert_close_dicts, batch, grads, mlp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import simdist

WORLD = 4
ROWS = 8  # per rank and microbatch
DIMS = (8, 16, 16, 4)


def own_average_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A user's hook: all_reduce the bucket, then divide (what DDP does itself)."""
    buffer = bucket.buffer()
    work = dist.all_reduce(buffer, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0] / dist.get_world_size())


STEPS = 2  # DDP puts every parameter in one bucket until it rebuilds them after step 1


def ddp_body(ctx: simdist.RankContext, hook: str, micro: int) -> tuple[list[dict], list]:
    seen_buckets: list[tuple[int, int]] = []
    model = DDP(mlp(0, DIMS), bucket_cap_mb=0.0005)  # 0.0005 MB = 65 float64: one layer a bucket
    if hook == "default":
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook == "own":

        def counting_hook(state, bucket):
            seen_buckets.append((step, bucket.index()))
            return own_average_hook(state, bucket)

        model.register_comm_hook(None, counting_hook)
    out = []
    for step in range(STEPS):
        model.zero_grad()
        for m in range(micro):
            x, y = batch(10 * step + m, ROWS * WORLD, (DIMS[0], DIMS[-1]))
            mine = slice(ctx.rank * ROWS, (ctx.rank + 1) * ROWS)
            # All but the last microbatch accumulate locally, without communication
            # (no_sync must cover the forward too: that is where DDP arms its hooks).
            with model.no_sync() if m < micro - 1 else contextlib.nullcontext():
                loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine]) / micro
                loss.backward()
        out.append(grads(model.module))
    return out, seen_buckets


def reference(micro: int) -> list[dict]:
    model = mlp(0, DIMS)
    out = []
    for step in range(STEPS):
        model.zero_grad()
        for m in range(micro):
            x, y = batch(10 * step + m, ROWS * WORLD, (DIMS[0], DIMS[-1]))
            (torch.nn.functional.mse_loss(model(x), y) / micro).backward()
        out.append(grads(model))
    return out


@pytest.mark.parametrize("hook", ["builtin", "default", "own"])
@pytest.mark.parametrize("micro", [1, 3])
def test_ddp_gradients_equal_the_full_batch(hook: str, micro: int) -> None:
    per_rank = simdist.run(ddp_body, world_size=WORLD, args=(hook, micro))
    want = reference(micro)
    for got, _ in per_rank:
        for step in range(STEPS):
            assert_close_dicts(got[step], want[step], rtol=1e-12, atol=1e-14)
    if hook == "own":
        calls = per_rank[0][1]
        assert all(seen == calls for _, seen in per_rank)
        # Step 1: one bucket, reduced once (the no_sync microbatches reduced
        # nothing); rebuilt after it, step 2 reduces each of several buckets once.
        assert [b for step, b in calls if step == 0] == [0], calls
        later = [b for step, b in calls if step == 1]
        assert len(later) >= 3 and sorted(later) == list(range(len(later))), calls


@pytest.mark.gloo
def test_ddp_hook_calls_and_gradients_equal_a_gloo_world() -> None:
    """Which buckets the hook sees, in which order, and the gradients: as real processes."""
    sim = simdist.run(ddp_body, world_size=2, args=("own", 3))
    real = simdist.run_processes(ddp_body, world_size=2, args=("own", 3), backend="gloo")
    for (sim_grads, sim_calls), (real_grads, real_calls) in zip(sim, real):
        assert sim_calls == real_calls
        for s, r in zip(sim_grads, real_grads):
            assert_close_dicts(s, r, rtol=0, atol=0)
