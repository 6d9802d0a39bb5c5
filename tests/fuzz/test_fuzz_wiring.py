"""The fuzz target's plumbing: cases survive JSON exactly, properties replay from
a decoded case without Hypothesis, and every mutant can be undone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

for _folder in (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent / "support"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import mutants  # noqa: E402
import pytest  # noqa: E402
import test_draft_properties as properties  # noqa: E402
import torch  # noqa: E402
from cotrain_faults import assert_bitwise_equal  # noqa: E402
from draft_cases import DraftCase, bad_input_cases, fault_cases  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from soft_ce_cases import SoftCECase, soft_ce_bad_input_cases  # noqa: E402

from simdist.fuzz._property import spec_of  # noqa: E402

quick = settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@quick
@given(fault_cases())
def test_draft_cases_survive_json_and_rebuild_the_same_tensors(case: DraftCase) -> None:
    decoded = DraftCase.from_json(json.loads(json.dumps(case.to_json())))
    assert decoded == case
    for a, b in zip(decoded.batches(), case.batches()):
        assert (
            torch.equal(a.tokens, b.tokens)
            and torch.equal(a.mask, b.mask)
            and torch.equal(a.bin_ids, b.bin_ids)
        )


@quick
@given(bad_input_cases())
def test_bad_input_cases_survive_json(case: DraftCase) -> None:
    assert DraftCase.from_json(json.loads(json.dumps(case.to_json()))) == case


@quick
@given(soft_ce_bad_input_cases())
def test_soft_ce_cases_survive_json_and_rebuild_the_same_tensors(case: SoftCECase) -> None:
    decoded = SoftCECase.from_json(json.loads(json.dumps(case.to_json())))
    assert decoded == case
    for name, value in case.tensors().items():
        # Bitwise the same, NaN padding included (NaN != NaN for torch.equal).
        again = decoded.tensors()[name]
        assert again.dtype == value.dtype and torch.allclose(again, value, rtol=0, atol=0, equal_nan=True), (
            name
        )


def _tiny_case(**overrides) -> DraftCase:
    """tp=2, dp=2, pp=2; DP rank 0 has three (one fractional) valid tokens, rank 1 none."""
    fields = dict(
        tp=2,
        dp=2,
        pp=2,
        microbatches=1,
        seq_len=3,
        masks=((((1.0, 1.0, 0.5),),), (((0.0, 0.0, 0.0),),)),
        vocab_size=4,
        token_chunk_size=2,
        dtype="float32",
        bin_weights=(1.0, 0.0),
        single_bin=None,
        seed=5,
        reduction="tree",
        reduction_seed=0,
        clip=False,
    )
    return DraftCase(**(fields | overrides))


def test_a_collective_fault_drawn_past_the_steps_calls_still_fires() -> None:
    # Drawn nth values past the calls a step makes tested a clean world in about
    # two of five collective-fault cases; they are wrapped onto the step's calls.
    from draft_runs import fault_then_retry

    fault = {"kind": "crash", "rank": 3, "op": "all_reduce", "group": "tp", "nth": 64}
    _, _, outcome = fault_then_retry(_tiny_case(fault=fault))
    assert outcome.errors and outcome.attempts == 2
    assert "InjectedFault" in repr(outcome.errors[0].failures)


def test_an_optimizer_probe_past_the_ranks_parameters_still_fires() -> None:
    # probe_points lists the optimizer points of the largest stage; a pp=2 stage
    # holds fewer parameters, so the last points were never reached.
    from draft_cases import probe_points
    from draft_runs import fault_then_retry

    last = probe_points(1)[-1]
    clean, retried, outcome = fault_then_retry(_tiny_case(fault={"probe": last, "rank": 5}))
    assert outcome.errors, f"{last!r} on a pp=2 stage aborted nothing"
    assert "probe fault at 'split:optimizer:" in str(outcome.errors[0])
    assert_bitwise_equal(retried, clean)


def test_every_property_declares_how_its_case_is_decoded() -> None:
    names = [n for n in dir(properties) if n.startswith("test_")]
    assert len(names) == 9
    for name in names:
        spec = spec_of(getattr(properties, name))
        assert spec is not None and spec.arg == "case", name


def test_every_loss_entry_point_of_draft_loss_is_called_by_a_property() -> None:
    # The default campaign missed projected_soft_cross_entropy entirely (no
    # property called it). The loss entry points, imported from the package root:
    here = Path(__file__).resolve().parent
    sources = {
        p.name: p.read_text() for p in here.glob("*.py") if p.name not in ("mutants.py", "check_mutants.py")
    }
    for entry in ("soft_cross_entropy", "projected_soft_cross_entropy", "CotrainWorker"):
        assert any(
            f"from draft_loss import {entry}" in text or f" {entry}," in text or f"import {entry}" in text
            for text in sources.values()
        ), entry
        assert any(f"{entry}(" in text for text in sources.values()), f"no property calls {entry}"


def test_a_property_replays_a_decoded_case_without_hypothesis() -> None:
    """What ``simdist replay`` does: decode the JSON, call the inner test with case=..."""
    case = _tiny_case()
    test = properties.test_split_equals_monolithic
    decoded = spec_of(test).decode(json.loads(json.dumps(case.to_json())))
    test.hypothesis.inner_test(case=decoded)


def test_a_replayed_case_fails_under_a_mutant() -> None:
    case = _tiny_case()
    test = properties.test_layout_invariance.hypothesis.inner_test
    with mutants.applied("dp_gradients_averaged"):
        with pytest.raises(AssertionError, match="vs float64 reference"):
            test(case=case)
    test(case=case)  # undone


@pytest.mark.parametrize("name", sorted(mutants.MUTANTS))
def test_each_mutant_changes_draft_loss_and_its_undo_restores_it(name: str) -> None:
    from draft_loss import grads, projected, soft_ce, stats, step_state
    from draft_loss.cotrain import agreement, batch, commit, model, sgd, worker

    modules = (
        agreement,
        batch,
        commit,
        model,
        sgd,
        worker,
        grads,
        projected,
        soft_ce,
        stats,
        step_state,
        soft_ce.v,
        worker.CotrainWorker,
        soft_ce.TilePlan,
        stats.DraftLossStats,
        step_state.DraftStepState,
        sgd.MomentumSGD,
    )

    def state() -> list[dict]:
        return [dict(vars(m)) for m in modules]

    before = state()
    undo = mutants.apply(name)
    assert state() != before, f"mutant {name} changed nothing"
    undo()
    assert state() == before, f"undoing mutant {name} did not restore draft_loss"


def test_at_least_twelve_mutants_beyond_the_four_of_test_mutants() -> None:
    assert len(mutants.MUTANTS) >= 12
    assert all(fn.__doc__ for fn in mutants.MUTANTS.values()), "each mutant says what bug it models"


# The checks compare each rank's tensors of a kind as one flat vector and
# judge DP replicas through one representative (draft_runs); these make sure
# neither lets a wrong element through or names the wrong place.


@pytest.fixture(scope="module")
def tiny_results():
    from cotrain_harness import reference_of
    from draft_runs import run_valid

    case = _tiny_case(dp=2, pp=1)
    return case, run_valid(case, ("split",))["split"], reference_of(case.config(), case.global_batch())


def _with(results, rank: int, kind: str, name: str, index: int, value: float):
    import copy

    out = copy.deepcopy(results)
    getattr(out[rank], kind)[name].reshape(-1)[index] = value
    return out


@pytest.mark.parametrize("value", [float("nan"), 1.0e3])
@pytest.mark.parametrize("kind", ["grads", "params"])
def test_the_reference_comparison_names_the_one_wrong_element(tiny_results, kind: str, value: float) -> None:
    from cotrain_harness import check_against
    from draft_runs import check_params_and_metrics, worst_ratio

    case, results, reference = tiny_results
    options = dict(rtol=1e-4, atol_fraction=1e-5, tp_sharded_expected=True)
    assert worst_ratio(case, results, lambda rank: reference, **options) <= 1.0
    check_against(case.layout, results, lambda rank: reference, what="ref", **options)
    names = list(getattr(results[1], kind))
    name = names[len(names) // 2]
    index = getattr(results[1], kind)[name].numel() - 1  # the last element of a tensor in the middle
    wrong = _with(results, 1, kind, name, index, value)
    assert worst_ratio(case, wrong, lambda rank: reference, **options) > 1.0
    with pytest.raises(AssertionError, match=f"rank 1 {kind[:-1]} {name}:"):
        check_against(case.layout, wrong, lambda rank: reference, what="ref", **options)
    if kind == "params":
        with pytest.raises(AssertionError, match=f"rank 1 param {name}:"):
            check_params_and_metrics(case, wrong, reference, rtol=1e-4, atol_fraction=1e-5, what="ref")


def test_a_replica_that_differs_is_caught_before_its_representative_stands_for_it(tiny_results) -> None:
    from draft_runs import agreed_representatives, check_updates

    case, results, reference = tiny_results
    representatives = agreed_representatives(case, {"split": results})
    assert representatives == [0, 1]  # tp=2, dp=2: DP rank 1 (global ranks 2, 3) is judged through DP rank 0
    name = next(iter(results[3].params))
    wrong = _with(results, 3, "params", name, 0, float(results[3].params[name].reshape(-1)[0]) + 1e-3)
    # The representatives come only with the agreement check: a drifted replica stops it.
    with pytest.raises(AssertionError, match=f"rank 3's param {name} differs from rank 1's"):
        agreed_representatives(case, {"monolithic": results, "split": wrong})
    assert check_updates(case, results, reference, ranks=representatives) <= 1.0
    with pytest.raises(AssertionError, match=f"rank 3 applied update of {name}"):
        check_updates(case, wrong, reference)


def _draws(strategy, examples: int = 30) -> list:
    seen: list = []

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(case) -> None:
        seen.append(case)

    collect()
    return seen


def test_max_world_size_bounds_every_strategy_of_the_default_target(monkeypatch: pytest.MonkeyPatch) -> None:
    # `simdist fuzz --max-world-size 2` exports this; the soft-CE cases used to
    # ignore it (MAX_TP = 4 hard-coded) and ran 3- and 4-rank worlds.
    from draft_cases import draft_cases
    from soft_ce_cases import soft_ce_cases

    monkeypatch.setenv("SIMDIST_FUZZ_MAX_WORLD_SIZE", "2")
    for strategy in (draft_cases(), fault_cases(), bad_input_cases()):
        assert max(case.layout.world_size for case in _draws(strategy)) <= 2
    for strategy in (soft_ce_cases(), soft_ce_bad_input_cases()):
        assert {case.tp for case in _draws(strategy)} <= {1, 2}
    monkeypatch.setenv("SIMDIST_FUZZ_MAX_WORLD_SIZE", "1")
    assert {case.tp for case in _draws(soft_ce_cases())} == {1}


def test_soft_ce_cases_cross_bfloat16s_exact_integer_range() -> None:
    # Counts above 256 are where a count kept in bfloat16 rounds (257 -> 256).
    from soft_ce_cases import soft_ce_cases

    # 300 draws: in 120 derandomised ones the long cases (1 in 8) can all land at or just below 256.
    counts = [sum(1 for row in case.mask for v in row if v > 0) for case in _draws(soft_ce_cases(), 300)]
    assert sum(count > 256 for count in counts) >= 5, sorted(counts)[-5:]


def test_draft_cases_cross_bfloat16s_exact_integer_range_per_rank_and_after_the_dp_sum() -> None:
    # With at most 6 positions a row no step's count came near 256, so a draft
    # count kept in bfloat16 (257 -> 256), on a rank or in the DP sum, could not show.
    from corners import draws
    from draft_cases import draft_cases

    def count(rank_masks) -> float:
        return sum(v for micro in rank_masks for row in micro for v in row[1:])

    # Six seeded runs of 50, not one run of 200: the draws within one run are
    # correlated. The true shares are about 11% (a rank) and 13% (the sum).
    cases = draws(draft_cases(), 50, range(6))
    per_rank = [c for c in cases if any(count(r) > 256 for r in c.masks)]
    summed = [c for c in cases if sum(count(r) for r in c.masks) > 256]
    assert len(per_rank) >= 6, len(per_rank)
    assert len(summed) >= 6 and any(c.dp > 1 for c in summed), [(c.dp, c.seq_len) for c in summed]
    # Long microbatches never run a tile per token (hundreds of TP all-reduces).
    long = [c for c in cases if c.seq_len > 6]
    for c in long:
        tokens = max(len(m[0]) * c.seq_len for m in c.masks)
        assert -(-tokens // c.token_chunk_size) <= 8, (tokens, c.token_chunk_size)


def test_projected_and_padding_cases_survive_json_and_draw_non_finite_padding() -> None:
    from projected_cases import ProjectedCase, projected_cases
    from soft_ce_cases import soft_ce_cases

    projected = _draws(projected_cases(), 25)
    for case in projected:
        assert ProjectedCase.from_json(json.loads(json.dumps(case.to_json()))) == case
    plain = _draws(soft_ce_cases(), 40)
    for case in plain:
        assert SoftCECase.from_json(json.loads(json.dumps(case.to_json()))) == case
    # Non-finite draft logits (or hidden states) where the padding is, as real padding has them.
    for cases in (plain, [c.base for c in projected]):
        padded = [
            c for c in cases if c.masked_nonfinite != "none" and any(v == 0 for row in c.mask for v in row)
        ]
        assert padded, "no case put NaN/inf at a masked position"
    case = padded[0]
    student = case.tensors()["student"]
    mask = torch.tensor(case.mask)
    assert not torch.isfinite(student[mask == 0]).any() and torch.isfinite(student[mask != 0]).all()
