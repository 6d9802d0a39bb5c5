"""The workers' events, and what a campaign has seen in them so far: cases, coverage, failures.

The wire format is one JSON object a line, one file per worker. Workers
append; the campaign tails the files. Files (not pipes) keep a worker's record
intact when the campaign is interrupted, and make a run directory something a
person can read afterwards. ``CampaignStats`` is built only from the events,
so the live progress line, the final summary and the JSON report all say the
same thing.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = ["EXIT_HUNG_CASE", "CampaignStats", "EventReader", "EventWriter", "Failure", "worker_file"]

# A worker that ended itself at a case past its deadline (a failure it has
# already reported): not a crash.
EXIT_HUNG_CASE = 75


def worker_file(run_dir: Path, index: int, suffix: str = "jsonl") -> Path:
    """A worker's file in the run folder: its events (.jsonl), log, pid or exit status."""
    return run_dir / f"worker-{index}.{suffix}"


class EventWriter:
    def __init__(self, path: Path) -> None:
        self._file: TextIO = open(path, "a", encoding="utf-8")

    def emit(self, kind: str, **fields: Any) -> None:
        fields["e"] = kind
        self._file.write(json.dumps(fields, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class EventReader:
    """Reads whole lines appended since the last call (a half-written line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> Iterator[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                yield json.loads(line)


# Features whose values, joined, name a rank layout.
_LAYOUT_AXES = ("tp", "cp", "dp", "pp")


@dataclass
class Failure:
    property: str
    error_type: str
    error: str
    case: dict[str, Any] | None
    replayable: bool
    seed: int | None
    found_after_s: float
    worker: int
    report: str
    shrunk: bool = True
    file: str | None = None


@dataclass
class CampaignStats:
    cases: int = 0
    cases_by_status: Counter = field(default_factory=Counter)
    # Why cases gave up, as Hypothesis says, with where: "reason (file:line)" -> cases.
    gave_up_reasons: Counter = field(default_factory=Counter)
    cases_by_property: Counter = field(default_factory=Counter)
    cases_by_worker: Counter = field(default_factory=Counter)
    features: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    layouts: set[str] = field(default_factory=set)
    targets: dict[str, float] = field(default_factory=dict)
    case_seconds: float = 0.0
    properties: set[str] = field(default_factory=set)
    ignored: set[str] = field(default_factory=set)
    failures: list[Failure] = field(default_factory=list)
    first_failing_case_at: dict[str, float] = field(default_factory=dict)
    # Cases a property ran before its first failing one: 0 means the example
    # database replayed a known failure straight away.
    cases_before_first_failure: dict[str, int] = field(default_factory=dict)
    rounds: int = 0
    collect_errors: int = 0
    # What the environment raised (the example database), as text: not failures.
    environment_errors: list[str] = field(default_factory=list)
    done_reasons: dict[int, str] = field(default_factory=dict)
    # Per worker: seconds after the campaign's start it was ready, pytest's rootdir.
    ready_at: dict[int, float] = field(default_factory=dict)
    rootdirs: dict[int, str] = field(default_factory=dict)
    # Per worker: the property whose round is running (absent between rounds).
    in_case: dict[int, str] = field(default_factory=dict)
    # Per worker: when (seconds after the start) a round started or a case finished last.
    last_progress: dict[int, float] = field(default_factory=dict)
    hung_workers: set[int] = field(default_factory=set)
    leaks: dict[str, list[str]] = field(default_factory=dict)
    # Cases per property whose FaultPlan had rules and none fired.
    unfired_plans: Counter = field(default_factory=Counter)
    # Cases per world size (the product of the layout axes a case covers).
    world_sizes: Counter = field(default_factory=Counter)

    def add(self, worker: int, event: dict[str, Any]) -> None:
        kind = event.get("e")
        if kind in ("case", "round_start") and "t" in event:
            self.last_progress[worker] = max(self.last_progress.get(worker, 0.0), float(event["t"]))
        if kind == "case":
            self.cases_by_worker[worker] += 1
            self._add_case(event)
        elif kind == "round_start":
            self.in_case[worker] = str(event.get("p", "?"))
        elif kind == "round":
            self.rounds += 1
            self.in_case.pop(worker, None)
        elif kind == "stopped":
            # Interrupted mid-round; with a failing case seen, it was shrinking.
            if event.get("failing_seen"):
                self.in_case.pop(worker, None)
        elif kind == "start":
            self.properties.update(event.get("properties", []))
            self.ignored.update(event.get("ignored", []))
            self.ready_at[worker] = float(event.get("t", 0.0))
            if event.get("rootdir"):
                self.rootdirs[worker] = str(event["rootdir"])
        elif kind == "hung":
            self.hung_workers.add(worker)
            self.in_case.pop(worker, None)
        elif kind == "leak":
            self.leaks.setdefault(str(event.get("p", "?")), list(event.get("threads", [])))
        elif kind == "failure":
            self._add_failure(worker, event)
        elif kind == "environment":
            self.environment_errors.append(
                f"{event.get('what', 'the environment')} raised {event.get('error', '?')} "
                f"(worker {worker}, in a round of {event.get('p', '?')})"
            )
        elif kind == "collect_error":
            self.collect_errors += int(event.get("count", 1))
        elif kind == "done":
            self.done_reasons[worker] = str(event.get("reason", ""))

    def _add_case(self, event: dict[str, Any]) -> None:
        status = event.get("s", "passed")
        prop = event.get("p", "?")
        self.cases += 1
        self.cases_by_status[status] += 1
        self.cases_by_property[prop] += 1
        self.case_seconds += float(event.get("sec", 0.0))
        if event.get("unfired"):
            self.unfired_plans[prop] += 1
        if status == "gave_up":
            why = str(event.get("why") or "no reason given")
            self.gave_up_reasons[f"{why} ({event['at']})" if event.get("at") else why] += 1
        if status == "failed" and prop not in self.first_failing_case_at:
            self.first_failing_case_at[prop] = float(event.get("t", 0.0))
            self.cases_before_first_failure[prop] = self.cases_by_property[prop] - 1
        axes: dict[str, str] = {}
        world = None  # its ``world`` feature, else the product of its layout axes
        for name, value in event.get("f", {}).items():
            if name.startswith("target:"):
                label = name[len("target:") :] or "target"
                if isinstance(value, (int, float)):
                    self.targets[label] = max(self.targets.get(label, float("-inf")), float(value))
                continue
            key, sep, val = name.partition("=")
            if not sep:
                key, val = name, str(value) if value not in ("", None) else "yes"
            self.features[key][val] += 1
            if key in _LAYOUT_AXES:
                axes[key] = val
            elif key == "world" and world is None and val.isdigit():
                world = int(val)
        if axes:
            self.layouts.add("-".join(f"{a}{axes[a]}" for a in _LAYOUT_AXES if a in axes))
        if world is None and axes and all(v.isdigit() for v in axes.values()):
            world = math.prod(int(v) for v in axes.values())
        if world is not None:
            self.world_sizes[world] += 1

    def _add_failure(self, worker: int, event: dict[str, Any]) -> None:
        failure = Failure(
            property=event["p"],
            error_type=event.get("error_type", "failure"),
            error=event.get("error", ""),
            case=event.get("case"),
            replayable=bool(event.get("replayable")),
            seed=event.get("seed"),
            found_after_s=float(event.get("t", 0.0)),
            worker=worker,
            report=event.get("report", ""),
            shrunk=bool(event.get("shrunk", True)),
        )
        # Workers sharing a database can report the same bug twice, one of them
        # unshrunk: Hypothesis does not shrink again a failure it replays from
        # the database, and a peer may have saved it mid-shrink. Keep the
        # smallest case per property and error type.
        for i, known in enumerate(self.failures):
            if (known.property, known.error_type) == (failure.property, failure.error_type):
                if _size(failure.case) < _size(known.case):
                    failure.found_after_s = min(failure.found_after_s, known.found_after_s)
                    self.failures[i] = failure
                return
        self.failures.append(failure)

    def to_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "cases_by_status": dict(self.cases_by_status),
            "gave_up_reasons": dict(self.gave_up_reasons),
            "cases_by_property": dict(self.cases_by_property),
            "cases_by_worker": {str(k): v for k, v in sorted(self.cases_by_worker.items())},
            "case_seconds": round(self.case_seconds, 3),
            "distinct_layouts": sorted(self.layouts),
            "coverage": {k: dict(v) for k, v in sorted(self.features.items())},
            "best_targets": self.targets,
            "properties": sorted(self.properties),
            "ignored_tests": sorted(self.ignored),
            "rounds": self.rounds,
            "world_sizes": {str(k): v for k, v in sorted(self.world_sizes.items())},
            "ready_after_s": {str(k): v for k, v in sorted(self.ready_at.items())},
            "stop_reasons": {str(k): v for k, v in sorted(self.done_reasons.items())},
            "leaked_threads": self.leaks,
            "cases_with_unfired_fault_plans": dict(self.unfired_plans),
            "failures": [
                {
                    **asdict(f),
                    "first_failing_case_after_s": self.first_failing_case_at.get(f.property),
                    "cases_before_first_failure": self.cases_before_first_failure.get(f.property),
                }
                for f in self.failures
            ],
        }


def _size(case: dict[str, Any] | None) -> tuple[int, str]:
    text = json.dumps(case, sort_keys=True)
    return (len(text), text)
