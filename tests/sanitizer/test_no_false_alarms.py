"""Correct client code runs clean with the sanitizer on, and the sanitizer was active over it.

Each test runs an existing client body (tests/clients) with ``check_async=True``
said explicitly and checks its result against the same reference the client
test uses; ``checked`` proves ops were checked against calls in flight (DDP
excepted: simdist's ``Work.get_future()`` waits at once, so its comm hooks
leave nothing in flight). The last test is the sanitizer's own: correct code
whose ranks' helper threads first use the sanitizer all at once.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist._run.options import RunOptions
from simdist._sanitizer.mode import checked_ops


def ops_checked_since(before: int) -> int:
    return checked_ops[0] - before


@pytest.mark.parametrize("hook", ["none", "default", "own"])
def test_ddp_with_buckets_and_comm_hooks(hook: str) -> None:
    from client_models import assert_close_dicts
    from test_client_ddp import WORLD, ddp_body, reference

    want = reference(2)
    for got, _ in simdist.run(ddp_body, world_size=WORLD, args=(hook, 2), check_async=True):
        for g, w in zip(got, want):
            assert_close_dicts(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp2_with_explicit_prefetch(reshard: bool) -> None:
    from client_models import assert_close_dicts, mlp, params
    from test_client_fsdp import DIMS, ROWS, train
    from torch.distributed.fsdp import fully_shard

    def body(ctx: simdist.RankContext) -> dict:
        model = mlp(0, DIMS)
        layers = [m for m in model if isinstance(m, torch.nn.Linear)]
        for layer in layers:
            fully_shard(layer, reshard_after_forward=reshard)
        fully_shard(model)
        for a, b in itertools.pairwise(layers):
            a.set_modules_to_forward_prefetch([b])  # type: ignore[operator]  # FSDPModule's method
            b.set_modules_to_backward_prefetch([a])  # type: ignore[operator]  # FSDPModule's method
        train(model, slice(ctx.rank * ROWS, (ctx.rank + 1) * ROWS), ctx.world_size)
        return {n: p.full_tensor() for n, p in model.named_parameters()}

    before = checked_ops[0]
    reference = mlp(0, DIMS)
    train(reference, slice(None), 2)
    for got in simdist.run(body, world_size=2, check_async=True):
        assert_close_dicts(got, params(reference), rtol=1e-10, atol=1e-12)
    assert ops_checked_since(before) > 0


@pytest.mark.parametrize(
    "name", ["GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"]
)
def test_pipelining_schedules(name: str) -> None:
    from test_client_pipelining import MICRO, SCHEDULES, WORLD, pipeline_body, reference

    if name not in SCHEDULES:
        pytest.skip(f"{name} is not among the client test's schedules: {sorted(SCHEDULES)}")
    before = checked_ops[0]
    want_losses, _ = reference()
    per_rank = simdist.run(pipeline_body, world_size=WORLD, args=(name,), check_async=True)
    losses = [l for rank_losses, _ in per_rank for l in rank_losses]
    assert len(losses) == MICRO
    assert losses == pytest.approx(want_losses, rel=1e-12)
    assert ops_checked_since(before) > 0


def test_dtensor_tensor_parallel_block() -> None:
    from test_client_dtensor import tp_body

    before = checked_ops[0]
    results = simdist.run(tp_body, world_size=2, check_async=True)
    baseline = simdist.run(tp_body, world_size=2, check_async=False)
    for (loss, grads), (want_loss, want_grads) in zip(results, baseline):
        assert loss == want_loss
        for name, g in grads.items():
            assert torch.equal(g, want_grads[name]), name
    assert ops_checked_since(before) > 0


@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")  # still in wide use
@pytest.mark.parametrize(
    "name",
    [
        "funcol.all_gather_tensor_autograd",
        "funcol.reduce_scatter_tensor_autograd",
        "funcol.all_to_all_single_autograd",
    ],
)
def test_functional_collectives_with_autograd(name: str) -> None:
    from test_client_functional import WORLD, functional_body

    got = simdist.run(functional_body, world_size=WORLD, args=(name,), check_async=True)
    want = simdist.run(functional_body, world_size=WORLD, args=(name,), check_async=False)
    for (a, b), (c, d) in zip(got, want):
        assert torch.equal(a, c) and torch.equal(b, d)


def test_megatron_column_then_row_parallel_linear() -> None:
    pytest.importorskip("megatron.core")
    from test_client_megatron import mlp_body, mlp_reference

    before = checked_ops[0]
    want_y, want_x, want_w1, want_w2 = mlp_reference()
    tp = 2
    f = want_w1.shape[0] // tp
    # ColumnParallelLinear's backward all-reduces the input gradient
    # asynchronously while it computes the weight gradient: overlap on CPU.
    for rank, (y, x_grad, w1_grad, w2_grad) in enumerate(
        simdist.run(mlp_body, world_size=tp, args=(tp, False), check_async=True)
    ):
        torch.testing.assert_close(y, want_y, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(x_grad, want_x, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(w1_grad, want_w1[rank * f : (rank + 1) * f], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(w2_grad, want_w2[:, rank * f : (rank + 1) * f], rtol=1e-12, atol=1e-12)
    assert ops_checked_since(before) > 0


def test_the_draft_loss_worker_under_context_parallel() -> None:
    from cotrain_harness import check_parity, config_for

    before = checked_ops[0]
    check_parity(simdist.Layout(cp=2, dp=2), config_for(torch.float32), "uneven", 2, seq_len=12)
    assert ops_checked_since(before) > 0


def helpers_reduce_at_once(ctx: simdist.RankContext) -> float:
    # Every rank starts a helper at once, and the helper's synchronous
    # all_reduce goes in flight (a rank with helpers keeps checking): the
    # ranks' first use of the sanitizer may come from any thread.
    out: list[object] = []

    def work() -> None:
        try:
            t = torch.ones(1) * ctx.rank
            dist.all_reduce(t)
            out.append(t.item())
        except BaseException as e:  # the helper's error is the rank's (a false alarm shows as itself)
            out.append(e)

    helper = threading.Thread(target=work)
    helper.start()
    helper.join()
    [got] = out
    if isinstance(got, BaseException):
        raise got
    assert isinstance(got, float)
    return got


@pytest.mark.parametrize("schedule", ["rank", "random", "concurrent"])
def test_the_books_are_one_list_whichever_thread_makes_them(
    schedule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Making the books is slowed so that threads of a concurrent schedule
    # overlap in it: each one that made its own list kept its call in a book
    # nobody waited on, and reported the next read as a race.
    import simdist._sanitizer as sanitizer
    from simdist._sanitizer.book import RankBook

    made = RankBook.__init__

    def slow(self: RankBook, *args: object, **kwargs: object) -> None:
        time.sleep(0.002)
        made(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RankBook, "__init__", slow)
    for _ in range(5):
        got = simdist.run(helpers_reduce_at_once, world_size=4, schedule=schedule, check_async=True)
        assert got == [6.0] * 4

    # And directly: threads asking at once all get the list that is kept.
    class World:
        world_size = 4
        options = RunOptions(world_size=4, check_async=True)

    world = World()
    start = threading.Barrier(4)
    lists: list[object] = []

    def ask() -> None:
        start.wait(timeout=10)
        lists.append(sanitizer._books(world))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(lists) == 4 and all(b is world.__dict__[sanitizer._KEY] for b in lists)
