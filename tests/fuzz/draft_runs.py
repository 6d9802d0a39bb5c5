"""Runs a ``DraftCase`` on simdist and measures it against its references.

Adapters over the parity harness (``cotrain_harness``): the same groups, the
same comparisons (``check_against``) and tolerances (``TOLERANCES``), fed with
a case's per-rank batches instead of the harness' fixed scenarios.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from cotrain_harness import (
    TOLERANCES,
    _close,
    _close_all,
    _flat,
    _within,
    check_against,
    groups_of,
    reference_of,
    shard,
)
from draft_cases import DraftCase, fault_plan_of, spoil
from hypothesis import target
from hypothesis.control import currently_in_test_context

import simdist
from draft_loss.cotrain import (
    METRIC_NAMES,
    CotrainBatch,
    CotrainWorker,
    StepAbortedError,
    StepResult,
    full_initial_parameters,
    shard_batch_for_cp,
)
from simdist import fuzz

RUN_TIMEOUT_S = 120.0


class ProbeFault(Exception):
    """Raised by a probe at the case's fault point (the test's own, not simdist's)."""


# ------------------------------------------------------- coverage and targets

# A property's body may be called directly, outside any Hypothesis test
# (test_fuzz_wiring does), where ``hypothesis.target`` refuses to run: steer
# the search only inside one. ``fuzz.cover`` already does nothing outside one;
# it is looked up at each call so check_mutants.py can count cases through it.


def cover(**features: Any) -> None:
    fuzz.cover(**features)


def steer(score: float, *, label: str) -> None:
    if currently_in_test_context():
        target(score, label=label)


# ----------------------------------------------------------------- valid runs


def rank_batch(ctx, batches: Sequence[CotrainBatch]) -> CotrainBatch:
    """This rank's batch: its DP replica's rows, its CP shard of the sequence."""
    batch = batches[ctx.coords.dp]
    cp = ctx.layout.cp if ctx.layout is not None else 1
    return shard_batch_for_cp(batch, ctx.coords.cp, cp) if cp > 1 else batch


def _modes_body(ctx, case: DraftCase, config, batches: Sequence[CotrainBatch], modes: Sequence[str]):
    batch = rank_batch(ctx, batches)
    out = {}
    for mode in modes:
        worker = CotrainWorker(config, groups_of(ctx))
        out[mode] = worker.train_step(batch, mode=mode, num_microbatches=case.microbatches)
    return out


def run_valid(
    case: DraftCase, modes: Sequence[str], body: Callable[..., Any] = _modes_body
) -> dict[str, list[StepResult]]:
    """Every mode in ``modes`` on one world (fresh workers per mode). Valid input
    must never raise: a SimulationError here (a rank raised, a deadlock, a
    mismatch, a timeout) fails the case as property 5."""
    config = case.config()
    try:
        with case.blocks():
            per_rank = simdist.run(
                body,
                layout=case.layout,
                args=(case, config, case.batches(), tuple(modes)),
                timeout=RUN_TIMEOUT_S,
                **case.reduction_choice.run_kwargs(),
            )
    except simdist.SimulationError as error:
        cause = error.__cause__
        raise AssertionError(
            f"valid input raised {type(error).__name__} (first failure: {type(cause).__name__}: {cause}): {error}"
        ) from error
    return {mode: [r[mode] for r in per_rank] for mode in modes}


# -------------------------------------------------------------- comparisons


def check_replicas_agree(case: DraftCase, results: list[StepResult], mode: str) -> None:
    """DP replicas (ranks with the same TP/CP/PP coordinates) hold bitwise the same
    gradients and parameters after the step: otherwise they drift apart step by step."""
    layout = case.layout
    first: dict[tuple[int, int, int], int] = {}
    for rank, result in enumerate(results):
        coords = layout.coords(rank)
        peer = first.setdefault((coords.tp, coords.cp, coords.pp), rank)
        if peer == rank:
            continue
        for kind in ("grads", "params"):
            mine, theirs = getattr(result, kind), getattr(results[peer], kind)
            for name, value in mine.items():
                assert torch.equal(value, theirs[name]), (
                    f"{mode}: DP replicas diverge: rank {rank}'s {kind[:-1]} {name} differs from rank {peer}'s "
                    f"(same tp/cp/pp coordinates), max difference {float((value - theirs[name]).abs().max()):.3e}"
                )


