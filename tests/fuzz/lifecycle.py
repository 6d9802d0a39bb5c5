"""Lifecycles of the co-training step: several steps of one set of workers, with
aborted attempts, retries and dropped steps between them, each applied step
judged against an independent float64 step from the state the workers
started it from.

The machine's state is the workers (model shards, fp32 master parameters,
momentum buffers, the draft step state), kept across worlds by rank as a real
job's processes outlive a communicator rebuilt after a failure. Its rules are
the steps of a ``LifecycleCase``, plain data (a program), so a failing
lifecycle shrinks like any case (fewer steps, simpler steps) and replays from
its JSON form without Hypothesis:

* ``step``: one ``train_step`` in its mode and microbatch split (any split the
  rank's rows allow), on a batch of its own data seed;
* a step with a ``fault``: a probe raises at that point on that rank during
  the first attempt; every rank's step must then fail, nothing be applied
  (parameters, momentum bitwise unchanged, the draft state idle, no main
  grads left), and with ``retry`` the same batch runs again and must equal
  the model's step; without, the step is dropped and the next one starts from
  the same state (a probe point the rank never reaches changes nothing: the
  step then counts as done).

The reference (``cotrain_reference.reference_step`` with its momentum)
shares no code with draft_loss. It starts each step from the workers' own
master parameters and momentum buffers (gathered over TP shards), the first
from the model's initial values, so by induction every applied step is a
correct step: a bug that carries state from one step into the next (a
count, a cached tile, a draft state not reset, momentum written wrong) makes
that step differ from it, where a clean rerun of the same code would agree
with itself.

Why not one float64 model chained over the whole run: training is not
well conditioned. A correct float32 program (dp=4, 3 steps, 3 tokens, a
policy loss of 16; in fixtures/regressions) has step-2 gradients that move
1,000 times as far as its parameters: the workers' parameters, a few float32 roundings
from the chained model's after two steps (4e-6), gave gradients 4.6e-3
away from it, while their step from their own parameters was 2.6e-6 off
float64 maths. A float32 replay of the program (the shadow) is one draw of
that amplification, 30 times where the workers drew 1,000: no spread of it
bounds the next draw. One step from a known state is what float32 rounds
once, which the shadow does measure (``draft_runs.SHADOW_SPREAD``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from cotrain_harness import groups_of, shard, shard_dim
from cotrain_reference import reference_step
from draft_cases import DraftCase, draft_cases, probe_points
from draft_runs import MASTER_U, RUN_TIMEOUT_S, SHADOW_SPREAD, ProbeFault, check_replicas_agree, rank_batch
from hypothesis import strategies as st

import simdist
from draft_loss.cotrain import METRIC_NAMES, CotrainWorker, StepAbortedError, full_initial_parameters

# float32 and float64 keep the model's parameters within float32's rounding of
# the float64 model's; bfloat16 parameters round by as much as an update (see
# draft_runs.check_updates), so several steps of them say nothing more.
LIFECYCLE_DTYPES = ("float32", "float64")
MAX_STEPS = 4


@dataclass(frozen=True)
class LifecycleCase:
    """A base case (layout, shapes, config) and the program of steps run on it."""

    base: DraftCase
    steps: tuple[Mapping[str, Any], ...]  # {"mode", "microbatches", "data_seed", "fault", "retry"}

    def to_json(self) -> dict[str, Any]:
        return {"base": self.base.to_json(), "steps": [dict(step) for step in self.steps]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LifecycleCase:
        steps = tuple(
            {**step, "fault": None if step.get("fault") is None else dict(step["fault"])}
            for step in data["steps"]
        )
        return cls(DraftCase.from_json(data["base"]), steps)

    def cover(self) -> dict[str, Any]:
        faults = [step for step in self.steps if step["fault"] is not None]
        return {
            **self.base.cover(),
            "steps": len(self.steps),
            "aborted_steps": len(faults),
            "retried_steps": sum(1 for step in faults if step["retry"]),
            "split_changes": len({step["microbatches"] for step in self.steps}) > 1,
        }


@st.composite
def lifecycle_cases(draw: st.DrawFn, *, max_world: int | None = None) -> LifecycleCase:
    base = draw(draft_cases(max_world=max_world, dtypes=LIFECYCLE_DTYPES))
    # A rank's rows bound the split: every microbatch needs a row.
    most = min(len(micro) for rank in base.masks for micro in rank) * base.microbatches
    count = draw(st.integers(2, MAX_STEPS))
    steps = []
    world = base.layout.world_size
    for _ in range(MAX_STEPS):  # drawn whatever the count: the same choices in every case
        mode = draw(st.sampled_from(("split", "monolithic")))
        microbatches = draw(st.integers(1, 4))
        microbatches = min(microbatches, most) if mode == "split" else 1
        faulty = draw(st.booleans())
        point = draw(st.sampled_from(probe_points(4, mode, base.num_layers)))
        if ":microbatch:" in point and mode == "split":
            # A point of a microbatch this split does not have never fires: keep it in range.
            k = int(point.split(":")[2])
            point = point.replace(f":microbatch:{k}:", f":microbatch:{k % microbatches}:")
        rank = draw(st.integers(0, world - 1))
        retry = draw(st.booleans())
        data_seed = draw(st.integers(0, 2**16))
        fault = {"probe": point, "rank": rank} if faulty else None
        steps.append(
            {
                "mode": mode,
                "microbatches": microbatches,
                "data_seed": data_seed,
                "fault": fault,
                "retry": retry,
            }
        )
    return LifecycleCase(replace(base, fault=None, warmup=False), tuple(steps[:count]))


# ------------------------------------------------------------------ running


def _step_body(ctx, workers: dict, config, batches, step: Mapping[str, Any], faulty: bool):
    if ctx.rank not in workers:
        workers[ctx.rank] = CotrainWorker(config, groups_of(ctx))
    worker = workers[ctx.rank]
    worker.bind(groups_of(ctx))
    probe = None
    fault = step["fault"]
    if faulty and fault is not None and ctx.rank == fault["rank"]:

        def probe(reached: str) -> None:
            if reached == fault["probe"]:
                raise ProbeFault(f"probe fault at {reached!r} on rank {ctx.rank}")

    return worker.train_step(
        rank_batch(ctx, batches), mode=step["mode"], num_microbatches=step["microbatches"], probe=probe
    )


def _snapshot(workers: dict) -> dict[int, dict[str, torch.Tensor]]:
    out = {}
    for rank, worker in workers.items():
        state = {f"master:{n}": v.clone() for n, v in worker.master.items()}
        state |= {f"momentum:{n}": v.clone() for n, v in worker.optimizer.buffers.items()}
        state |= {f"model:{n}": p.detach().clone() for n, p in worker.params.items()}
        out[rank] = state
    return out


class Model:
    """A float64 model of applied steps: master parameters and momentum buffers, full size.

    It starts from the model's initial values, or (``starting_from``) from a
    state gathered from the workers. ``dtype=torch.float32`` makes a shadow:
    the same steps with every operation rounded to float32, so its distance
    from the float64 model is what float32 costs these very steps (see
    ``shadow_distance``)."""

    def __init__(self, config, dtype: torch.dtype = torch.float64) -> None:
        self.config = config
        self.dtype = dtype
        initial = full_initial_parameters(config)
        # The workers start from the float64 values rounded through the model dtype.
        self.master = {n: v.to(config.dtype).to(dtype) for n, v in initial.items()}
        self.initial = {n: v.clone() for n, v in self.master.items()}
        self.momentum: dict[str, torch.Tensor] | None = None
        self.initial_momentum: dict[str, torch.Tensor] | None = None
        self.batches: list[Any] = []  # the global batch of every applied step
        self.from_workers = False

    @classmethod
    def starting_from(
        cls,
        config,
        master: Mapping[str, torch.Tensor],
        momentum: Mapping[str, torch.Tensor] | None,
        dtype: torch.dtype = torch.float64,
    ) -> Model:
        """A model whose steps start from ``master`` and ``momentum`` (full tensors)."""
        model = cls(config, dtype)
        model.master = {n: v.to(dtype).clone() for n, v in master.items()}
        model.initial = {n: v.clone() for n, v in model.master.items()}
        if momentum is not None:
            model.momentum = {n: v.to(dtype).clone() for n, v in momentum.items()}
            model.initial_momentum = {n: v.clone() for n, v in model.momentum.items()}
        model.from_workers = True
        return model

    def step(self, global_batch) -> Any:
        self.batches.append(global_batch)
        # The workers' forward reads their parameters in the model dtype (master rounded).
        forward = {
            n: v.to(torch.float32).to(self.config.dtype).to(self.dtype) for n, v in self.master.items()
        }
        result = reference_step(self.config, forward, *global_batch, momentum=self.momentum, dtype=self.dtype)
        # reference_step applies the update to the rounded parameters; the
        # workers apply it to their fp32 master: do the same from ours.
        self.master = {n: self.master[n] - (forward[n] - result.params[n]) for n in self.master}
        self.momentum = result.momentum
        return result


def shadow_distance(model: Model) -> tuple[float, float]:
    """The float32 shadow of ``model``'s applied steps from the same start: its
    worst distance from the float64 model in the parameters' change since the
    start and in the momentum buffers, each a fraction of the float64 model's
    largest entry."""
    if model.from_workers:
        shadow = Model.starting_from(model.config, model.initial, model.initial_momentum, torch.float32)
    else:
        shadow = Model(model.config, torch.float32)
    for batch in model.batches:
        shadow.step(batch)
    change = {n: model.master[n] - model.initial[n] for n in model.master}
    shadow_change = {n: shadow.master[n].double() - shadow.initial[n].double() for n in shadow.master}
    momentum, shadow_momentum = model.momentum or {}, shadow.momentum or {}
    return _fraction(shadow_change, change), _fraction(shadow_momentum, momentum)


def _fraction(actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> float:
    scale = max((float(v.abs().max()) for v in expected.values() if v.numel()), default=0.0) or 1.0
    error = max(
        (float((actual[n].double() - v).abs().max()) for n, v in expected.items() if v.numel()), default=0.0
    )
    return error / scale


def gathered_state(
    base: DraftCase, workers: Mapping[int, CotrainWorker]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """The workers' master parameters and momentum buffers as full float64
    tensors: each TP shard from the ranks of DP and CP coordinate 0 (every
    other rank is checked against these after the step)."""
    layout = base.layout
    pieces: dict[str, dict[str, dict[int, torch.Tensor]]] = {"master": {}, "momentum": {}}
    for rank, worker in workers.items():
        coords = layout.coords(rank)
        if coords.dp or coords.cp:
            continue
        for name, value in worker.master.items():
            pieces["master"].setdefault(name, {})[coords.tp] = value
        for name, value in worker.optimizer.buffers.items():
            pieces["momentum"].setdefault(name, {})[coords.tp] = value
    full = {}
    for kind, by_name in pieces.items():
        full[kind] = {}
        for name, shards in by_name.items():
            dim = shard_dim(name)
            ordered = [shards[tp] for tp in sorted(shards)]
            value = ordered[0] if dim is None else torch.cat(ordered, dim=dim)
            full[kind][name] = value.to(torch.float64)
    return full["master"], (full["momentum"] or None)


def run_lifecycle(case: LifecycleCase, *, workers: dict | None = None) -> None:
    """Runs and judges ``case``; ``workers`` (empty), if given, keeps the
    workers by rank for the caller to inspect."""
    base = case.base
    config = base.config()
    workers = {} if workers is None else workers
    run_kwargs = dict(
        layout=base.layout, timeout=RUN_TIMEOUT_S, share_args=True, **base.reduction_choice.run_kwargs()
    )
    applied = 0

    def judge(results, global_batch, start: Model, what: str) -> None:
        nonlocal applied
        applied += 1
        _check_step(base, results, workers, start.step(global_batch), start, applied, what)

    with base.blocks():
        for index, step in enumerate(case.steps):
            batches = base.batches(data_seed=step["data_seed"])
            global_batch = tuple(
                torch.cat([getattr(b, f) for b in batches]) for f in ("tokens", "mask", "bin_ids")
            )
            what = f"step {index} ({step['mode']}, {step['microbatches']} microbatch(es))"
            # The state this step starts from: the model's initial values until a
            # step is applied (which checks the workers' initialisation too).
            start = Model.starting_from(config, *gathered_state(base, workers)) if applied else Model(config)
            if step["fault"] is not None:
                before = _snapshot(workers)
                try:
                    results = simdist.run(
                        _step_body, args=(workers, config, batches, step, True), **run_kwargs
                    )
                except simdist.RankError as error:
                    _check_aborted(error, before, workers, f"{what}, faulty attempt")
                    if not step["retry"]:
                        continue
                else:
                    # The point was never reached on that rank: a clean step.
                    judge(results, global_batch, start, what)
                    continue
            results = simdist.run(_step_body, args=(workers, config, batches, step, False), **run_kwargs)
            judge(results, global_batch, start, what)


def _check_aborted(error: simdist.RankError, before, workers: dict, what: str) -> None:
    unexpected = {
        rank: f"{type(f).__name__}: {f}"
        for rank, f in error.failures.items()
        if not isinstance(f, (ProbeFault, StepAbortedError))
    }
    assert not unexpected, f"{what}: failures the fault does not explain: {unexpected}"
    after = _snapshot(workers)
    for rank, state in before.items():
        for name, value in state.items():
            assert torch.equal(value, after[rank][name]), (
                f"{what}: rank {rank}'s {name} changed by a failed step"
            )
    for rank, worker in workers.items():
        assert not worker.draft_state.active, (
            f"{what}: rank {rank}'s draft state left {worker.draft_state.phase}"
        )
        left = [n for n, p in worker.params.items() if p.grad is not None or hasattr(p, "main_grad")]
        assert not left, f"{what}: rank {rank} kept gradients of a failed step: {left}"


def _check_step(
    base: DraftCase,
    results: Sequence[Any],
    workers: dict,
    reference: Any,
    model: Model,
    steps: int,
    what: str,
) -> None:
    """Every rank against ``model``, the float64 step from the state the step
    started from (``steps``: applied steps so far, this one included): its
    metrics, its master parameters' change in the step and its momentum
    buffers (TP shards of the model's), at float32's tolerances of one step,
    or, where the step's float32 shadow is further from the model than those
    allow, at ``SHADOW_SPREAD`` times the shadow's distance (computed only
    then: most steps never need it)."""
    check_replicas_agree(base, list(results), what)
    rtol, atol_fraction = 1e-4, 1e-4
    for rank, result in enumerate(results):
        for metric in METRIC_NAMES:
            got, want = result.metrics[metric], reference.metrics[metric]
            assert abs(got - want) <= 1e-4 + 1e-4 * abs(want), (
                f"{what}: rank {rank} metric {metric} {got} != {want}"
            )
    try:
        _check_state(base, results, workers, model, steps, what, rtol, (atol_fraction, atol_fraction))
    except AssertionError:
        if base.dtype != "float32":  # as draft_runs.check_step: float64 keeps the fixed bound
            raise
        change_cost, momentum_cost = shadow_distance(model)
        widened = (
            max(atol_fraction, SHADOW_SPREAD * change_cost),
            max(atol_fraction, SHADOW_SPREAD * momentum_cost),
        )
        if widened == (atol_fraction, atol_fraction):
            raise
        _check_state(base, results, workers, model, steps, what, rtol, widened)


def _check_state(
    base: DraftCase,
    results: Sequence[Any],
    workers: dict,
    model: Model,
    steps: int,
    what: str,
    rtol: float,
    atol_fractions: tuple[float, float],
) -> None:
    """The master parameters' change in the step and the momentum buffers of
    every rank, each within ``rtol`` of its value plus its ``atol_fractions``
    entry (change, momentum) of the float64 model's largest one."""
    layout = base.layout
    change_atol, momentum_atol = atol_fractions
    change = {n: model.master[n] - model.initial[n] for n in model.master}
    change_scale = max((float(v.abs().max()) for v in change.values() if v.numel()), default=0.0) or 1.0
    momentum = model.momentum or {}
    momentum_scale = max((float(v.abs().max()) for v in momentum.values() if v.numel()), default=0.0) or 1.0
    # The step stores the master parameters rounded to float32 once; a float64
    # model's initial values (not the workers' float32 copies) once more.
    roundings = 1 if model.from_workers or base.dtype != "float64" else 2
    for rank, result in enumerate(results):
        tp_rank = layout.coords(rank).tp
        for name, value in result.params.items():
            initial = shard(model.initial[name], name, tp_rank, layout.tp)
            expected = shard(change[name], name, tp_rank, layout.tp)
            error = (value.to(torch.float64) - initial - expected).abs()
            # The workers' master parameters are float32 whatever the model's
            # dtype: the step stores them rounded, at most u32 of their value,
            # which no fraction of the change covers when the change is tiny
            # (a step of weight decay alone: all masks 0).
            stored = roundings * MASTER_U * (initial + expected).abs()
            allowed = change_atol * change_scale + rtol * expected.abs() + stored
            assert bool((error <= allowed).all()), (
                f"{what}: rank {rank}'s {name} after {steps} applied step(s) is off the float64 step from its start by "
                f"{float(error.max()):.3e} (allowed {change_atol:.1e} x {change_scale:.3e} + {rtol:.0e} x |change| "
                f"+ {roundings} x 2**-24 x |parameter|)"
            )
    for rank, worker in workers.items():
        tp_rank = layout.coords(rank).tp
        assert set(worker.optimizer.buffers) == set(worker.master), (
            f"{what}: rank {rank} momentum buffers missing"
        )
        for name, buffer in worker.optimizer.buffers.items():
            expected = shard(momentum[name], name, tp_rank, layout.tp)
            error = (buffer.to(torch.float64) - expected).abs()
            allowed = momentum_atol * momentum_scale + rtol * expected.abs()
            assert bool((error <= allowed).all()), (
                f"{what}: rank {rank}'s momentum buffer of {name} after {steps} applied step(s) is off the "
                f"float64 step from its start by {float(error.max()):.3e} (allowed {momentum_atol:.1e} x {momentum_scale:.3e} + "
                f"{rtol:.0e} x |buffer|)"
            )
