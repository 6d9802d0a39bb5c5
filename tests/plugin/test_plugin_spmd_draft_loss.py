"""A subset of draft_loss's suite written as SPMD tests with ``@pytest.mark.simdist``.

Each body runs on every rank and checks its own rank's results against an
independent float64 single-process reference. The same file runs on real gloo
worlds (``--simdist-backend=gloo``, see test_plugin_backends.py), which
compares what each rank saw on both backends.

When the environment variable ``SIMDIST_SPMD_RESULTS`` names a folder, each
rank also saves what it computed there, so two runs can be compared.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from cotrain_harness import (
    TOLERANCES,
    config_for,
    groups_of,
    local_batch,
    make_global_batch,
    reference_of,
    shard,
)
from soft_ce_reference import reference_gradient, reference_stats

import simdist
from draft_loss import DraftLossStats, soft_cross_entropy
from draft_loss.cotrain import CotrainWorker
from draft_loss.step_state import DraftStepState
from simdist import Layout

RESULTS_ENV = "SIMDIST_SPMD_RESULTS"


@pytest.fixture
def results_dir() -> str | None:
    return os.environ.get(RESULTS_ENV)


def save(results_dir: str | None, ctx: simdist.RankContext, name: str, value: object) -> None:
    if results_dir is not None:
        world = "x".join(str(getattr(ctx.layout, a)) for a in ("tp", "cp", "dp", "pp"))
        torch.save(value, os.path.join(results_dir, f"{name}-{world}-rank{ctx.rank}.pt"))


def vocab_inputs(seed: int, tokens: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return dict(
        student=torch.randn(tokens, vocab, generator=g, dtype=torch.float64) * 3,
        teacher=torch.randn(tokens, vocab, generator=g, dtype=torch.float64) * 3,
        mask=(torch.rand(tokens, generator=g) < 0.75).to(torch.float64),
        bin_ids=torch.randint(0, 3, (tokens,), generator=g),
        weights=torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64),
        upstream=torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64),
    )


@pytest.mark.simdist(layouts=[Layout(tp=2), Layout(tp=4)])
@pytest.mark.parametrize("chunk", [3, 64], ids=["streaming", "cached"])
def test_vocab_parallel_soft_ce_equals_the_full_vocabulary(ctx, chunk, results_dir) -> None:
    tp, rank = ctx.layout.tp, ctx.coords.tp
    inputs = vocab_inputs(seed=7, tokens=11, vocab=4 * tp + 1)  # shards of unequal size
    bounds = torch.linspace(0, inputs["student"].shape[-1], tp + 1).round().long().tolist()
    cols = slice(bounds[rank], bounds[rank + 1])
    student = inputs["student"][:, cols].clone().requires_grad_(True)
    stats = soft_cross_entropy(
        student,
        inputs["teacher"][:, cols],
        inputs["mask"],
        tp_group=ctx.groups.tp,
        token_chunk_size=chunk,
        bin_ids=inputs["bin_ids"],
        weights=inputs["weights"],
    )
    (stats.numerators * inputs["upstream"]).sum().backward()
    ref = reference_stats(
        inputs["student"], inputs["teacher"], inputs["mask"], inputs["bin_ids"], inputs["weights"]
    )
    ref_grad = reference_gradient(
        inputs["student"],
        inputs["teacher"],
        inputs["mask"],
        inputs["upstream"],
        inputs["bin_ids"],
        inputs["weights"],
    )
    torch.testing.assert_close(stats.numerators.detach(), ref.numerators.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(stats.counts, ref.counts, rtol=0, atol=0)
    torch.testing.assert_close(student.grad, ref_grad[:, cols], rtol=1e-10, atol=1e-12)
    save(results_dir, ctx, f"soft_ce-{chunk}", (stats.numerators.detach(), student.grad))


@pytest.mark.simdist(layouts=[Layout(dp=2), Layout(dp=4)])
def test_step_state_counts_ride_one_dp_all_reduce(ctx, results_dir) -> None:
    """Every DP rank ends with the float64 sums of all ranks' microbatches."""
    dp = ctx.layout.dp

    def microbatch(rank: int, k: int) -> DraftLossStats:
        g = torch.Generator().manual_seed(100 * rank + k)
        return DraftLossStats(
            torch.rand(3, generator=g) * 5,
            torch.randint(0, 9, (3,), generator=g).float(),
            torch.tensor([1.0, 0.5, 2.0]),
        )

    state = DraftStepState()
    state.begin_step()
    for k in range(ctx.rank + 1):  # ranks accumulate different numbers of microbatches
        state.accumulate(microbatch(ctx.rank, k))
    payload = state.contribute_counts()
    dist.all_reduce(payload, group=ctx.groups.dp)
    state.record_global_counts(payload)
    metrics = state.metrics()

    every = [microbatch(r, k) for r in range(dp) for k in range(r + 1)]
    counts = sum(m.counts.double() for m in every)
    numerators = sum(m.numerators.double() for m in every)
    weights = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    torch.testing.assert_close(metrics.counts, counts, rtol=0, atol=0)
    torch.testing.assert_close(metrics.numerators, numerators, rtol=1e-15, atol=0)
    assert metrics.weighted_count == pytest.approx(float(weights @ counts), rel=1e-15)
    save(results_dir, ctx, "step_state", (metrics.counts, metrics.numerators))


@pytest.mark.simdist(layouts=[Layout(tp=2, dp=2), Layout(dp=2, pp=2)])
def test_split_step_equals_the_float64_reference(ctx, results_dir) -> None:
    config = config_for()
    global_batch = make_global_batch("uneven", ctx.layout.dp, config)
    worker = CotrainWorker(config, groups_of(ctx))
    result = worker.train_step(local_batch(global_batch, ctx.coords.dp), mode="split", num_microbatches=2)
    assert not result.skipped
    ref = reference_of(config, global_batch)
    rtol, atol_fraction = TOLERANCES[torch.float32]["vs_reference"]
    grad_scale = max(float(t.abs().max()) for t in ref.grads.values() if t.numel())
    for name, grad in result.grads.items():
        expected = shard(ref.grads[name], name, ctx.coords.tp, ctx.layout.tp).to(torch.float32)
        torch.testing.assert_close(
            grad, expected, rtol=rtol, atol=atol_fraction * grad_scale, msg=lambda m: f"{name}: {m}"
        )
    for metric, value in result.metrics.items():
        assert value == pytest.approx(ref.metrics[metric], rel=rtol, abs=atol_fraction), metric
    save(results_dir, ctx, "split_step", (result.grads, result.metrics))
