"""The summary's coverage lines give each value's share of the cases, so a skew
(a targeted search piling cases onto one degree, docs/fuzzing.md "Targeted
search") reads off the summary without arithmetic."""

from __future__ import annotations

from simdist.fuzz._stats import CampaignStats
from simdist.fuzz._summary import summary_text


def _campaign(per_tp: dict[int, int]) -> str:
    stats = CampaignStats()
    stats.add(0, {"e": "start", "properties": ["t.py::p"], "t": 0.1})
    for tp, cases in per_tp.items():
        for i in range(cases):
            features = {f"tp={tp}": "", f"dp={1 + i % 2}": "", f"world={tp * (1 + i % 2)}": ""}
            stats.add(0, {"e": "case", "p": "t.py::p", "s": "passed", "f": features})
    return summary_text(stats, elapsed=1.0, workers=1, seed=0, targets=["t.py"], problems=[], corpus="c")


def _line(text: str, head: str) -> str:
    [line] = [line for line in text.splitlines() if line.strip().startswith(head)]
    return line


def test_each_value_shows_its_share_of_the_cases_that_recorded_it() -> None:
    text = _campaign({1: 250, 2: 370, 4: 380})
    assert _line(text, "tp ").split() == [
        "tp",
        "1:",
        "250",
        "(25%)",
        "2:",
        "370",
        "(37%)",
        "4:",
        "380",
        "(38%)",
    ]
    assert _line(text, "dp ").split() == ["dp", "1:", "500", "(50%)", "2:", "500", "(50%)"]
    world = _line(text, "world sizes")
    assert "4: 375 (38%)" in world and world.endswith("(cases per size, share)")


def test_a_rare_value_is_not_rounded_to_nothing() -> None:
    line = _line(_campaign({1: 999, 8: 1}), "tp ")
    assert "8: 1 (<1%)" in line and "1: 999 (100%)" in line
