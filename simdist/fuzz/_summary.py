"""Human-readable output of a campaign: the live progress line and the summary."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from ._stats import CampaignStats

__all__ = ["junit_xml", "progress_line", "summary_text"]

# Coverage rows in this order first; any other feature follows alphabetically.
_ORDER = (
    "world",
    "tp",
    "cp",
    "dp",
    "pp",
    "microbatches",
    "dtype",
    "reduction",
    "zero_count",
    "fault",
    "clip",
)


# Why workers stopped, as the summary explains it (any other reason as the worker gave it).
_REASONS = {
    "every property failed": (
        "every property failed: a failing property is not fuzzed further (fix it, or name "
        "the others as targets, to search on)"
    ),
    "stopped at the first failure": "stopped at the first failure (-x)",
    "stopped": "stopped (by a peer's -x, or the campaign)",
}


# Why a single-property campaign ends at its first failure without -x.
_ONLY_PROPERTY_FAILED = (
    "its only property failed, so the campaign ended before its budget (later rounds would "
    "replay that failure first from the example database, or find it again); fix it to search on"
)


# Hypothesis' reason for an overrun, said in terms of what to change.
_GAVE_UP_HINTS = {
    "exceeded maximum test case size": "exceeded maximum test case size "
    "(a strategy drew more choices than Hypothesis allows a case: draw fewer or shorter values; "
    "or Hypothesis' mutator copied a part of a case over another that draws a different number "
    "of choices: make every case draw the same choices, e.g. draw conditional parts always)",
}


def _short(nodeid: str) -> str:
    return nodeid.rsplit("::", 1)[-1]


def progress_line(stats: CampaignStats, elapsed: float, budget: float, workers: int) -> str:
    rate = stats.cases / elapsed if elapsed > 0 else 0.0
    # Past the budget, workers finish the case in hand, or shrink a failure.
    phase = (
        ""
        if elapsed <= budget
        else (" (finishing: shrinking failures)" if stats.failures else " (finishing the cases in hand)")
    )
    if stats.cases == 0 and not stats.failures and elapsed <= budget:
        # Start-up: say what the workers are doing while no case has run.
        ready = len(stats.ready_at)
        phase += (
            " (starting: importing and collecting the target)"
            if ready == 0
            else f" ({ready}/{workers} worker(s) ready: running the first cases)"
        )
    return (
        f"fuzz {elapsed:5.0f}/{budget:.0f} s  cases {stats.cases} ({rate:.1f}/s)  "
        f"layouts {len(stats.layouts)}  failures {len(stats.failures)}  workers {workers}{phase}"
    )


def _values(counter: Any) -> str:
    """``value: cases (share)`` for each value: the share makes a skew visible at a
    glance (a targeted search that piles a third of the cases onto one degree)."""

    def order(item: tuple[str, int]) -> tuple[int, Any]:
        value = item[0]
        return (0, int(value)) if value.lstrip("-").isdigit() else (1, value)

    total = sum(counter.values())
    return "  ".join(
        f"{value}: {count} ({_share(count, total)})" for value, count in sorted(counter.items(), key=order)
    )


def _share(count: int, total: int) -> str:
    if total <= 0:
        return "-"
    percent = 100.0 * count / total
    return "<1%" if 0 < percent < 0.5 else f"{percent:.0f}%"


def summary_text(
    stats: CampaignStats,
    *,
    elapsed: float,
    workers: int,
    seed: int,
    targets: Sequence[str],
    problems: Sequence[str],
    corpus: str | None = None,
    database: str | None = None,
    logs: str | None = None,
) -> str:
    rate = stats.cases / elapsed if elapsed > 0 else 0.0
    status = ", ".join(f"{n} {s}" for s, n in sorted(stats.cases_by_status.items()))
    lines = [
        "",
        f"simdist fuzz: {elapsed:.1f} s, {workers} worker(s), seed {seed}, target {' '.join(targets)}",
        f"  cases       {stats.cases} ({rate:.1f}/s{'; ' + status if status else ''})",
        f"  properties  {len(stats.properties)}: "
        + ", ".join(f"{_short(p)} {stats.cases_by_property.get(p, 0)}" for p in sorted(stats.properties)),
        f"  layouts     {len(stats.layouts)} distinct",
    ]
    if stats.world_sizes:
        lines.append(
            f"  world sizes {_values({str(k): v for k, v in stats.world_sizes.items()})} (cases per size, share)"
        )
    if stats.ready_at:
        lines.append(
            "  start-up    workers ready after "
            + ", ".join(f"{t:.1f} s" for _, t in sorted(stats.ready_at.items()))
            + " (budget counted from there)"
        )
    reasons = sorted(set(stats.done_reasons.values()))
    if reasons:
        why = "; ".join(_REASONS.get(r, r) for r in reasons)
        if "every property failed" in reasons and len(stats.properties) == 1:
            why += f"; {_ONLY_PROPERTY_FAILED}"
        lines.append(f"  stopped     {why}")
    if stats.cases_by_status.get("gave_up"):
        lines.append(
            f"  gave_up     {stats.cases_by_status['gave_up']} case(s) rejected before they ran "
            "(assume() was false, a filter or .filter() rejected the draw, or the data ran out): "
            "not checked; many means the strategy wastes time"
        )
        # Which draw rejected: an assume() or filter names its line, a draw
        # past Hypothesis' size limit says so (a strategy drawing too many choices).
        for why, count in stats.gave_up_reasons.most_common(3):
            lines.append(f"              {count}: {_GAVE_UP_HINTS.get(why, why)}")
    lines.append(f"  cases go to {corpus}" if corpus else "  cases go to nowhere (--no-corpus)")
    # The output policy (docs/fuzzing.md, "Where outputs go"): cases to the
    # target's project, a campaign's state under the current directory's .simdist/.
    if database is not None:
        lines.append(f"  database    {database}")
    if logs is not None:
        lines.append(f"  logs        {logs}")
    if stats.features:
        lines.append("coverage (cases per value)")
        names = [n for n in _ORDER if n in stats.features] + sorted(set(stats.features) - set(_ORDER))
        width = max(len(n) for n in names)
        lines += [f"  {n:<{width}}  {_values(stats.features[n])}" for n in names]
    if stats.targets:
        lines.append("hardest cases found (hypothesis.target, highest)")
        lines += [f"  {label}: {value:.3g}" for label, value in sorted(stats.targets.items())]
    for problem in problems:
        lines.append(problem if problem.startswith("note:") else f"PROBLEM: {problem}")
    lines += _failure_lines(stats)
    return "\n".join(lines)


def _failure_lines(stats: CampaignStats) -> list[str]:
    """Each failure: its property, error, when it was found, its case and how to replay it."""
    if not stats.failures:
        return ["failures: none"]
    lines = [f"failures: {len(stats.failures)}"]
    for i, f in enumerate(stats.failures, 1):
        first = stats.first_failing_case_at.get(f.property)
        when = f"first failing case after {first:.1f} s, " if first is not None else ""
        lines.append(f"  {i}. {f.property}")
        lines.append(f"     {f.error_type}: {_first_lines(f.error, 6)}")
        lines.append(f"     ({when}reported after {f.found_after_s:.1f} s, worker {f.worker})")
        if f.case is not None:
            label = "shrunk case" if f.shrunk else "case (stopped before shrinking finished)"
            lines.append(f"     {label}: {json.dumps(f.case, sort_keys=True)}")
        if f.file:
            lines.append(f"     written to {f.file}; replay: simdist replay {f.file}")
        elif not f.replayable:
            lines.append(
                "     (not a @simdist.fuzz.replayable property: see the report above for Hypothesis' falsifying example)"
            )
            lines.append("     " + _first_lines(f.report, 30).replace("\n", "\n     "))
    return lines


def _first_lines(text: str, n: int) -> str:
    parts = text.strip().splitlines()
    head = "\n     ".join(parts[:n])
    return head + (f"\n     ... ({len(parts) - n} more lines)" if len(parts) > n else "")


def junit_xml(stats: CampaignStats, elapsed: float, problems: Sequence[str]) -> str:
    failed = {f.property: f for f in stats.failures}
    cases = []
    for prop in sorted(stats.properties):
        path, _, name = prop.rpartition("::")
        body = ""
        f = failed.get(prop)
        if f is not None:
            detail = f"case: {json.dumps(f.case, sort_keys=True)}\n\n{f.report}"
            body = (
                f"<failure message={quoteattr(f'{f.error_type}: {f.error}'[:2000])} "
                f"type={quoteattr(f.error_type)}>{escape(detail)}</failure>"
            )
        cases.append(
            f'  <testcase classname={quoteattr(path)} name={quoteattr(name)} time="0">'
            f"<system-out>{escape(str(stats.cases_by_property.get(prop, 0)))} cases</system-out>{body}</testcase>"
        )
    for i, problem in enumerate(problems):
        cases.append(
            f'  <testcase classname="simdist.fuzz" name="campaign-{i}"><error message={quoteattr(problem[:2000])}/></testcase>'
        )
    errors = len(problems)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        f'<testsuite name="simdist-fuzz" tests="{len(cases)}" failures="{len(failed)}" errors="{errors}" '
        f'time="{elapsed:.1f}">\n' + "\n".join(cases) + "\n</testsuite>\n"
    )
