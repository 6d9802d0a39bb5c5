"""How many of a strategy's draws Hypothesis rejects before a test body runs.

A campaign counts those cases as ``gave_up`` (checked nothing). This draws
examples as a campaign round does (generation only, random seeds fixed for
repeatability) and counts, through Hypothesis' own observations, every case
that gave up and why: "exceeded maximum test case size" (a draw overran the
choices a case may make, also when Hypothesis' mutator copies a span's
choices over another's) or a filter or ``assume()``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.internal import observability


def gave_up(strategy: st.SearchStrategy[Any], *, examples: int = 100, seeds: range = range(2)) -> Counter:
    """``{reason: cases}`` of the cases that gave up, over ``len(seeds)`` runs of ``examples``."""
    reasons: Counter = Counter()
    statuses: Counter = Counter()

    def observe(observation: Any) -> None:
        if getattr(observation, "type", None) != "test_case":
            return
        statuses[observation.status] += 1
        if observation.status == "gave_up":
            reasons[str(observation.status_reason or "no reason given")] += 1

    # Line coverage per case would cost more than the draws themselves.
    collect = getattr(observability, "OBSERVABILITY_COLLECT_COVERAGE", None)
    if collect is not None:
        observability.OBSERVABILITY_COLLECT_COVERAGE = False
    try:
        for run_seed in seeds:

            @seed(run_seed)
            @settings(
                max_examples=examples,
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(strategy)
            def draw(value: Any) -> None:
                pass

            with observability.with_observability_callback(observe):
                draw()
    finally:
        if collect is not None:
            observability.OBSERVABILITY_COLLECT_COVERAGE = collect
    assert statuses["passed"] >= examples * len(seeds) // 2, f"too few cases ran: {dict(statuses)}"
    return reasons
