"""The fuzz target's plumbing: cases survive JSON exactly, properties replay from
a decoded case without Hypothesis, and every mutant can be undone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

for _folder in (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402

import mutants  # noqa: E402
import test_draft_properties as properties  # noqa: E402
from draft_cases import DraftCase, bad_input_cases, fault_cases  # noqa: E402
from simdist.fuzz._property import spec_of  # noqa: E402
from soft_ce_cases import SoftCECase, soft_ce_bad_input_cases  # noqa: E402

quick = settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@quick
@given(fault_cases())
def test_draft_cases_survive_json_and_rebuild_the_same_tensors(case: DraftCase) -> None:
    decoded = DraftCase.from_json(json.loads(json.dumps(case.to_json())))
    assert decoded == case
    for a, b in zip(decoded.batches(), case.batches()):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask) and torch.equal(a.bin_ids, b.bin_ids)


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
        assert torch.equal(decoded.tensors()[name], value), name


def _tiny_case(**overrides) -> DraftCase:
    """tp=2, dp=2, pp=2; DP rank 0 has three (one fractional) valid tokens, rank 1 none."""
    fields = dict(
        tp=2, dp=2, pp=2, microbatches=1, seq_len=3, masks=((((1.0, 1.0, 0.5),),), (((0.0, 0.0, 0.0),),)),
        vocab_size=4, token_chunk_size=2, dtype="float32", bin_weights=(1.0, 0.0), single_bin=None, seed=5,
        reduction="tree", reduction_seed=0, clip=False,
    )
    return DraftCase(**(fields | overrides))


def test_every_property_declares_how_its_case_is_decoded() -> None:
    names = [n for n in dir(properties) if n.startswith("test_")]
    assert len(names) == 7
    for name in names:
        spec = spec_of(getattr(properties, name))
        assert spec is not None and spec.arg == "case", name


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
    from draft_loss import _sgd, cotrain, grads, soft_ce, stats, step_state

    modules = (_sgd, cotrain, grads, soft_ce, stats, step_state, soft_ce.v, cotrain.CotrainWorker,
               soft_ce.TilePlan, stats.DraftLossStats, step_state.DraftStepState, _sgd.MomentumSGD)

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