def agreed_representatives(case: DraftCase, results_by_mode: Mapping[str, list[StepResult]]) -> list[int]:
    """Check that DP replicas agree bitwise in every mode (``check_replicas_agree``),
    then return the lowest rank of each set of replicas (same TP/CP/PP coordinates).

    Every other rank then holds bitwise the same gradients and parameters as its
    representative, and ``check_ranks_agree`` the same metrics and grad norms as
    every rank, so a comparison with an expectation that is the same for the
    replicas (the float64 reference sharded by TP rank; the other mode's
    results, whose replicas agree too) gives each replica its representative's
    outcome, and the first failing rank in rank order is a representative.
    Comparing the representatives alone checks exactly what comparing every
    rank checks. The check and the list come together so that no caller can
    judge ranks through representatives whose replicas were never compared.
    """
    for mode, results in results_by_mode.items():
        check_replicas_agree(case, results, mode)
    layout = case.layout
    first: dict[tuple[int, int, int], int] = {}
    for rank in range(layout.world_size):
        coords = layout.coords(rank)
        first.setdefault((coords.tp, coords.cp, coords.pp), rank)
    return sorted(first.values())


# The unit roundoff of the workers' float32 master parameters (also lifecycle's).
MASTER_U = 2.0**-24


def check_updates(
    case: DraftCase, results: list[StepResult], reference: Any, ranks: Iterable[int] | None = None
) -> float:
    """float32 and float64: each rank's applied update (parameters after minus before) equals
    the reference's, judged at the scale of the update, not of the parameters.

    The parameters themselves are compared at their own scale (about init_std),
    where a step's update (about lr x grad) is small: a wrong clip coefficient
    or a wrong normalisation can hide in that tolerance, but not in this one.
    The reference's update is float64 from the same rounded initial values.
    The workers' master parameters are float32 whatever the model's dtype: a
    parameter after the step carries up to 2**-24 x |p| of rounding (twice in
    float64, whose initial values are rounded to float32 too). That is far
    below 1e-4 of the largest update unless the update is tiny (weight decay
    alone, every mask 0: a clean campaign failed such a float64 step by 2.1e-7
    where 1.1e-7 was allowed), so it is allowed on top. Returns the worst
    error / tolerance.
    bfloat16 is not judged here: rounding a parameter to 8 bits is as large as
    the update itself. ``ranks``: those ranks only (see ``agreed_representatives``).
    """
    if case.dtype not in ("float32", "float64"):
        return 0.0
    rtol, atol_fraction = 1e-4, 1e-4
    config = case.config()
    initial = {n: v.to(config.dtype).to(torch.float64) for n, v in full_initial_parameters(config).items()}
    updates = {n: reference.params[n].to(torch.float64) - initial[n] for n in initial}
    scale = max((float(u.abs().max()) for u in updates.values() if u.numel()), default=0.0) or 1.0
    worst = 0.0
    layout = case.layout

    roundings = 2 if case.dtype == "float64" else 1

    def ratio_of(
        actual: torch.Tensor, expected: torch.Tensor, before: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        error = (actual - expected).abs()
        stored = roundings * MASTER_U * (before + expected).abs()
        allowed = atol_fraction * scale + rtol * expected.abs() + stored
        ratio = float((error / allowed).max()) if error.numel() else 0.0
        return (ratio if ratio == ratio else float("inf")), error

    for rank in range(len(results)) if ranks is None else ranks:
        result = results[rank]
        tp_rank = layout.coords(rank).tp
        expected = {name: shard(updates[name], name, tp_rank, layout.tp) for name in result.params}
        before = {name: shard(initial[name], name, tp_rank, layout.tp) for name in result.params}
        # Elementwise: the rank's parameters as one vector (see cotrain_harness._flat);
        # tensor by tensor only to name the first one out of tolerance.
        flat = _flat_ratio(result.params, before, expected, ratio_of)
        if flat is not None and flat <= 1.0:
            worst = max(worst, flat)
            continue
        for name, param in result.params.items():
            ratio, error = ratio_of(param.to(torch.float64) - before[name], expected[name], before[name])
            if ratio > 1.0:
                raise AssertionError(
                    f"rank {rank} applied update of {name}: error {float(error.max()):.3e} is {ratio:.2f}x the "
                    f"tolerance (rtol={rtol}, atol={atol_fraction} x largest update {scale:.3e} "
                    f"+ {roundings} x 2**-24 x |parameter|)"
                )
            worst = max(worst, ratio)
    return worst


def _flat_ratio(
    params: Mapping[str, torch.Tensor],
    before: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    ratio_of: Callable[..., tuple[float, torch.Tensor]],
) -> float | None:
    """``ratio_of`` over every parameter at once; None when shapes differ (judged tensor by tensor then)."""
    if any(p.shape != before[n].shape or p.shape != expected[n].shape for n, p in params.items()):
        return None
    flat_before = _flat(before[n] for n in params)
    ratio, _ = ratio_of(_flat(params.values()) - flat_before, _flat(expected[n] for n in params), flat_before)
    return ratio


def worst_ratio(
    case: DraftCase,
    results: list[StepResult],
    expected: Callable[[int], Any],
    *,
    rtol: float,
    atol_fraction: float,
    tp_sharded_expected: bool,
    gradients: bool = True,
    ranks: Iterable[int] | None = None,
) -> float:
    """Largest ``error / allowed`` over everything ``check_against`` compares
    (1.0 is the tolerance): the figure ``hypothesis.target`` maximises.
    ``gradients=False`` leaves out the gradients and grad norms; ``ranks``:
    those ranks only (see ``agreed_representatives``)."""
    layout = case.layout
    sample = expected(0)
    grad_scale = max((float(t.abs().max()) for t in sample.grads.values() if t.numel()), default=0.0) or 1.0
    param_scale = max((float(t.abs().max()) for t in sample.params.values() if t.numel()), default=0.0) or 1.0
    worst = 0.0

    def ratio(actual: torch.Tensor, reference: torch.Tensor, atol: float) -> float:
        actual, reference = actual.to(torch.float64), reference.to(torch.float64)
        error = (actual - reference).abs()
        allowed = atol + rtol * reference.abs()
        value = float((error / allowed).max()) if error.numel() else 0.0
        return value if value == value else float("inf")  # NaN: infinitely wrong

    # Elementwise, so the maximum over one flat vector per kind equals the
    # maximum over the tensors (a NaN anywhere makes either infinite).
    for rank in range(len(results)) if ranks is None else ranks:
        result = results[rank]
        tp_rank = layout.coords(rank).tp
        exp = expected(rank)
        kinds = (("grads", grad_scale), ("params", param_scale)) if gradients else (("params", param_scale),)
        for kind, scale in kinds:
            values: dict[str, torch.Tensor] = getattr(result, kind)
            refs = {
                name: shard(getattr(exp, kind)[name], name, tp_rank, layout.tp)
                if tp_sharded_expected
                else getattr(exp, kind)[name]
                for name in values
            }
            if all(v.shape == refs[n].shape for n, v in values.items()):
                worst = max(
                    worst,
                    ratio(_flat(values.values()), _flat(refs[n] for n in values), atol_fraction * scale),
                )
            else:  # broadcasting shapes: as the per-tensor comparison treats them
                for name, value in values.items():
                    worst = max(worst, ratio(value, refs[name], atol_fraction * scale))
        if gradients:
            worst = max(
                worst,
                ratio(
                    torch.tensor([result.grad_norms[group] for group in ("policy", "draft")]),
                    torch.tensor([exp.grad_norms[group] for group in ("policy", "draft")]),
                    atol_fraction * grad_scale,
                ),
            )
        worst = max(
            worst,
            ratio(
                torch.tensor([result.metrics[metric] for metric in METRIC_NAMES]),
                torch.tensor([exp.metrics[metric] for metric in METRIC_NAMES]),
                atol_fraction,
            ),
        )
    return worst


# The parity suite's tolerances (TOLERANCES) hold for its batches of 24 tokens
# per replica and a vocabulary of 24. A bfloat16 step on the fuzz cases' tiny
# batches (one valid token, a vocabulary of 2) is further from the float64
# reference, without any bug: the draft's teacher is the policy's bfloat16
# logits, rounded at 2**-9 relative through ~6 ops, so a logit of size 4 is
# off by up to ~0.05 and the draft gradient softmax(s) - softmax(z) of a
# single token moves by up to a quarter of that, ~1e-2, against a model-wide
# gradient scale that can be as small as ~0.1 when one token contributes.
# That estimate is not a bound: with two near-equal probabilities their
# difference keeps the rounding of each (2**-8 of ~0.5), not of itself, and
# the draft head's backward multiplies it by bfloat16 activations. Measured on
# the real code: a single-token bfloat16 step whose draft gradient norm is 0.51
# against float64's 0.39 (fixtures/regressions/test_layout_invariance-7699df4526.json;
# float32 passes at 1e-5). No fixed fraction of the gradient's own scale
# bounds that, so in bfloat16 property 1 compares what the step applies, the
# parameters after it (an update of lr x gradient: the error above moves them
# by ~5e-3 of their scale) and the metrics, at 5e-2 relative and 0.15 of the
# scale; gradients and grad norms in bfloat16 are checked by split ==
# monolithic (the same roundings on both sides) and everything in float32.
# float64: the workers keep fp32 main grads and fp32 master parameters
# (draft_loss.grads, CotrainWorker), so a float64 step carries float32's
# roundings at most: float32's tolerances hold (and judge the float64 maths
# paths, which float32 cases never run).
FUZZ_TOLERANCES = {
    torch.float64: TOLERANCES[torch.float32],
    torch.float32: TOLERANCES[torch.float32],
    torch.bfloat16: {"split_vs_monolithic": (3e-2, 6e-2), "vs_reference": (5e-2, 1.5e-1)},
}


def tolerance(case: DraftCase, which: str) -> tuple[float, float]:
    return FUZZ_TOLERANCES[case.torch_dtype][which]


# The fixed float32 fractions above assume a step costs float32 a few
# roundings of the model-wide gradient scale. Some cases cost far more
# without any bug: a gradient entry that is a small sum of large per-token
# terms keeps the rounding of the terms (measured: a 3-microbatch step of 18
# tokens whose monolithic gradients are 5.2e-6 of their scale off float64,
# split 7.5e-6, so 1.3e-5 apart where 3e-6 + 1e-5 relative was allowed).
# What float32 costs a case is measured on the case itself: its shadow, the
# float64 reference's maths run in float32 in one process
# (cotrain_reference.reference_step(dtype=float32)); its worst gradient
# error against float64, as a fraction of the gradient scale, is that cost.
# A run's own error is another draw of it (the same sums in other orders:
# microbatch accumulation, TP partial sums, the streaming softmax), so it is
# judged at SHADOW_SPREAD times the shadow's cost, split against monolithic
# at twice that (two draws), whenever that is more than the fixed fraction.
# SHADOW_SPREAD: on 1,135 drawn float32 cases (benchmarks/float32_cost.py,
# seeds 0..47) a run's worst error was at most 4.6 times its shadow's, 99 in
# 100 under 2.5. 16 leaves a margin of 3.5 over the worst; the widening only
# ever applies where float32 itself costs the case more than the fixed
# fraction, so a bug in a case float32 computes well is judged as before.
# bfloat16 the same way, with its own shadow (the reference's maths in
# bfloat16): on 197 drawn bfloat16 cases (`--dtype bfloat16`, seeds 0..47,
# the shuffled order left out as its gradients are not compared) a run's
# worst error was at most 4.81 times its shadow's, split against monolithic
# at most 2.21. A clean hour-long campaign found the fixed 3% failing there:
# a dp=2 pp=2 step whose two modes' policy gradients were each 1-2.5e-3 off
# float64, as far as the bfloat16 shadow (2.4e-3), and 1.5e-3 apart.
SHADOW_SPREAD = 16.0
WIDENED_DTYPES = ("float32", "bfloat16")


def shadow_cost(case: DraftCase) -> float:
    """The worst gradient error of the case's shadow (its float64 reference's
    maths in the case's dtype) against that reference, as a fraction of the
    reference's largest gradient entry."""
    config, batch = case.config(), case.global_batch()
    exact, shadow = reference_of(config, batch), reference_of(config, batch, dtype=case.torch_dtype)
    scale = max((float(g.abs().max()) for g in exact.grads.values() if g.numel()), default=0.0) or 1.0
    worst = max(
        (float((shadow.grads[n].double() - g).abs().max()) for n, g in exact.grads.items() if g.numel()),
        default=0.0,
    )
    return worst / scale


def check_step(
    case: DraftCase,
    results: list[StepResult],
    expected: Callable[[int], Any],
    *,
    which: str,
    what: str,
    tp_sharded_expected: bool,
    gradients: bool,
    ranks: Iterable[int] | None = None,
) -> None:
    """Properties 1 and 2's judgement of ``results`` against ``expected(rank)``:
    everything ``check_against`` compares, or (``gradients=False``) parameters
    and metrics; at ``tolerance(case, which)``, or in float32, where that
    fails, at the case's own float32 or bfloat16 cost (``SHADOW_SPREAD``,
    computed only then: most cases never need it)."""
    rtol, atol = tolerance(case, which)

    def judge(atol_fraction: float) -> None:
        if gradients:
            check_against(
                case.layout,
                results,
                expected,
                rtol=rtol,
                atol_fraction=atol_fraction,
                what=what,
                tp_sharded_expected=tp_sharded_expected,
                ranks=ranks,
            )
        elif tp_sharded_expected:
            check_params_and_metrics(
                case, results, expected(0), rtol=rtol, atol_fraction=atol_fraction, what=what, ranks=ranks
            )
        else:
            check_params_and_metrics(
                case, results, expected, rtol=rtol, atol_fraction=atol_fraction, what=what, ranks=ranks
            )

    try:
        judge(atol)
    except AssertionError:
        # float64 cases keep the fixed fraction: only their main grads are
        # float32, so a float32 shadow would overstate what they cost.
        if case.dtype not in WIDENED_DTYPES:
            raise
        draws = 2 if which == "split_vs_monolithic" else 1
        derived = draws * SHADOW_SPREAD * shadow_cost(case)
        if derived <= atol:
            raise
        judge(derived)


def gradients_judged_against_reference(case: DraftCase) -> bool:
    """Whether property 1 compares gradients and grad norms with float64 (see above)."""
    return case.dtype in ("float32", "float64")


def gradients_judged_split_vs_monolithic(case: DraftCase) -> bool:
    """Whether property 2 compares the two modes' gradients and grad norms.

    Not in bfloat16 under the shuffled reduction model: its order is seeded by
    the call's place in the world's sequence, and the two modes issue different
    sequences, so their TP all-reduces of bfloat16 activations sum in different
    orders and the premise of the bfloat16 tolerance (the same roundings on both
    sides) fails. Measured on a single-token tp=3 step (4 layers, vocabulary 6):
    split == monolithic bitwise under the rank, ring and tree orders, and off by
    0.065-0.157 of the gradient scale under three shuffled seeds, the size
    FUZZ_TOLERANCES' note derives for bfloat16 against float64. There, as in
    property 1, what the step applies (parameters) and the metrics are judged.
    """
    return not (case.dtype == "bfloat16" and case.reduction == "shuffled")


def check_params_and_metrics(
    case: DraftCase,
    results: list[StepResult],
    reference: Any,
    *,
    rtol: float,
    atol_fraction: float,
    what: str,
    ranks: Iterable[int] | None = None,
) -> None:
    """``check_against`` without gradients and grad norms (bfloat16 vs float64);
    ``reference``: the float64 result of the whole model (sharded here per rank),
    or a callable giving each rank's own result (another mode's, say);
    ``ranks``: those ranks only (see ``agreed_representatives``)."""
    layout = case.layout
    per_rank = callable(reference)
    expected = reference if per_rank else (lambda rank: reference)
    param_scale = (
        max((float(t.abs().max()) for t in expected(0).params.values() if t.numel()), default=0.0) or 1.0
    )
    for rank in range(len(results)) if ranks is None else ranks:
        result = results[rank]
        tp_rank = layout.coords(rank).tp
        exp = expected(rank)
        refs = {
            name: exp.params[name] if per_rank else shard(exp.params[name], name, tp_rank, layout.tp)
            for name in result.params
        }
        _close_all(result.params, refs, rtol, atol_fraction * param_scale, f"{what}: rank {rank} param")
        metrics = torch.tensor([result.metrics[metric] for metric in METRIC_NAMES])
        ref_metrics = torch.tensor([exp.metrics[metric] for metric in METRIC_NAMES])
        if not _within(metrics, ref_metrics, rtol, atol_fraction):
            for metric in METRIC_NAMES:  # the first one out of tolerance raises
                _close(
                    torch.tensor(result.metrics[metric]),
                    torch.tensor(exp.metrics[metric]),
                    rtol,
                    atol_fraction,
                    f"{what}: rank {rank} metric {metric}",
                )


# -------------------------------------------------------------- fault + retry

# What a failed attempt may end in: the injected fault itself, the backend
# error of a timed-out or aborted communicator, or a rank that learnt at the
# commit agreement that a peer failed. Anything else (a StepOrderError from
# stale state, a deadlock, a mismatch) is a bug the fault exposed.
EXPECTED_FAILURES: tuple[type[BaseException], ...] = (
    ProbeFault,
    simdist.InjectedFault,
    simdist.faults.BackendError,
    StepAbortedError,
)


def _fault_body(
    ctx,
    workers: dict,
    config,
    batches,
    case: DraftCase,
    probe_fault: Mapping[str, Any] | None,
    reached: dict[int, list[str]] | None = None,
):
    if ctx.rank not in workers:
        workers[ctx.rank] = CotrainWorker(config, groups_of(ctx))
    worker = workers[ctx.rank]
    worker.bind(groups_of(ctx))
    probe = None
    if reached is not None:
        points = reached.setdefault(ctx.rank, [])
        probe = points.append
    elif probe_fault is not None and ctx.attempt == 0 and ctx.rank == probe_fault["rank"]:
        point = probe_fault["probe"]

        def probe(reached: str) -> None:
            if reached == point:
                raise ProbeFault(f"probe fault at {point!r} on rank {ctx.rank}")

    return worker.train_step(
        rank_batch(ctx, batches), mode=case.mode, num_microbatches=case.microbatches, probe=probe
    )


def fault_then_retry(case: DraftCase) -> tuple[list[StepResult], list[StepResult], simdist.RetryOutcome]:
    """(clean results, the faulty set's results after at most one retry, the retry outcome).

    Two sets of workers with the same initial state: the clean set runs the
    step, the other runs it with the fault and, when that attempt fails,
    again on a fresh world. Each step runs in a world of its own, so
    seeded reduction orders (keyed by call sequence) match between the two.
    """
    config = case.config()
    # share_args: the workers dicts (each rank's model, optimizer and step
    # state, keyed by rank) must outlive a world, as a real job's processes
    # outlive a communicator rebuilt after a failure.
    run_kwargs = dict(
        layout=case.layout, timeout=RUN_TIMEOUT_S, share_args=True, **case.reduction_choice.run_kwargs()
    )
    batches = case.batches()
    warmup_batches = case.batches(data_seed=case.seed + 1)
    probe_fault = case.fault if case.fault is not None and "probe" in case.fault else None
    clean_workers: dict = {}
    faulty_workers: dict = {}
    with case.blocks():
        return _fault_then_retry(
            case, config, run_kwargs, batches, warmup_batches, probe_fault, clean_workers, faulty_workers
        )


def _fault_then_retry(
    case, config, run_kwargs, batches, warmup_batches, probe_fault, clean_workers, faulty_workers
):
    if case.warmup:
        for workers in (clean_workers, faulty_workers):
            simdist.run(_fault_body, args=(workers, config, warmup_batches, case, None), **run_kwargs)
    reached: dict[int, list[str]] = {}
    with simdist.CommStats() as calls:
        clean = simdist.run(
            _fault_body, args=(clean_workers, config, batches, case, None, reached), **run_kwargs
        )
    probe_fault = probe_within(probe_fault, reached)
    outcome = simdist.run_with_retry(
        _fault_body,
        faults=fault_plan_of(
            case, lambda fault: calls.count(rank=fault.rank, group=fault.group, op=fault.op).calls
        ),
        retries=1,
        args=(faulty_workers, config, batches, case, probe_fault),
        **run_kwargs,
    )
    return clean, outcome.results, outcome


def probe_within(
    probe_fault: Mapping[str, Any] | None, reached: Mapping[int, Sequence[str]]
) -> Mapping[str, Any] | None:
    """The probe fault wrapped onto the optimizer points its rank reached in the
    clean run. ``probe_points`` lists the optimizer's points up to the most
    parameters any rank can hold; a rank holding fewer never reaches the last
    ones, so a point drawn there (about one probe fault in four) aborted
    nothing. Other points are kept as drawn: every rank must reach them, and the
    property fails when one does not fire."""
    if probe_fault is None or ":optimizer:" not in probe_fault["probe"]:
        return probe_fault
    mine = [p for p in reached.get(probe_fault["rank"], ()) if ":optimizer:" in p]
    if not mine or probe_fault["probe"] in mine:
        return probe_fault
    index = int(probe_fault["probe"].rpartition(":")[2])
    return {**probe_fault, "probe": mine[index % len(mine)]}


def unexpected_failures(outcome: simdist.RetryOutcome) -> list[str]:
    """Failures of the faulty attempt that the fault alone does not explain."""
    problems = []
    for error in outcome.errors:
        if not isinstance(error, simdist.RankError):
            problems.append(f"{type(error).__name__}: {error}")
            continue
        for rank, failure in error.failures.items():
            if not isinstance(failure, EXPECTED_FAILURES):
                problems.append(f"rank {rank}: {type(failure).__name__}: {failure}")
    return problems


# ---------------------------------------------------------------- bad input

# What the rank holding the bad input must say (the argument it names).
BAD_INPUT_MESSAGES = {
    "tokens_out_of_range": "batch.tokens must lie in",
    "negative_bin": "batch.bin_ids must lie in",
    "bin_too_large": "batch.bin_ids must lie in",
    "mask_shape": "must share one shape",
    "tokens_int32": "batch.tokens must be int64",
    "bins_float": "batch.bin_ids must be int64",
    "tokens_1d": "batch.tokens must be a 2-D",
    "too_many_microbatches": "num_microbatches",
    "one_position": "at least 1 row and 2 positions",
    "mode_typo": "mode must be 'monolithic' or 'split'",
}
PEER_MESSAGE = "another rank's arguments were invalid"


def _bad_input_body(ctx, case: DraftCase, config, batches, modes):
    bad = case.bad_input
    batch, mode, microbatches = rank_batch(ctx, batches), case.mode, case.microbatches
    if bad["kind"] == "too_many_microbatches":
        mode = "split"  # only a split step needs a row per microbatch
    if ctx.rank == bad["rank"]:
        batch, mode_override, microbatches_override = spoil(batch, bad["kind"], config)
        mode = mode_override or mode
        microbatches = microbatches_override or microbatches
    worker = CotrainWorker(config, groups_of(ctx))
    try:
        worker.train_step(batch, mode=mode, num_microbatches=microbatches)
    except (ValueError, TypeError) as error:
        return {"error": error, "state": worker.draft_state.phase.value}
    return {"error": None, "state": worker.draft_state.phase.value}


def run_bad_input(case: DraftCase) -> list[dict[str, Any]]:
    """Every rank's outcome; a SimulationError (hang, mismatch, a rank raising
    something other than ValueError/TypeError) fails the case."""
    try:
        with case.blocks():
            return simdist.run(
                _bad_input_body,
                layout=case.layout,
                args=(case, case.config(), case.batches(), ()),
                timeout=RUN_TIMEOUT_S,
                **case.reduction_choice.run_kwargs(),
            )
    except simdist.SimulationError as error:
        cause = error.__cause__
        raise AssertionError(
            f"bad input on rank {case.bad_input['rank']} ({case.bad_input['kind']}) raised "
            f"{type(error).__name__} instead of a ValueError/TypeError on every rank "
            f"(first failure: {type(cause).__name__}: {cause}): {error}"
        ) from error
