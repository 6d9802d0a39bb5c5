"""Search power as a number: the fuzz campaign against generated mutants of draft_loss.

Generates mutants of draft_loss's source (benchmarks/_mutate.py: operator,
constant, call and statement changes, each one edit of one file, with a
stable id ``<module>:<line>:<col>:<operator>``), and runs `simdist fuzz`
(the default target, a fresh example database and corpus, stop at the first
failure) once per mutant in a copy of the repository holding the mutated
file. A mutant is killed when the campaign exits 1 with a failure in its
report, killed at collection when the mutant makes the target fail to import
or collect (exit 2). Then prints the kill rate and triages the survivors:

- not reached: no line of the mutated code ran in a derandomised pass of the
  target's properties under a line tracer (benchmarks/_reach.py);
- error path: inside an ``except`` body, an ``assert`` or an ``if`` that raises
  (validation), which only bad-input properties can tell apart;
- likely equivalent: a rule says the change cannot alter any value (printed
  with the mutant);
- needs review: the rest, each a candidate gap in the campaign.

    python benchmarks/mutation.py --list                      # the mutants, nothing run
    python benchmarks/mutation.py --sample 40 --seed 7 --budget 60 --workers auto --json mutation.json
    python benchmarks/mutation.py --files draft_loss/soft_ce.py --budget 20
    python benchmarks/mutation.py --ids soft_ce:294:35:amax-amin,stats:100:24:int-1to0

The copy holds the work tree's files that git tracks or would track (not the
ignored ones), taken once at the start, so the campaign measured is the one
on disk. It is imported from the copy (PYTHONPATH and cwd), which is checked
before any campaign. A clean campaign on the unmutated copy runs first
(``--no-baseline`` skips it): if it fails, kills are not the mutants' doing.

Prints; asserts nothing. Exit status 0 whatever the kill rate; 2 when the
script itself cannot run (bad arguments, the copy not importable or not
the one imported).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _mutate
from _common import ROOT
from _mutate import Mutant

PACKAGE = "draft_loss"
REACH_SCRIPT = Path(__file__).resolve().with_name("_reach.py")
FORMAT = "simdist-mutation/1"
# A campaign's own start-up (import torch, collect the target) and wind-down,
# on top of budget, grace and one case timeout, before it is stopped.
STARTUP_ALLOWANCE_S = 180.0

KILLED, AT_COLLECTION, SURVIVED = "killed", "killed at collection", "survived"
NO_VERDICT = ("crashed", "timed out")

NOT_REACHED, ERROR_PATH, EQUIVALENT, REVIEW = "not reached", "error path", "likely equivalent", "needs review"
TRIAGE_ORDER = (NOT_REACHED, ERROR_PATH, EQUIVALENT, REVIEW)


class ToolError(Exception):
    """This script cannot measure anything (exit 2), as opposed to a measurement."""


# ------------------------------------------------------------------ the copy


def work_tree_files(root: Path) -> list[str]:
    """Files git tracks or would track (not ignored) that exist in the work tree."""
    command = ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    proc = subprocess.run(command, capture_output=True)
    if proc.returncode != 0:
        raise ToolError("the repository's files are listed by git: run this from a git checkout")
    listing = proc.stdout.decode()
    return sorted({name for name in listing.split("\0") if name and (root / name).is_file()})


def export(root: Path, files: Sequence[str], dest: Path) -> None:
    for name in files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)


def fresh_copy(base: Path, dest: Path, mutant: Mutant | None) -> None:
    """``base`` again at ``dest``, with the mutant's file written over."""
    shutil.copytree(base, dest, ignore=shutil.ignore_patterns("__pycache__", ".simdist", ".hypothesis"))
    if mutant is not None:
        (dest / mutant.path).write_text(mutant.source, encoding="utf-8")


