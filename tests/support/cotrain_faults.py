"""Fault injection for the co-training step: fail a step at a named point on one
rank, then retry the same batch in a fresh world with the same workers.

A failed collective world cannot be reused (real jobs rebuild their
communicators), so each attempt is its own ``simdist.run``; the workers (model
shards, optimizer state, draft step state) live outside the runs, keyed by rank.
"""

from __future__ import annotations

import torch
from cotrain_harness import config_for, groups_of, make_global_batch, rank_batch

import simdist
from draft_loss.cotrain import CotrainWorker, StepResult
from simdist import Layout

LAYOUT = Layout(tp=2, dp=2, pp=2)
MICROBATCHES = 2


class InjectedFault(Exception):
    pass


def fault_points(layout: Layout, microbatches: int) -> list[str]:
    """Every probe point of a split step that all ranks pass through."""
    points = []
    for k in range(microbatches):
        points += [f"split:microbatch:{k}:{where}" for where in ("forward", "backward", "accumulated")]
    points += [
        "split:before_count_reduction",
        "split:after_count_reduction",
        "split:after_gradient_reduction",
        "split:during_correction",
        "split:after_grad_norms",
        "split:optimizer:0",
        "split:optimizer:2",
    ]
    return points


def _batches(layout: Layout, config):
    return [make_global_batch("uneven", layout.dp, config, seed=seed, cp=layout.cp) for seed in (1, 2)]


def _step_body(ctx, workers, config, global_batch, create, fault_rank, fault_point):
    if create:
        workers[ctx.rank] = CotrainWorker(config, groups_of(ctx))
    worker = workers[ctx.rank]
    worker.bind(groups_of(ctx))

    def probe(point: str) -> None:
        if ctx.rank == fault_rank and point == fault_point:
            raise InjectedFault(point)

    return worker.train_step(
        rank_batch(ctx, global_batch), mode="split", num_microbatches=MICROBATCHES, probe=probe
    )


def clean_run(layout: Layout = LAYOUT, **overrides) -> list[StepResult]:
    """Two clean steps; returns every rank's second step."""
    config = config_for(**overrides)
    workers: dict[int, CotrainWorker] = {}
    first, second = _batches(layout, config)
    simdist.run(_step_body, layout=layout, args=(workers, config, first, True, None, None), share_args=True)
    return simdist.run(
        _step_body, layout=layout, args=(workers, config, second, False, None, None), share_args=True
    )


def snapshot(worker: CotrainWorker) -> dict[str, torch.Tensor]:
    state = {f"param:{n}": v.clone() for n, v in worker.master.items()}
    state |= {f"model:{n}": p.detach().clone() for n, p in worker.params.items()}
    state |= {f"momentum:{n}": v.clone() for n, v in worker.optimizer.buffers.items()}
    return state


def faulty_then_retry(layout: Layout, fault_rank: int, fault_point: str, **overrides):
    """Step 1 clean; step 2 fails at ``fault_point`` on ``fault_rank``; step 2 retried.

    Returns (the failed run's RankError, per-rank worker snapshots before and
    after the failed attempt, the workers, the retried step's results).
    """
    config = config_for(**overrides)
    workers: dict[int, CotrainWorker] = {}
    first, second = _batches(layout, config)
    simdist.run(_step_body, layout=layout, args=(workers, config, first, True, None, None), share_args=True)
    before = {rank: snapshot(w) for rank, w in workers.items()}
    try:
        simdist.run(
            _step_body,
            layout=layout,
            args=(workers, config, second, False, fault_rank, fault_point),
            share_args=True,
        )
    except simdist.RankError as error:
        failure = error
    else:
        raise AssertionError(f"the fault at {fault_point!r} on rank {fault_rank} was never reached")
    after = {rank: snapshot(w) for rank, w in workers.items()}
    states = {
        rank: (w.draft_state.phase.value, w.draft_state.num_microbatches) for rank, w in workers.items()
    }
    leftovers = {
        rank: [n for n, p in w.params.items() if p.grad is not None or hasattr(p, "main_grad")]
        for rank, w in workers.items()
    }
    retried = simdist.run(
        _step_body, layout=layout, args=(workers, config, second, False, None, None), share_args=True
    )
    return failure, before, after, states, leftovers, retried


def assert_bitwise_equal(actual: list[StepResult], expected: list[StepResult]) -> None:
    for rank, (a, e) in enumerate(zip(actual, expected)):
        assert a.metrics == e.metrics, f"rank {rank}: metrics {a.metrics} != {e.metrics}"
        assert a.grad_norms == e.grad_norms, f"rank {rank}: grad norms {a.grad_norms} != {e.grad_norms}"
        assert a.clip_coefficients == e.clip_coefficients, f"rank {rank}: clip coefficients differ"
        assert a.skipped == e.skipped
        for kind in ("grads", "params"):
            got, want = getattr(a, kind), getattr(e, kind)
            assert got.keys() == want.keys()
            for name in want:
                assert torch.equal(got[name], want[name]), (
                    f"rank {rank}: {kind} {name} differs from the clean run"
                )
