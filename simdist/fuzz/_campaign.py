"""A campaign: worker processes fuzzing the target until the budget is spent.

The wall-clock budget covers the search. Failures found near its end still
get shrunk (up to ``grace`` seconds more), because an unshrunk case is hard to
read; after that the workers are stopped whatever they are doing.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ._corpus import write_case
from ._database import DatabaseSpecError, resolve_database
from ._events import EventReader, worker_file
from ._stats import CampaignStats
from ._summary import junit_xml, progress_line, summary_text

__all__ = ["CampaignConfig", "CampaignResult", "ExitCode", "default_targets", "run_campaign"]


class ExitCode:
    CLEAN = 0
    FAILED = 1  # a property of the target failed
    USAGE = 2  # bad arguments, or a target that cannot be collected
    CRASHED = 3  # simdist's own machinery broke (a worker died)
    INTERRUPTED = 130


@dataclass
class CampaignConfig:
    targets: Sequence[str]
    budget: float = 60.0
    seed: int | None = None
    workers: int = 1
    max_world_size: int | None = None
    database: str | None = ".simdist/fuzz-db"
    corpus: Path | None = Path("fixtures/regressions")
    report: Path | None = None
    junit: Path | None = None
    stop_on_failure: bool = False
    runs_dir: Path = Path(".simdist/fuzz-runs")
    tags: dict[str, str] = field(default_factory=dict)
    grace: float = 120.0
    out: IO[str] = sys.stderr
    live: bool | None = None  # a redrawn progress line; default: when `out` is a terminal


@dataclass
class CampaignResult:
    exit_code: int
    stats: CampaignStats
    elapsed: float
    problems: list[str]
    run_dir: Path


class UsageError(ValueError):
    pass


def default_targets(cwd: Path | None = None) -> list[str]:
    """``[tool.simdist] fuzz-targets`` in pyproject.toml, else ``tests/fuzz``."""
    cwd = cwd or Path.cwd()
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file():
        try:
            import tomllib
        except ImportError:  # Python 3.10
            tomllib = None  # type: ignore[assignment]
        if tomllib is not None:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
            targets = data.get("tool", {}).get("simdist", {}).get("fuzz-targets")
            if targets:
                return [str(t) for t in targets]
    if (cwd / "tests" / "fuzz").is_dir():
        return ["tests/fuzz"]
    raise UsageError(
        "no TARGET given, and neither [tool.simdist] fuzz-targets in pyproject.toml nor tests/fuzz/ exists"
    )


def _validate(cfg: CampaignConfig) -> None:
    if not cfg.targets:
        raise UsageError("no TARGET to fuzz")
    for target in cfg.targets:
        path = target.split("::", 1)[0]
        if not Path(path).exists():
            raise UsageError(f"TARGET {target!r}: {path} does not exist (relative to {Path.cwd().name}/)")
    if not (cfg.budget > 0):
        raise UsageError(f"--budget must be a positive number of seconds, got {cfg.budget}")
    if cfg.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {cfg.workers}")
    if cfg.max_world_size is not None and cfg.max_world_size < 1:
        raise UsageError(f"--max-world-size must be at least 1, got {cfg.max_world_size}")
    for path in (cfg.report, cfg.junit):
        if path is not None and not Path(path).parent.resolve().is_dir():
            raise UsageError(f"cannot write {path}: directory {Path(path).parent} does not exist")
    try:
        resolve_database(cfg.database)
    except DatabaseSpecError as exc:
        raise UsageError(str(exc)) from exc


def _worker_command(targets: Sequence[str]) -> list[str]:
    # addopts are cleared: the project's own options (xdist's -n, say) would
    # fight the worker's run loop.
    return [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        "-p",
        "simdist.fuzz._worker",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-q",
        "--no-header",
        "--tb=short",
    ]


def run_campaign(cfg: CampaignConfig) -> CampaignResult:
    _validate(cfg)
    seed = cfg.seed if cfg.seed is not None else secrets.randbits(32)
    started = time.time()
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = cfg.runs_dir / f"{stamp}-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    deadline = started + cfg.budget
    out = cfg.out
    live = cfg.live if cfg.live is not None else bool(getattr(out, "isatty", lambda: False)())
    print(
        f"simdist fuzz: budget {cfg.budget:g} s, {cfg.workers} worker(s), seed {seed}, "
        f"target {' '.join(cfg.targets)}; worker logs in {run_dir}",
        file=out,
        flush=True,
    )

    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    seeds = random.Random(seed)
    for k in range(cfg.workers):
        env = dict(os.environ)
        env.update(
            {
                "SIMDIST_FUZZ_WORKER": "1",
                "SIMDIST_FUZZ_RUN_DIR": str(run_dir.resolve()),
                "SIMDIST_FUZZ_INDEX": str(k),
                "SIMDIST_FUZZ_SEED": str(seeds.getrandbits(63)),
                "SIMDIST_FUZZ_DEADLINE": repr(deadline),
                "SIMDIST_FUZZ_STARTED": repr(started),
                "SIMDIST_FUZZ_STOP_ON_FAILURE": "1" if cfg.stop_on_failure else "0",
                "SIMDIST_FUZZ_DATABASE": "none" if cfg.database is None else str(cfg.database),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if cfg.max_world_size is not None:
            env["SIMDIST_FUZZ_MAX_WORLD_SIZE"] = str(cfg.max_world_size)
        # One intra-op thread per worker, as torchrun gives each rank, unless the
        # user chose: the ranks' tensors are far too small to gain from more,
        # the workers already use the cores, and on a busy machine an OpenMP
        # region waiting for a descheduled helper thread stalls a case for
        # tens to hundreds of milliseconds.
        env.setdefault("OMP_NUM_THREADS", "1")
        log = open(run_dir / f"worker-{k}.log", "wb")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                _worker_command(cfg.targets),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        )
    readers = [EventReader(worker_file(run_dir, k)) for k in range(cfg.workers)]
    stats = CampaignStats()
    interrupted = False
    killed = False
    last_print = 0.0
    try:
        while True:
            _drain(readers, stats)
            now = time.time()
            alive = [p for p in procs if p.poll() is None]
            if not alive:
                break
            if now > deadline + cfg.grace and not killed:
                (run_dir / "stop").touch()
                _stop(procs)
                killed = True
            if live and now - last_print >= 0.5:
                out.write("\r" + progress_line(stats, now - started, cfg.budget, cfg.workers).ljust(100))
                out.flush()
                last_print = now
            elif not live and now - last_print >= 10.0:
                print(progress_line(stats, now - started, cfg.budget, cfg.workers), file=out, flush=True)
                last_print = now
            try:
                alive[0].wait(timeout=0.25)
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:
        interrupted = True
        (run_dir / "stop").touch()
        _stop(procs)
    finally:
        for log in logs:
            log.close()
    _drain(readers, stats)
    elapsed = time.time() - started
    if live:
        out.write("\r" + progress_line(stats, elapsed, cfg.budget, cfg.workers).ljust(100) + "\n")

    problems = _problems(procs, stats, run_dir, killed, interrupted)
    found = {"campaign_seed": seed, **_versions(), **cfg.tags}
    if cfg.corpus is not None:
        for failure in stats.failures:
            if failure.case is not None and failure.replayable:
                path = write_case(
                    cfg.corpus,
                    failure.property,
                    failure.case,
                    failure.error_type,
                    failure.error,
                    {**found, "property_seed": failure.seed},
                )
                failure.file = str(path)
    print(
        summary_text(
            stats, elapsed=elapsed, workers=cfg.workers, seed=seed, targets=cfg.targets, problems=problems
        ),
        file=out,
        flush=True,
    )

    if interrupted:
        code = ExitCode.INTERRUPTED
    elif any(p.startswith("crash") for p in problems):
        code = ExitCode.CRASHED
    elif any(p.startswith("target error") for p in problems):
        code = ExitCode.USAGE
    elif stats.failures:
        code = ExitCode.FAILED
    else:
        code = ExitCode.CLEAN
    if cfg.report is not None:
        report = {
            "exit_code": code,
            "elapsed_s": round(elapsed, 3),
            "budget_s": cfg.budget,
            "workers": cfg.workers,
            "seed": seed,
            "targets": list(cfg.targets),
            "run_dir": str(run_dir),
            "tags": cfg.tags,
            "problems": problems,
            **stats.to_json(),
        }
        Path(cfg.report).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if cfg.junit is not None:
        Path(cfg.junit).write_text(junit_xml(stats, elapsed, problems), encoding="utf-8")
    return CampaignResult(code, stats, elapsed, problems, run_dir)


def _drain(readers: list[EventReader], stats: CampaignStats) -> None:
    for k, reader in enumerate(readers):
        for event in reader.read_new():
            stats.add(k, event)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    limit = time.time() + 10.0
    for p in procs:
        try:
            p.wait(timeout=max(0.1, limit - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _log_tail(run_dir: Path, k: int, lines: int = 25) -> str:
    try:
        text = (run_dir / f"worker-{k}.log").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n    ".join(text.rstrip().splitlines()[-lines:])


def _problems(
    procs: list[subprocess.Popen[bytes]], stats: CampaignStats, run_dir: Path, killed: bool, interrupted: bool
) -> list[str]:
    """Why the campaign itself did not run as asked (not failures of properties)."""
    if interrupted:
        return ["interrupted (Ctrl-C): the summary covers the cases run so far"]
    problems = []
    for k, p in enumerate(procs):
        code = p.returncode
        if code in (0, 1) or (killed and code is not None):
            continue
        tail = _log_tail(run_dir, k)
        if code == 5 or (code == 0 and not stats.properties):
            problems.append(f"target error: worker {k} collected no test in the target:\n    {tail}")
        elif code in (2, 4) or stats.collect_errors:
            problems.append(
                f"target error: worker {k} could not collect the target (exit {code}):\n    {tail}"
            )
        else:
            problems.append(
                f"crash: worker {k} died (exit {code}); this is simdist's fault, not the target's:\n    {tail}"
            )
    if not problems and not stats.properties:
        problems.append("target error: no Hypothesis property (@given test) found in the target")
    if killed:
        problems.append(
            "note: workers were still shrinking past the budget and grace period and were "
            "stopped; a failure may be reported unshrunk"
        )
    return problems


def _versions() -> dict[str, str]:
    import hypothesis
    import torch

    from .. import __version__

    return {"simdist": __version__, "torch": torch.__version__, "hypothesis": hypothesis.__version__}