def copy_env(copy: Path) -> dict[str, str]:
    """The environment of anything run in a copy: its modules first on the path,
    no catalogue mutant, and no bytecode cache (a cached .pyc of the original
    has the mutant's size and, within a second, its mtime)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DRAFT_LOSS_MUTANT", "SIMDIST_FUZZ_WORKER")}
    return {**env, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}


def check_imports_from(copy: Path) -> None:
    """simdist and draft_loss are imported from the copy, not the editable install."""
    probe = "import draft_loss, simdist; print(draft_loss.__file__); print(simdist.__file__)"
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=copy, env=copy_env(copy), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise ToolError(f"the unmutated copy does not import:\n{sanitise(proc.stderr, copy)[-2000:]}")
    for module_file in proc.stdout.split():
        if not Path(module_file).resolve().is_relative_to(copy.resolve()):
            raise ToolError("the copy's imports resolve outside it (the checkout's install comes first)")


# ------------------------------------------------------------------ reach


@dataclass(frozen=True)
class Reach:
    exit: int
    failed: list[str]  # tests of the unmutated target that failed in the pass
    lines: dict[str, set[int]]

    def reached(self, mutant: Mutant) -> bool:
        first, last = mutant.lines
        hits = self.lines.get(mutant.path, set())
        return any(line in hits for line in range(first, last + 1))


def measure_reach(base: Path, scratch: Path, targets: Sequence[str]) -> Reach:
    copy = scratch / "reach"
    fresh_copy(base, copy, None)
    out = scratch / "reach.json"
    proc = subprocess.run(
        [sys.executable, str(REACH_SCRIPT), str(out), *targets],
        cwd=copy,
        env=copy_env(copy),
        capture_output=True,
        text=True,
    )
    shutil.rmtree(copy, ignore_errors=True)
    if proc.returncode != 0 or not out.exists():
        raise ToolError(f"the line-reach pass failed:\n{sanitise(proc.stdout + proc.stderr, copy)[-2000:]}")
    data = json.loads(out.read_text(encoding="utf-8"))
    if not str(data["package_file"]).startswith(PACKAGE + "/"):
        raise ToolError("inside pytest the checkout's draft_loss was imported, not the copy's")
    if data["exit"] not in (0, 1):
        raise ToolError(f"the unmutated target does not collect (pytest exit {data['exit']})")
    return Reach(data["exit"], data["failed"], {path: set(lines) for path, lines in data["lines"].items()})


# ------------------------------------------------------------------ campaigns


@dataclass(frozen=True)
class CampaignOptions:
    budget: float
    workers: str
    seed: int
    grace: float
    case_timeout: float
    targets: tuple[str, ...]

    def args(self) -> list[str]:
        return [
            *self.targets,
            *("--budget", str(self.budget), "--workers", self.workers, "-x", "--seed", str(self.seed)),
            *("--grace", str(self.grace), "--case-timeout", str(self.case_timeout)),
        ]

    @property
    def timeout_s(self) -> float:
        return self.budget + self.grace + self.case_timeout + STARTUP_ALLOWANCE_S


@dataclass(frozen=True)
class Outcome:
    status: str
    seconds: float
    exit: int | None
    killed_by: str = ""  # the property, for a kill
    error: str = ""


def run_campaign(copy: Path, scratch: Path, opts: CampaignOptions, tag: str) -> Outcome:
    """One `simdist fuzz` in ``copy`` (fresh database and corpus under ``scratch``)."""
    report = scratch / "report.json"
    command = [sys.executable, "-m", "simdist.cli", "fuzz", *opts.args(), "--tag", f"mutant={tag}"]
    fresh = {"--database": scratch / "db", "--corpus": scratch / "corpus", "--report": report}
    command += [str(part) for pair in fresh.items() for part in pair]
    start = time.perf_counter()
    # A session of its own: a campaign past its time is stopped with all its workers.
    proc = subprocess.Popen(
        command,
        cwd=copy,
        env=copy_env(copy),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=opts.timeout_s)
    except subprocess.TimeoutExpired:
        _stop(proc)
        return Outcome("timed out", time.perf_counter() - start, None)
    except KeyboardInterrupt:  # its own session does not see the terminal's Ctrl-C
        _stop(proc)
        raise
    seconds = time.perf_counter() - start
    data = json.loads(report.read_text(encoding="utf-8")) if report.exists() else {}
    return verdict(proc.returncode, data, seconds, sanitise(output, copy))


def _stop(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C first (the campaign stops its workers), then the whole session."""
    for sig, wait in ((signal.SIGINT, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.communicate(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def verdict(exit_code: int, report: dict[str, Any], seconds: float, output: str) -> Outcome:
    """What a campaign's exit status and report say about its mutant."""
    failures = report.get("failures") or []
    if exit_code == 1 and failures:
        first = failures[0]
        prop = str(first.get("property", "")).rsplit("::", 1)[-1]
        message = str(first.get("error", "")).strip().splitlines()
        error = f"{first.get('error_type', '')}: {message[0] if message else ''}"[:160]
        return Outcome(KILLED, seconds, exit_code, prop, error)
    if exit_code == 0:
        return Outcome(SURVIVED, seconds, exit_code)
    target_errors = [p for p in report.get("problems") or [] if str(p).startswith("target error")]
    if exit_code == 2 and target_errors:
        return Outcome(AT_COLLECTION, seconds, exit_code, "", _last_error_line(target_errors[0]))
    return Outcome("crashed", seconds, exit_code, "", _last_error_line(output))


def _last_error_line(text: str) -> str:
    """The line a traceback ends with (pytest marks it ``E``), else the last line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    marked = [line.removeprefix("E").strip() for line in lines if line.startswith("E ")]
    return (marked or lines or [""])[-1][:160]


def sanitise(text: str, copy: Path) -> str:
    """No path of this machine in what is printed or written."""
    places = {str(copy): "<copy>", str(ROOT): "<checkout>", sys.prefix: "<python>"}
    places |= {sys.base_prefix: "<python>", tempfile.gettempdir(): "<tmp>"}
    places |= {str(Path(path).resolve()): name for path, name in places.items()}
    for path in sorted(places, key=len, reverse=True):  # the copy before the temporary folder holding it
        if len(path) > 1:  # never "/" itself
            text = text.replace(path, places[path])
    return text


# ------------------------------------------------------------------ selection and triage


def select(
    mutants: Sequence[Mutant], ids: Sequence[str] = (), sample: int | None = None, seed: int = 0
) -> list[Mutant]:
    """``ids`` (in generation order), else a ``sample`` drawn with ``seed``, else all."""
    if ids:
        known = {m.id for m in mutants}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise ToolError(f"unknown mutant id(s): {', '.join(unknown)} (--list shows them)")
        wanted = set(ids)
        return [m for m in mutants if m.id in wanted]
    if sample is None or sample >= len(mutants):
        return list(mutants)
    picked = set(random.Random(seed).sample(range(len(mutants)), sample))
    return [m for k, m in enumerate(mutants) if k in picked]


def triage(mutant: Mutant, reach: Reach | None) -> tuple[str, str]:
    """A survivor's category and why."""
    if reach is not None and not reach.reached(mutant):
        return NOT_REACHED, f"lines {mutant.lines[0]}-{mutant.lines[1]} never ran in the reach pass"
    if mutant.error_path:
        return ERROR_PATH, "inside an except body, an assert or an if that raises"
    if mutant.equivalent:
        return EQUIVALENT, f"{mutant.equivalent}: {_mutate.EQUIVALENCE_RULES[mutant.equivalent]}"
    return REVIEW, ""


# ------------------------------------------------------------------ output


def row_of(index: int, mutant: Mutant, outcome: Outcome, reach: Reach | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "index": index,
        "id": mutant.id,
        "file": mutant.path,
        "line": mutant.line,
        "operator": mutant.operator,
        "change": mutant.description,
        "status": outcome.status,
        "seconds": round(outcome.seconds, 1),
        "exit": outcome.exit,
        "property": outcome.killed_by,
        "error": outcome.error,
        "reached": None if reach is None else reach.reached(mutant),
        "error_path": mutant.error_path,
        "equivalence_rule": mutant.equivalent,
    }
    if outcome.status == SURVIVED:
        row["triage"], row["triage_reason"] = triage(mutant, reach)
    return row


def print_row(row: dict[str, Any], total: int) -> None:
    where = f"{row['file']}:{row['line']}"
    print(
        f"{row['index']:>4}/{total}  {row['id']:<44} {where:<34} {row['operator']:<16} "
        f"{row['status']:<21} {row['seconds']:>6.1f} s  {row['property'] or '-'}",
        flush=True,
    )


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    killed = sum(r["status"] == KILLED for r in rows)
    at_collection = sum(r["status"] == AT_COLLECTION for r in rows)
    survivors = [r for r in rows if r["status"] == SURVIVED]
    judged = killed + at_collection + len(survivors)
    equivalent = sum(r.get("triage") == EQUIVALENT for r in survivors)
    caught = killed + at_collection
    return {
        "mutants": len(rows),
        "killed": killed,
        "killed_at_collection": at_collection,
        "survived": len(survivors),
        "no_verdict": len(rows) - judged,
        "kill_rate": caught / judged if judged else None,
        "likely_equivalent": equivalent,
        "kill_rate_without_equivalent": caught / (judged - equivalent) if judged > equivalent else None,
        "survivors": {cat: [r["id"] for r in survivors if r["triage"] == cat] for cat in TRIAGE_ORDER},
    }


def _rate(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.0f}%"


def print_summary(summary: dict[str, Any], rows: Sequence[dict[str, Any]]) -> None:
    s = summary
    caught = s["killed"] + s["killed_at_collection"]
    judged = caught + s["survived"]
    print(
        f"\nkill rate: {caught}/{judged} = {_rate(s['kill_rate'])} "
        f"(killed {s['killed']}, at collection {s['killed_at_collection']}, survived {s['survived']}; "
        f"no verdict {s['no_verdict']}: crashed or timed out, not counted)"
    )
    without = judged - s["likely_equivalent"]
    print(
        f"excluding {s['likely_equivalent']} likely equivalent: {caught}/{without} = "
        f"{_rate(s['kill_rate_without_equivalent'])}"
    )
    by_id = {r["id"]: r for r in rows}
    for category in TRIAGE_ORDER:
        ids = s["survivors"][category]
        if not ids:
            continue
        print(f"\nsurvivors, {category} ({len(ids)}):")
        for mutant_id in ids:
            r = by_id[mutant_id]
            reason = f"  [{r['triage_reason']}]" if r["triage_reason"] else ""
            print(f"  {mutant_id:<44} {r['change']}{reason}")
    for r in rows:
        if r["status"] in NO_VERDICT:
            print(f"\nno verdict: {r['id']} {r['status']} (exit {r['exit']}): {r['error']}")


# ------------------------------------------------------------------ main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", default="", help="comma-separated files of draft_loss (default: all of it)")
    p.add_argument("--ids", default="", help="comma-separated mutant ids (see --list)")
    p.add_argument("--sample", type=int, default=None, help="run N mutants drawn at random with --seed")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed and every campaign's seed")
    p.add_argument("--budget", type=float, default=30.0, help="seconds of search per mutant (default 30)")
    p.add_argument("--workers", default="1", help="campaign workers per mutant, or 'auto'")
    p.add_argument("--grace", type=float, default=10.0, help="seconds to shrink a failure past the budget")
    p.add_argument("--case-timeout", type=float, default=60.0, help="seconds one case may run (a hang)")
    p.add_argument("--target", action="append", default=[], help="campaign target (default: the project's)")
    p.add_argument("--no-reach", action="store_true", help="skip the line-reach pass")
    p.add_argument("--no-baseline", action="store_true", help="skip the campaign on the unmutated copy")
    p.add_argument("--list", action="store_true", help="print the selected mutants and run nothing")
    p.add_argument("--json", type=Path, default=None, help="write the rows and the summary here")
    return p


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def generate(root: Path, files: Sequence[str]) -> list[Mutant]:
    every = _mutate.package_files(root, PACKAGE)
    unknown = [f for f in files if f not in every]
    if unknown:
        raise ToolError(f"not a file of {PACKAGE}/: {', '.join(unknown)}")
    return list(_mutate.mutants_of_tree(root, files or every))


def list_mutants(mutants: Sequence[Mutant]) -> None:
    for m in mutants:
        tags = ", ".join(t for t in ("error path" if m.error_path else "", m.equivalent or "") if t)
        print(f"{m.id:<44} {m.path}:{m.line:<6} {m.description}" + (f"  [{tags}]" if tags else ""))
    print(f"{len(mutants)} mutant(s)")


def measure(
    opts: argparse.Namespace, base: Path, scratch: Path, chosen: Sequence[Mutant]
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The reach pass, the baseline, then one campaign per mutant, printed as they end."""
    campaign = CampaignOptions(
        opts.budget, opts.workers, opts.seed, opts.grace, opts.case_timeout, tuple(opts.target)
    )
    check_imports_from(base)
    reach = None if opts.no_reach else measure_reach(base, scratch, campaign.targets)
    if reach is not None:
        ran = sum(map(len, reach.lines.values()))
        print(f"reach: {ran} lines of {PACKAGE} ran in the target's properties (pytest exit {reach.exit})")
        for nodeid in reach.failed:
            print(f"  the unmutated target FAILED {nodeid} in the reach pass")
    baseline = None if opts.no_baseline else _baseline(base, scratch, campaign)
    rows = []
    for index, mutant in enumerate(chosen, 1):
        copy, run_dir = scratch / "copy", scratch / "run"
        fresh_copy(base, copy, mutant)
        run_dir.mkdir()
        try:
            outcome = run_campaign(copy, run_dir, campaign, mutant.id)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
            shutil.rmtree(run_dir, ignore_errors=True)
        rows.append(row_of(index, mutant, outcome, reach))
        print_row(rows[-1], len(chosen))
    summary = summarise(rows)
    print_summary(summary, rows)
    names = ("budget", "workers", "seed", "grace", "case_timeout", "sample", "files", "target")
    options = {k: getattr(opts, k) for k in names}
    reach_info = None
    if reach is not None:
        reach_info = {"pytest_exit": reach.exit, "failed": reach.failed, "files": len(reach.lines)}
    return {"format": FORMAT, "options": options, "baseline": baseline, "reach": reach_info}, rows, summary


def _baseline(base: Path, scratch: Path, campaign: CampaignOptions) -> dict[str, Any]:
    copy, run_dir = scratch / "copy", scratch / "run"
    fresh_copy(base, copy, None)
    run_dir.mkdir()
    try:
        outcome = run_campaign(copy, run_dir, campaign, "none")
    finally:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    clean = outcome.status == SURVIVED
    note = "clean" if clean else f"NOT CLEAN ({outcome.status} {outcome.killed_by} {outcome.error})"
    print(f"baseline (no mutant): {note}, {outcome.seconds:.1f} s", flush=True)
    if not clean:
        print("  the campaign fails without any mutant: kills below are not all the mutants' doing")
    return {"status": outcome.status, "seconds": round(outcome.seconds, 1), "property": outcome.killed_by}


def main(argv: Sequence[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    try:
        if opts.list:  # the mutants of the work tree as it is: no snapshot needed
            list_mutants(select(generate(ROOT, _csv(opts.files)), _csv(opts.ids), opts.sample, opts.seed))
            return 0
        with tempfile.TemporaryDirectory(prefix="simdist-mutation-") as tmp:
            scratch = Path(tmp)
            base = scratch / "base"
            export(ROOT, work_tree_files(ROOT), base)  # one snapshot: the mutants' line numbers are its
            mutants = generate(base, _csv(opts.files))
            chosen = select(mutants, _csv(opts.ids), opts.sample, opts.seed)
            print(f"{len(chosen)} of {len(mutants)} mutant(s), {opts.budget:g} s each, seed {opts.seed}")
            header, rows, summary = measure(opts, base, scratch, chosen)
    except ToolError as exc:
        print(f"mutation: {exc}", file=sys.stderr)
        return 2
    if opts.json:
        result = {**header, "mutants_generated": len(mutants), "summary": summary, "rows": rows}
        opts.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
