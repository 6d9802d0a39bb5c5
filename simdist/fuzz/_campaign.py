"""A campaign: worker processes fuzzing the target until the budget is spent.

The wall-clock budget covers the search and is counted, per worker, from the
moment that worker is ready (its target imported and collected), so a slow
import does not eat it; waiting for readiness is bounded by ``startup``
seconds. Failures found near the end still get shrunk (up to ``grace``
seconds more), because an unshrunk case is hard to read; after that the
workers are stopped whatever they are doing, and a worker stopped in the
middle of a case that is not a failure being shrunk is reported as a hang,
never as clean. A case that runs past ``case_timeout`` is a failure with its
case.
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
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ._corpus import case_environment, write_case
from ._database import DatabaseSpecError, resolve_database
from ._forked import STARTUP_LOG, ForkedWorker, fork_available, server_usable, start_server
from ._project import check_output_paths, default_corpus, display, simdist_settings
from ._stats import EXIT_HUNG_CASE, CampaignStats, EventReader, worker_file
from ._summary import junit_xml, progress_line, summary_text

# The --report file's format and version (docs/schemas/fuzz-report-1.json), as a case file has its own.
REPORT_FORMAT = "simdist-fuzz-report/1"

__all__ = ["CampaignConfig", "CampaignResult", "ExitCode", "default_targets", "run_campaign"]


class ExitCode:
    """The exit status of ``simdist fuzz`` (and ``run_campaign``'s ``exit_code``)."""

    CLEAN = 0
    FAILED = 1  # a property of the target failed
    USAGE = 2  # bad arguments, or a target that cannot be collected
    CRASHED = 3  # simdist's own machinery or its environment broke (a worker died, the database failed)
    INTERRUPTED = 130


@dataclass
class CampaignConfig:
    """One campaign, as ``simdist fuzz``'s options describe it (same names, same defaults)."""

    targets: Sequence[str]
    budget: float = 60.0
    seed: int | None = None
    workers: int = 1
    max_world_size: int | None = None
    database: str | None = ".simdist/fuzz-db"
    # "auto": [tool.simdist] corpus of the target's project, else <rootdir>/fuzz-cases.
    corpus: Path | str | None = "auto"
    report: Path | None = None
    junit: Path | None = None
    stop_on_failure: bool = False
    runs_dir: Path = Path(".simdist/fuzz-runs")
    tags: dict[str, str] = field(default_factory=dict)
    grace: float = 120.0
    case_timeout: float = 300.0  # seconds one case may run before it is a hang
    startup: float = 300.0  # seconds a worker may take to import and collect the target
    out: IO[str] = sys.stderr
    live: bool | None = None  # a redrawn progress line; default: when `out` is a terminal


@dataclass
class CampaignResult:
    """What ``run_campaign`` returns: the exit status, what was seen, and where the logs are."""

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
    targets = simdist_settings(cwd).get("fuzz-targets")
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
    for name, value in (
        ("--grace", cfg.grace),
        ("--case-timeout", cfg.case_timeout),
        ("--startup", cfg.startup),
    ):
        if not (value > 0):
            raise UsageError(f"{name} must be a positive number of seconds, got {value}")
    problem = check_output_paths(corpus=_corpus(cfg), report=cfg.report, junit=cfg.junit)
    if problem:
        raise UsageError(problem)
    try:
        resolve_database(cfg.database)
    except DatabaseSpecError as exc:
        raise UsageError(str(exc)) from exc


def _corpus(cfg: CampaignConfig) -> Path | None:
    if cfg.corpus == "auto":
        return default_corpus(cfg.targets)
    return None if cfg.corpus is None else Path(cfg.corpus)


# A worker's pytest options, after the targets. addopts are cleared: the
# project's own options (xdist's -n, say) would fight the worker's run loop.
_WORKER_OPTIONS = (
    "-p",
    "simdist.fuzz._worker",
    "-p",
    "no:cacheprovider",
    "-o",
    "addopts=",
    "-q",
    "--no-header",
    "--tb=short",
)


def _spawn(cfg: CampaignConfig, run_dir: Path, seed: int, started: float) -> list[Any]:
    procs: list[Any] = []  # Popen, ForkedWorker or ServerWorker: poll, wait, send_signal, kill, returncode
    seeds = random.Random(seed)
    worker_seeds = [seeds.getrandbits(63) for _ in range(cfg.workers)]
    envs = [_worker_env(cfg, run_dir, started, k, worker_seeds[k]) for k in range(cfg.workers)]
    pytest_args = [*cfg.targets, *_WORKER_OPTIONS]
    if fork_available() and server_usable(envs[0]):
        # One collection for every worker (see _forked); each worker log is
        # created now, so a worker that never started still has one.
        for k in range(cfg.workers):
            worker_file(run_dir, k, "log").touch()
        return start_server([*pytest_args, "--capture=no"], envs[0], worker_seeds, run_dir)
    for k, env in enumerate(envs):
        # The worker writes into its own copy of the log; this process's is closed at once.
        with open(worker_file(run_dir, k, "log"), "wb") as log:
            if fork_available() and env["OMP_NUM_THREADS"] == "1":
                # Forked from this process: torch and simdist are imported already.
                # More threads than one: a fresh process, whose OpenMP pool is its
                # own (a fork of a process that used its pool hangs; see _forked).
                procs.append(ForkedWorker(pytest_args, env, log))
            else:
                command = [sys.executable, "-m", "pytest", *pytest_args]
                procs.append(
                    subprocess.Popen(
                        command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                    )
                )
    return procs


def _worker_env(cfg: CampaignConfig, run_dir: Path, started: float, k: int, seed: int) -> dict[str, str]:
    env = _selecting_env(cfg)
    env.update(
        {
            "SIMDIST_FUZZ_WORKER": "1",
            "SIMDIST_FUZZ_RUN_DIR": str(run_dir.resolve()),
            "SIMDIST_FUZZ_INDEX": str(k),
            "SIMDIST_FUZZ_SEED": str(seed),
            # Each worker's search ends `budget` seconds after it is ready.
            "SIMDIST_FUZZ_BUDGET": repr(cfg.budget),
            "SIMDIST_FUZZ_STARTED": repr(started),
            "SIMDIST_FUZZ_STOP_ON_FAILURE": "1" if cfg.stop_on_failure else "0",
            "SIMDIST_FUZZ_DATABASE": "none" if cfg.database is None else str(cfg.database),
            "PYTHONUNBUFFERED": "1",
            # Workers (and the worker server) end with this process (see _forked).
            "SIMDIST_FUZZ_SUPERVISOR": str(os.getpid()),
        }
    )
    # One intra-op thread per worker, as torchrun gives each rank, unless the
    # user chose: the ranks' tensors are far too small to gain from more,
    # the workers already use the cores, and on a busy machine an OpenMP
    # region waiting for a descheduled helper thread stalls a case for
    # tens to hundreds of milliseconds.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@dataclass
class _Watch:
    """What the campaign loop decided about its workers while they ran."""

    killed: set[int] = field(default_factory=set)  # stopped past budget + grace
    not_ready: set[int] = field(default_factory=set)  # stopped before they were ready
    # Per killed worker: seconds since its last round start or finished case.
    stalled: dict[int, float] = field(default_factory=dict)
    interrupted: bool = False
    terminated: bool = False  # the interruption was a SIGTERM


class _StopOnSigterm:
    """While supervising, SIGTERM (a CI runner cancelling the job, `kill`)
    stops the campaign as Ctrl-C does: workers stopped, summary and reports
    written. Left at its default it ended this process alone, and the
    workers searched on, unseen, to the end of their budgets."""

    def __init__(self) -> None:
        self.received = False
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.received = True
        self.restore()  # a second SIGTERM, during the stop, ends the process at once
        raise KeyboardInterrupt

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def _supervise(
    cfg: CampaignConfig, procs: list, readers: list, stats: CampaignStats, started: float, run_dir: Path
) -> _Watch:
    out = cfg.out
    live = cfg.live if cfg.live is not None else bool(getattr(out, "isatty", lambda: False)())
    watch = _Watch()
    announced: set[int] = set()
    last_print = 0.0
    terminate = _StopOnSigterm()
    try:
        while True:
            _drain(readers, stats)
            now = time.time()
            for k in sorted(set(stats.ready_at) - announced):
                announced.add(k)
                print(
                    f"simdist fuzz: worker {k} ready after {stats.ready_at[k]:.1f} s "
                    f"(target imported and collected); its {cfg.budget:g} s budget starts now",
                    file=out,
                    flush=True,
                )
            alive = [k for k, p in enumerate(procs) if p.poll() is None]
            if not alive:
                break
            overdue = []
            for k in alive:
                ready = stats.ready_at.get(k)
                if ready is None and now - started > cfg.startup:
                    watch.not_ready.add(k)
                    overdue.append(k)
                elif ready is not None and now - started > ready + cfg.budget + cfg.grace:
                    watch.killed.add(k)
                    watch.stalled[k] = now - started - stats.last_progress.get(k, ready)
                    overdue.append(k)
            if overdue:
                _stop([procs[k] for k in overdue])
            if live and now - last_print >= 0.5:
                out.write("\r" + progress_line(stats, now - started, cfg.budget, cfg.workers).ljust(100))
                out.flush()
                last_print = now
            elif not live and now - last_print >= 10.0:
                print(progress_line(stats, now - started, cfg.budget, cfg.workers), file=out, flush=True)
                last_print = now
            try:
                procs[alive[0]].wait(timeout=0.25)
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:
        watch.interrupted = True
        (run_dir / "stop").touch()
        _stop(procs)
    finally:
        terminate.restore()
    watch.terminated = terminate.received
    _drain(readers, stats)
    if live:
        out.write(
            "\r" + progress_line(stats, time.time() - started, cfg.budget, cfg.workers).ljust(100) + "\n"
        )
    return watch


def _database_shown(database: str | None) -> str:
    if database is None or str(database) == "none":
        return "none (--database none)"
    return str(database) if str(database).startswith("python:") else display(Path(database))


def _selecting_env(cfg: CampaignConfig) -> dict[str, str]:
    """The workers' environment without the campaign's plumbing (see _corpus.RECORDED_ENVIRONMENT)."""
    env = {**os.environ, "SIMDIST_FUZZ_CASE_TIMEOUT": repr(cfg.case_timeout)}
    if cfg.max_world_size is not None:
        env["SIMDIST_FUZZ_MAX_WORLD_SIZE"] = str(cfg.max_world_size)
    return env


def _write_cases(cfg: CampaignConfig, stats: CampaignStats, found: dict, problems: list[str]) -> None:
    corpus = _corpus(cfg)
    if corpus is None:
        return
    for failure in stats.failures:
        if failure.case is None or not failure.replayable:
            continue
        root = stats.rootdirs.get(failure.worker)
        prop_file = Path(root) / failure.property.split("::", 1)[0] if root else None
        try:
            path = write_case(
                corpus,
                failure.property,
                failure.case,
                failure.error_type,
                failure.error,
                {**found, "property_seed": failure.seed},
                property_file=prop_file,
                environment=case_environment(_selecting_env(cfg)),
            )
        except OSError as exc:
            # The failure is still printed below, with its case.
            problems.append(
                f"output error: could not write the case of {failure.property} to {corpus}: {exc}"
            )
            continue
        failure.file = display(path)


def run_campaign(cfg: CampaignConfig) -> CampaignResult:
    """Run one campaign in worker processes, print its summary and write its outputs.

    What ``simdist fuzz`` does after parsing its options; a bad configuration
    raises ``UsageError`` before any worker starts."""
    _validate(cfg)
    seed = cfg.seed if cfg.seed is not None else secrets.randbits(32)
    started = time.time()
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = cfg.runs_dir / f"{stamp}-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    out = cfg.out
    corpus = _corpus(cfg)
    print(
        f"simdist fuzz: budget {cfg.budget:g} s, {cfg.workers} worker(s), seed {seed}, "
        f"target {' '.join(cfg.targets)}; worker logs in {run_dir}",
        file=out,
        flush=True,
    )
    print(
        f"simdist fuzz: starting {cfg.workers} worker(s): importing and collecting the target "
        f"(up to {cfg.startup:g} s)",
        file=out,
        flush=True,
    )
    procs = _spawn(cfg, run_dir, seed, started)
    readers = [EventReader(worker_file(run_dir, k)) for k in range(cfg.workers)]
    stats = CampaignStats()
    try:
        watch = _supervise(cfg, procs, readers, stats, started, run_dir)
    finally:
        for proc in procs:
            if hasattr(proc, "close"):  # a ServerWorker: reap the worker server too
                proc.close()
                break
    elapsed = time.time() - started
    problems = _problems(procs, stats, run_dir, watch, cfg)
    found = {"campaign_seed": seed, **_versions(), **cfg.tags}
    _write_cases(cfg, stats, found, problems)
    print(
        summary_text(
            stats,
            elapsed=elapsed,
            workers=cfg.workers,
            seed=seed,
            targets=cfg.targets,
            problems=problems,
            corpus=None if corpus is None else display(corpus),
            database=_database_shown(cfg.database),
            logs=display(run_dir),
        ),
        file=out,
        flush=True,
    )
    code = _exit_code(watch, problems, stats)
    code = _write_reports(cfg, stats, code, elapsed, seed, run_dir, problems)
    return CampaignResult(code, stats, elapsed, problems, run_dir)


def _exit_code(watch: _Watch, problems: list[str], stats: CampaignStats) -> int:
    if watch.interrupted:
        return ExitCode.INTERRUPTED
    if any(p.startswith(("crash", "environment error")) for p in problems):
        return ExitCode.CRASHED
    if any(p.startswith("target error") for p in problems):
        return ExitCode.USAGE
    if stats.failures or any(p.startswith("hang") for p in problems):
        return ExitCode.FAILED
    if any(p.startswith("output error") for p in problems):
        return ExitCode.USAGE
    return ExitCode.CLEAN


def _write_reports(
    cfg: CampaignConfig,
    stats: CampaignStats,
    code: int,
    elapsed: float,
    seed: int,
    run_dir: Path,
    problems: list[str],
) -> int:
    """Write --report and --junit after the summary: an output error never hides a failure."""
    outputs = []
    if cfg.report is not None:
        report = {
            "format": REPORT_FORMAT,
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
        outputs.append(("--report", Path(cfg.report), json.dumps(report, indent=2) + "\n"))
    if cfg.junit is not None:
        outputs.append(("--junit", Path(cfg.junit), junit_xml(stats, elapsed, problems)))
    for option, path, text in outputs:
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"simdist fuzz: error: could not write {option} {path}: {exc}", file=cfg.out, flush=True)
            if code == ExitCode.CLEAN:
                code = ExitCode.USAGE
    return code


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
    text = ""
    # A worker that never started (its server failed while collecting) has
    # an empty log: what happened is in the server's.
    for path in (worker_file(run_dir, k, "log"), run_dir / STARTUP_LOG):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if text.strip():
            break
    return "\n    ".join(text.rstrip().splitlines()[-lines:])


def _problems(
    procs: list[subprocess.Popen[bytes]],
    stats: CampaignStats,
    run_dir: Path,
    watch: _Watch,
    cfg: CampaignConfig,
) -> list[str]:
    """Why the campaign itself did not run as asked (not failures of properties)."""
    if watch.interrupted:
        how = "SIGTERM" if watch.terminated else "Ctrl-C"
        return [f"interrupted ({how}): the summary covers the cases run so far"]
    problems = []
    for k, p in enumerate(procs):
        code = p.returncode
        if k in watch.not_ready:
            problems.append(
                f"target error: worker {k} was not ready after {cfg.startup:g} s (--startup): importing "
                f"or collecting the target took too long:\n    {_log_tail(run_dir, k)}"
            )
            continue
        if k in watch.killed:
            problem = _killed_problem(k, stats, cfg, watch.stalled.get(k, 0.0))
            if problem:
                problems.append(problem)
            continue
        if code in (0, 1) or (code == EXIT_HUNG_CASE and k in stats.hung_workers):
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
    for text in stats.environment_errors:
        problems.append(
            f"environment error: {text}; this is not the property's failure, and the campaign stopped "
            "there (check the database, then run it again)"
        )
    if not problems and not stats.properties:
        problems.append("target error: no Hypothesis property (@given test) found in the target")
    for k in sorted(stats.hung_workers):
        problems.append(
            f"note: worker {k} stopped at a case that ran past --case-timeout ({cfg.case_timeout:g} s); "
            "its properties were not fuzzed further"
        )
    for prop, n in sorted(stats.unfired_plans.items()):
        problems.append(
            f"note: {n} case(s) of {prop} ran a FaultPlan that never fired (no rule matched a call): "
            "they tested a clean run, not a fault"
        )
    for prop, names in sorted(stats.leaks.items()):
        problems.append(
            f"note: {prop} leaked {len(names)} thread(s) still running after its round: {', '.join(names[:8])}"
        )
    return problems


def _killed_problem(k: int, stats: CampaignStats, cfg: CampaignConfig, stalled: float) -> str | None:
    # Stopped past budget + grace: shrinking a failure (reported unshrunk),
    # between rounds, in a case that was merely slow, or stuck in one case for
    # the whole grace period: a hang, never "clean" (--case-timeout may be
    # longer than budget + grace, so this is the hang detector of last resort).
    current = stats.in_case.get(k)
    if any(f.worker == k and not f.shrunk for f in stats.failures):
        return (
            "note: workers were still shrinking past the budget and grace period and were "
            "stopped; a failure may be reported unshrunk"
        )
    if current is None:
        return None
    if stalled >= cfg.grace:
        return (
            f"hang: worker {k} was stuck in a case of {current} for {stalled:.0f} s, past its budget "
            f"and grace period (--grace {cfg.grace:g}), and was stopped; the property may hang "
            "(see --case-timeout)"
        )
    return (
        f"note: worker {k} was stopped in the middle of a round of {current} (its last case "
        f"finished {stalled:.1f} s before, within --grace): that round's other cases did not run"
    )


def _versions() -> dict[str, str]:
    import hypothesis
    import torch

    from .. import __version__

    return {"simdist": __version__, "torch": torch.__version__, "hypothesis": hypothesis.__version__}
