"""draft_loss's fuzz properties: the default target of ``simdist fuzz``.

Each property draws a plain-data case (``draft_cases``, ``soft_ce_cases``),
runs the real ``draft_loss`` code on simdist and compares with an independent
reference: the float64 single-process step, the monolithic step, a clean run.
Properties take only their case, so ``simdist replay`` can call them with a
case decoded from JSON; settings (examples, database) come from the profile
the campaign or pytest loads.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Replay imports this file by path: make its helpers importable without pytest.
for _folder in (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent / "support"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from cotrain_faults import assert_bitwise_equal  # noqa: E402
from cotrain_harness import check_ranks_agree, reference_of  # noqa: E402
from draft_cases import DraftCase, bad_input_cases, draft_cases, fault_cases  # noqa: E402
from draft_runs import (  # noqa: E402
    BAD_INPUT_MESSAGES,
    PEER_MESSAGE,
    agreed_representatives,
    check_replicas_agree,
    check_step,
    check_updates,
    cover,
    fault_then_retry,
    gradients_judged_against_reference,
    gradients_judged_split_vs_monolithic,
    rank_batch,
    run_bad_input,
    run_valid,
    steer,
    tolerance,
    unexpected_failures,
    worst_ratio,
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from lifecycle import LifecycleCase, lifecycle_cases, run_lifecycle  # noqa: E402
from projected_cases import ProjectedCase, check_projected, projected_cases  # noqa: E402
from soft_ce_cases import (  # noqa: E402
    SoftCECase,
    check_soft_ce,
    run_soft_ce_bad_input,
    soft_ce_bad_input_cases,
    soft_ce_cases,
)

from draft_loss.cotrain import CotrainWorker  # noqa: E402
from simdist import fuzz  # noqa: E402

# A case runs whole simulated worlds: no per-example deadline, and drawing
# nested masks may be slow under load.
relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@relaxed
@given(case=draft_cases())
@fuzz.replayable(DraftCase.from_json)
def test_layout_invariance(case: DraftCase) -> None:
    """1. The applied update (parameters, grad norms, metrics) of either mode equals
    the float64 single-process reference of the global batch, on every rank
    (in bfloat16: parameters and metrics; see draft_runs.FUZZ_TOLERANCES)."""
    cover(**case.cover(), mode=case.mode, chunk_vs_tokens=_chunk_feature(case))
    results = run_valid(case, (case.mode,))[case.mode]
    # DP replicas agree bitwise (checked here): comparing one of each checks them all.
    ranks = agreed_representatives(case, {case.mode: results})
    check_ranks_agree(case.layout, results, case.mode)
    assert not results[0].skipped, (
        f"{case.mode}: a valid step was skipped (non-finite grad norm {results[0].grad_norms})"
    )
    reference = reference_of(case.config(), case.global_batch())
    rtol, atol = tolerance(case, "vs_reference")
    gradients = gradients_judged_against_reference(case)
    steer(
        worst_ratio(
            case,
            results,
            lambda rank: reference,
            rtol=rtol,
            atol_fraction=atol,
            tp_sharded_expected=True,
            gradients=gradients,
            ranks=ranks,
        ),
        label="layout invariance: worst error / tolerance vs float64",
    )
    check_step(
        case,
        results,
        lambda rank: reference,
        which="vs_reference",
        what=f"{case.mode} vs float64 reference",
        tp_sharded_expected=True,
        gradients=gradients,
        ranks=ranks,
    )
    steer(
        check_updates(case, results, reference, ranks=ranks),
        label="layout invariance: worst update error / tolerance (float32)",
    )


@relaxed
@given(case=draft_cases())
@fuzz.replayable(DraftCase.from_json)
def test_split_equals_monolithic(case: DraftCase) -> None:
    """2. A split step over 1..4 microbatches equals the monolithic step, on every rank
    (same world, same reduction model; float32 to summation-order rounding; in
    bfloat16 under the shuffled order, whose two modes sum in different orders,
    parameters and metrics: see draft_runs.gradients_judged_split_vs_monolithic)."""
    cover(**case.cover(), chunk_vs_tokens=_chunk_feature(case))
    results = run_valid(case, ("monolithic", "split"))
    mono, split = results["monolithic"], results["split"]
    # The replicas of either mode agree bitwise (checked here): comparing one of each checks them all.
    ranks = agreed_representatives(case, results)
    for mode, per_rank in results.items():
        check_ranks_agree(case.layout, per_rank, mode)
        assert not per_rank[0].skipped, (
            f"{mode}: a valid step was skipped (grad norms {per_rank[0].grad_norms})"
        )
    rtol, atol = tolerance(case, "split_vs_monolithic")
    gradients = gradients_judged_split_vs_monolithic(case)
    steer(
        worst_ratio(
            case,
            split,
            lambda rank: mono[rank],
            rtol=rtol,
            atol_fraction=atol,
            tp_sharded_expected=False,
            gradients=gradients,
            ranks=ranks,
        ),
        label="split vs monolithic: worst error / tolerance",
    )
    check_step(
        case,
        split,
        lambda rank: mono[rank],
        which="split_vs_monolithic",
        what="split vs monolithic",
        tp_sharded_expected=False,
        gradients=gradients,
        ranks=ranks,
    )


@relaxed
@given(case=fault_cases())
@fuzz.replayable(DraftCase.from_json)
def test_fault_then_retry_equals_clean_run(case: DraftCase) -> None:
    """3. A fault on one rank (an exception at a probe point of the step, or a simdist
    crash/timeout/abort/delay at a collective), then a retry of the same batch on a
    fresh world, equals a clean run bit for bit; a fault that aborts nothing
    (a delay, a call that never comes) changes nothing. A probe fault outside the
    optimizer always fires: every rank reaches every other point of its mode's
    step (probe_points), so a fault that aborts nothing there is a step that
    skipped a point, or a retry test that tested no fault."""
    clean, retried, outcome = fault_then_retry(case)
    cover(**case.cover(), warmup=case.warmup, fault_fired=bool(outcome.errors))
    point = case.fault.get("probe", "")
    if point and ":optimizer:" not in point:
        assert outcome.errors, (
            f"the probe fault at {point!r} on rank {case.fault['rank']} never fired: "
            f"the {case.mode} step did not reach a point every rank of it reaches"
        )
    problems = unexpected_failures(outcome)
    assert not problems, "the faulty attempt failed in ways the fault does not explain:\n" + "\n".join(
        problems
    )
    assert_bitwise_equal(retried, clean)


@relaxed
@given(case=bad_input_cases())
@fuzz.replayable(DraftCase.from_json)
def test_bad_input_fails_on_every_rank(case: DraftCase) -> None:
    """4. Bad input on one rank makes every rank raise a clear ValueError/TypeError
    (the bad rank names the argument, its peers say another rank's input was bad),
    before any state is kept; never a hang, never a SimulationError."""
    kind, bad_rank = case.bad_input["kind"], case.bad_input["rank"]
    cover(**case.cover(), bad_input=kind)
    outcomes = run_bad_input(case)
    for rank, outcome in enumerate(outcomes):
        error = outcome["error"]
        assert error is not None, f"rank {rank} did not raise although rank {bad_rank} had bad input ({kind})"
        expected = BAD_INPUT_MESSAGES[kind] if rank == bad_rank else PEER_MESSAGE
        assert expected in str(error), (
            f"rank {rank}: expected an error saying {expected!r}, got {type(error).__name__}: {error}"
        )
        assert outcome["state"] == "idle", f"rank {rank}: draft state left in phase {outcome['state']}"


def _two_steps_body(ctx, case, config, batches, modes):
    from cotrain_harness import groups_of

    worker = CotrainWorker(config, groups_of(ctx))
    batch = rank_batch(ctx, batches)
    return {mode: worker.train_step(batch, mode=mode, num_microbatches=case.microbatches) for mode in modes}


@relaxed
@given(case=draft_cases())
@fuzz.replayable(DraftCase.from_json)
def test_valid_input_never_raises_simulation_error(case: DraftCase) -> None:
    """5. Valid input never raises a SimulationError (no mismatch, deadlock or timeout):
    here one worker takes consecutive steps, in both modes, on one world; metrics
    and grad norms agree on every rank. (Properties 1 and 2 also fail on any
    SimulationError from valid input.)"""
    cover(**case.cover())
    other = "monolithic" if case.mode == "split" else "split"
    results = run_valid(case, (case.mode, other), body=_two_steps_body)
    for mode, per_rank in results.items():
        check_replicas_agree(case, per_rank, mode)
        check_ranks_agree(case.layout, per_rank, mode)


@relaxed
@given(case=lifecycle_cases())
@fuzz.replayable(LifecycleCase.from_json)
def test_lifecycle_matches_float64_model(case: LifecycleCase) -> None:
    """6. Several steps of one set of workers (any mode and microbatch split per step,
    probe faults at any point, retried or dropped) match a float64 step from the
    workers' own state after every step: parameters, momentum, metrics; a failed
    attempt changes nothing and leaves no state behind."""
    cover(**case.cover())
    run_lifecycle(case)


@relaxed
@given(case=soft_ce_cases())
@fuzz.replayable(SoftCECase.from_json)
def test_soft_ce_matches_reference(case: SoftCECase) -> None:
    """1 (loss level). soft_cross_entropy over vocabulary shards of uneven sizes,
    any token_chunk_size, matches a float64 full-vocabulary reference:
    numerators, counts and every rank's gradient shard."""
    cover(**case.cover())
    steer(check_soft_ce(case), label="soft_cross_entropy: worst error / tolerance vs float64")


@relaxed
@given(case=projected_cases())
@fuzz.replayable(ProjectedCase.from_json)
def test_projected_soft_ce_matches_reference(case: ProjectedCase) -> None:
    """1 (projected). projected_soft_cross_entropy (the head's matmul fused into the
    loss) matches float64 maths of hidden @ W.T: numerators, counts, the TP-reduced
    hidden-state gradient and every rank's weight-row gradient, with NaN/inf
    hidden states at padding positions reaching none of them."""
    cover(**case.cover())
    steer(check_projected(case), label="projected_soft_cross_entropy: worst error / tolerance vs float64")


@relaxed
@given(case=soft_ce_bad_input_cases())
@fuzz.replayable(SoftCECase.from_json)
def test_soft_ce_bad_input_fails_on_every_tp_rank(case: SoftCECase) -> None:
    """4 (loss level). Bad or disagreeing arguments on one TP rank (shapes, dtypes,
    masks, bins, weights, chunk size) raise the same error on every TP rank."""
    cover(**case.cover(), bad_input=case.bad_input["kind"])
    run_soft_ce_bad_input(case)


def _chunk_feature(case: DraftCase) -> str:
    rows = len(case.masks[0][0])
    tokens = rows * case.seq_len  # the tokens of one microbatch on DP rank 0
    if case.token_chunk_size == 1:
        return "1"
    return (
        "< tokens"
        if case.token_chunk_size < tokens
        else ("= tokens" if case.token_chunk_size == tokens else "> tokens")
    )
