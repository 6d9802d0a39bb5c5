"""``simdist.fuzz.replayable`` / ``cover`` and case files, in-process (no campaign)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist import fuzz
from simdist.fuzz import CaseFileError, read_case, replay_case, write_case
from simdist.fuzz._property import clear_failures, last_failure, spec_of


def test_replayable_needs_the_case_parameter_and_a_callable_decoder():
    with pytest.raises(TypeError, match=r"has no parameter 'case'.*\['values'\]"):
        fuzz.replayable(dict)(lambda values: None)
    with pytest.raises(TypeError, match="decode must be callable"):
        fuzz.replayable("not callable")  # type: ignore[arg-type]


def test_the_last_failure_recorded_is_the_shrunk_case():
    clear_failures()

    @settings(database=None, derandomize=True, max_examples=200)
    @given(case=st.fixed_dictionaries({"x": st.integers(0, 10_000)}))
    @fuzz.replayable(dict)
    def prop(case):
        assert case["x"] < 1234

    with pytest.raises(AssertionError):
        prop()
    record = last_failure(prop)
    assert record is not None and record.case == {"x": 1234} and record.error_type == "AssertionError"
    assert spec_of(prop).arg == "case"


def test_a_case_that_is_not_json_is_refused_clearly():
    clear_failures()

    @settings(database=None, max_examples=5)
    @given(case=st.just({"t": object()}))
    @fuzz.replayable(dict)
    def prop(case):
        raise ValueError("boom")

    with pytest.raises(TypeError, match="not JSON-serialisable"):
        prop()


def test_cover_outside_a_test_does_nothing():
    fuzz.cover(tp=2)  # no Hypothesis context: must not raise


def test_case_files_round_trip_and_bad_files_are_named(tmp_path):
    path = write_case(tmp_path, "tests/x.py::test_p", {"a": [1, 2]}, "AssertionError", "bad", {"seed": 1})
    case = read_case(path)
    assert (case.target, case.case, case.error["type"], case.found["seed"]) == (
        "tests/x.py::test_p",
        {"a": [1, 2]},
        "AssertionError",
        1,
    )
    # The same property and case always get the same file name.
    assert write_case(tmp_path, "tests/x.py::test_p", {"a": [1, 2]}, "E", "", {}) == path
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CaseFileError, match="not a simdist fuzz case"):
        read_case(wrong)
    with pytest.raises(CaseFileError, match="no such file"):
        read_case(tmp_path / "missing.json")
    missing_target = write_case(tmp_path, "tests/nowhere_at_all.py::test_p", {}, "E", "", {})
    with pytest.raises(CaseFileError, match="not found"):
        replay_case(missing_target)


def test_the_progress_line_past_the_budget_says_what_the_workers_are_doing():
    from simdist.fuzz._stats import CampaignStats, Failure
    from simdist.fuzz._summary import progress_line

    stats = CampaignStats()
    assert "finishing" not in progress_line(stats, 30.0, 60.0, 2)
    assert progress_line(stats, 61.0, 60.0, 2).endswith("(finishing the cases in hand)")
    stats.failures.append(Failure("p", "AssertionError", "boom", {"x": 1}, True, 0, 1.0, 0, ""))
    line = progress_line(stats, 61.0, 60.0, 2)
    assert "failures 1" in line and line.endswith("(finishing: shrinking failures)")


def test_the_summary_shows_world_sizes_run_why_workers_stopped_and_what_gave_up_means():
    from simdist.fuzz._stats import CampaignStats
    from simdist.fuzz._summary import summary_text

    stats = CampaignStats()
    stats.add(0, {"e": "start", "properties": ["t.py::p"], "t": 2.5})
    stats.add(0, {"e": "case", "p": "t.py::p", "s": "passed", "f": {"tp=2": "", "dp=1": ""}})
    stats.add(0, {"e": "case", "p": "t.py::p", "s": "passed", "f": {"world=3": ""}})
    stats.add(0, {"e": "case", "p": "t.py::p", "s": "gave_up", "f": {}})
    stats.add(0, {"e": "done", "reason": "every property failed"})
    text = summary_text(stats, elapsed=3.0, workers=1, seed=0, targets=["t.py"], problems=[], corpus="cases")
    assert "world sizes 2: 1 (50%)  3: 1 (50%) (cases per size, share)" in text
    assert "gave_up     1 case(s) rejected before they ran" in text
    assert "every property failed: a failing property is not fuzzed further" in text
    assert "workers ready after 2.5 s" in text and "cases go to cases" in text


def test_the_summary_says_which_draw_rejected_the_cases_that_gave_up():
    # Before, "gave_up" blamed assume() or filters the user never wrote; the reason
    # and place now come from Hypothesis' own observation of each rejected case.
    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis import strategies as st
    from hypothesis.internal import observability

    from simdist.fuzz._stats import CampaignStats
    from simdist.fuzz._summary import summary_text
    from simdist.fuzz._worker import _gave_up_because

    events: list[dict] = []

    def observe(observation) -> None:
        if getattr(observation, "type", None) == "test_case" and observation.status == "gave_up":
            events.append(
                {"e": "case", "p": "t.py::p", "s": "gave_up", "f": {}, **_gave_up_because(observation)}
            )

    @settings(max_examples=20, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, 9))
    def rejects_odd(x: int) -> None:
        assume(x % 2 == 0)

    observability.add_observability_callback(observe)
    try:
        rejects_odd()
    finally:
        observability.remove_observability_callback(observe)
    assert events and all("assume" in e["why"] and "test_fuzz_property.py:" in e["at"] for e in events)
    stats = CampaignStats()
    for event in events:
        stats.add(0, event)
    stats.add(
        0, {"e": "case", "p": "t.py::p", "s": "gave_up", "f": {}, "why": "exceeded maximum test case size"}
    )
    text = summary_text(stats, elapsed=1.0, workers=1, seed=0, targets=["t.py"], problems=[], corpus="cases")
    assert f"{len(events)}: {events[0]['why']} ({events[0]['at']})" in text
    assert "1: exceeded maximum test case size (a strategy drew more choices" in text
    assert stats.to_json()["gave_up_reasons"]
