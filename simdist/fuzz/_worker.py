"""The pytest plugin that turns one pytest process into a campaign worker.

The campaign starts ``python -m pytest TARGET... -p simdist.fuzz._worker``
with its settings in ``SIMDIST_FUZZ_*`` environment variables. pytest collects
the target exactly as it would for a test run (conftest files, fixtures,
assertion rewriting); this plugin then replaces the run loop: it runs every
Hypothesis property again and again, each round with a fresh seed and a slice
of examples sized to the time left, until the wall-clock deadline. Every test
case is streamed to the campaign (through Hypothesis' observability hook) and
every failure is written with its shrunk case.

Guards against a target that never returns or leaves threads behind: a case
that runs past its deadline cannot be stopped from Python (it may be blocked
in C), so ``CaseDeadline`` reports it as a failure, with the case and the
stuck stack, and ends the worker process (``EXIT_HUNG_CASE``): the campaign
then counts a failure, never a clean run. Threads a property's round started
and left running are reported once per property.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from .._core.frames import current_frames
from ..faults import on_unfired
from ._database import GuardedDatabase, resolve_database
from ._forked import ENV_WORKERS, fork_workers, kill_when_parent_dies
from ._property import clear_failures, in_flight_case, last_failure, spec_of, telling_interrupts_apart
from ._stats import EXIT_HUNG_CASE, EventWriter, worker_file

ENV_FLAG = "SIMDIST_FUZZ_WORKER"
# A round of one property aims at this many seconds, so the deadline is
# checked often and every property gets its turn.
_ROUND_SECONDS = 8.0
_MIN_EXAMPLES, _MAX_EXAMPLES = 5, 1000


@dataclass
class _PropertyState:
    nodeid: str
    function: Any
    base_settings: settings
    cases: int = 0
    seconds: float = 0.0
    rounds: int = 0
    failed: bool = False
    last_examples: int = 3
    last_per_case: float = 0.0

    def examples_for(self, seconds_left: float, properties: int) -> int:
        if self.cases == 0:
            # A short first round: every property is tried early and its
            # cost per case measured before the budget is shared out.
            return 3
        # Cases differ in cost (a 16-rank world costs ten 1-rank ones): size
        # by the slower of the mean and the last round, and grow by at most
        # 4x a round, so one round cannot overshoot the budget by much.
        per_case = max(self.seconds / self.cases, self.last_per_case)
        share = min(_ROUND_SECONDS, max(0.5, seconds_left / max(1, properties)))
        wanted = int(share / max(per_case, 1e-4))
        return int(min(_MAX_EXAMPLES, 4 * self.last_examples, max(_MIN_EXAMPLES, wanted)))


class CaseDeadline:
    """Calls ``on_hang(seconds)`` once when no case finished for ``seconds`` during a round."""

    def __init__(self, seconds: float, on_hang: Callable[[float], None]) -> None:
        self.seconds = seconds
        self._on_hang = on_hang
        self._lock = threading.Lock()
        self._since: float | None = None
        self.thread = threading.Thread(target=self._watch, name="simdist-fuzz-case-deadline", daemon=True)
        self.thread.start()

    def progress(self) -> None:
        """A round started or a case finished: the clock restarts."""
        with self._lock:
            self._since = time.monotonic()

    def idle(self) -> None:
        with self._lock:
            self._since = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(0.2, self.seconds / 4))
            with self._lock:
                since = self._since
            if since is not None and time.monotonic() - since > self.seconds:
                self._on_hang(self.seconds)
                return


@dataclass
class _Worker:
    run_dir: Path
    index: int
    seed: int
    budget: float
    started: float
    case_timeout: float
    stop_on_failure: bool
    database: Any
    events: EventWriter
    deadline: float = 0.0  # set when the worker is ready: the budget counts from there
    current: str | None = None
    current_fn: Any = None
    current_cases: int = 0
    current_failing: int = 0  # failing cases seen in this round (a shrink is under way)
    guard: CaseDeadline | None = None
    # A run of the case in hand had a FaultPlan with rules, none of which
    # fired (``simdist.run`` warns; the summary counts such cases).
    unfired: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    leaked: set[str] = field(default_factory=set)
    environment_failed: bool = False  # the example database raised: no round can be trusted
    call_failed: dict[str, str] = field(default_factory=dict)

    def elapsed(self) -> float:
        return round(time.time() - self.started, 3)


_worker: _Worker | None = None


def _marker(run_dir: Path, nodeid: str) -> Path:
    return run_dir / f"failed-{hashlib.sha1(nodeid.encode()).hexdigest()[:16]}"


def pytest_configure(config: pytest.Config) -> None:
    global _worker
    if os.environ.get(ENV_FLAG) != "1":
        raise pytest.UsageError("simdist.fuzz._worker is started by `simdist fuzz`, not by hand")
    env = os.environ
    run_dir = Path(env["SIMDIST_FUZZ_RUN_DIR"])
    # A worker server (see _forked) collects for every worker, then forks
    # them: each gets its index, seed and event stream there.
    serving = bool(env.get(ENV_WORKERS))
    index = 0 if serving else int(env["SIMDIST_FUZZ_INDEX"])
    supervisor = int(env.get("SIMDIST_FUZZ_SUPERVISOR", "0"))
    if supervisor:
        kill_when_parent_dies(supervisor)  # a worker (or the server) ends with its campaign
    spec = env.get("SIMDIST_FUZZ_DATABASE")
    database = resolve_database(spec)
    _worker = _Worker(
        run_dir=run_dir,
        index=index,
        seed=0 if serving else int(env["SIMDIST_FUZZ_SEED"]),
        budget=float(env["SIMDIST_FUZZ_BUDGET"]),
        started=float(env["SIMDIST_FUZZ_STARTED"]),
        case_timeout=float(env.get("SIMDIST_FUZZ_CASE_TIMEOUT", "300")),
        stop_on_failure=env.get("SIMDIST_FUZZ_STOP_ON_FAILURE") == "1",
        database=None if database is None else GuardedDatabase(database, str(spec)),
        events=EventWriter(worker_file(run_dir, index)),
    )
    # Before collection, so properties decorated with their own @settings
    # inherit the campaign's values for everything they do not set.
    settings.register_profile(
        "simdist-fuzz",
        deadline=None,
        derandomize=False,
        database=_worker.database,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    settings.load_profile("simdist-fuzz")
    on_unfired(_unfired_run)
    try:
        from hypothesis.internal import observability

        add_callback = observability.add_observability_callback
    except (ImportError, AttributeError):  # an older Hypothesis: no per-case stream, rounds still count
        return
    # The per-case stream without line coverage, which would cost more than
    # the cases themselves. (Hypothesis' own switch for this, an environment
    # variable, also writes every observation to a file.)
    if hasattr(observability, "OBSERVABILITY_COLLECT_COVERAGE"):
        observability.OBSERVABILITY_COLLECT_COVERAGE = False
    add_callback(_observe)


def _unfired_run(state: Any) -> None:
    if _worker is not None:
        with _worker.lock:
            _worker.unfired = True


def _observe(observation: Any) -> None:
    w = _worker
    if w is None or getattr(observation, "type", None) != "test_case" or w.current is None:
        return
    w.current_cases += 1
    if observation.status == "failed":
        w.current_failing += 1
    if w.guard is not None:
        w.guard.progress()
    features = {
        str(k): (v if isinstance(v, (int, float)) else str(v)) for k, v in observation.features.items()
    }
    with w.lock:
        unfired, w.unfired = w.unfired, False
    w.events.emit(
        "case",
        p=w.current,
        s=observation.status,
        how=observation.how_generated,
        f=features,
        sec=round(sum(observation.timing.values()), 6),
        t=w.elapsed(),
        **({"unfired": 1} if unfired else {}),
        **(_gave_up_because(observation) if observation.status == "gave_up" else {}),
    )


def _gave_up_because(observation: Any) -> dict[str, str]:
    """Hypothesis' reason for a rejected case and where (an assume() line, a filter's strategy)."""
    why = str(getattr(observation, "status_reason", "") or "")
    at = str(getattr(getattr(observation, "metadata", None), "status_reason_location", None) or "")
    return {"why": why, **({"at": at} if at else {})}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _worker is not None and report.failed:
        _worker.call_failed[report.nodeid] = report.longreprtext


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool:
    w = _worker
    assert w is not None
    if session.testsfailed:
        w.events.emit("collect_error", count=session.testsfailed)
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    forked = fork_workers(w.run_dir)  # a server: from here on, one of its workers
    if forked is not None:
        w.index, w.seed = forked
        w.events = EventWriter(worker_file(w.run_dir, w.index))
    props: list[_PropertyState] = []
    others: list[str] = []
    for item in session.items:
        fn = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if fn is not None and getattr(fn, "is_hypothesis_test", False):
            props.append(_PropertyState(item.nodeid, fn, fn._hypothesis_internal_use_settings))
        else:
            others.append(item.nodeid)
    items = {item.nodeid: item for item in session.items}
    # Ready: the target is imported and collected. The budget starts now.
    w.deadline = time.time() + w.budget
    w.guard = CaseDeadline(w.case_timeout, lambda seconds: _on_hang(w, seconds))
    w.events.emit(
        "start",
        worker=w.index,
        pid=os.getpid(),
        t=w.elapsed(),
        rootdir=str(session.config.rootpath),
        properties=[p.nodeid for p in props],
        ignored=others,
        replayable=[p.nodeid for p in props if spec_of(p.function)],
    )
    if not props:
        w.events.emit("done", reason="no properties")
        return True
    with telling_interrupts_apart():  # a property's own KeyboardInterrupt is its case's failure
        reason = _search(w, props, items)
    w.events.emit("done", reason=reason)
    return True


def _search(w: _Worker, props: list[_PropertyState], items: dict[str, pytest.Item]) -> str:
    """Rounds over the properties until the budget is spent; why it ended."""
    rng = random.Random(w.seed)
    stop_file = w.run_dir / "stop"
    while True:
        live = [p for p in props if not p.failed and not _marker(w.run_dir, p.nodeid).exists()]
        if not live:
            return "every property failed"
        if stop_file.exists():
            return "stopped"
        for prop in live:
            left = w.deadline - time.time()
            # Every property gets one round however short the budget, so a
            # campaign whose workers started slowly still checks something.
            if (left <= 0 and prop.rounds > 0) or stop_file.exists():
                return "stopped" if stop_file.exists() and time.time() < w.deadline else "budget spent"
            _run_round(w, prop, items[prop.nodeid], rng, left, len(live))
            if w.environment_failed:
                return "the example database failed"
            if prop.failed and w.stop_on_failure:
                stop_file.touch()
                return "stopped at the first failure"


def _run_round(
    w: _Worker, prop: _PropertyState, item: pytest.Item, rng: random.Random, seconds_left: float, live: int
) -> None:
    examples = prop.examples_for(seconds_left, live)
    seed = rng.getrandbits(64)
    fn = prop.function
    fn._hypothesis_internal_use_settings = settings(prop.base_settings, max_examples=examples)
    fn._hypothesis_internal_use_seed = seed
    clear_failures()
    w.call_failed.pop(item.nodeid, None)
    w.current, w.current_fn, w.current_cases, w.current_failing = prop.nodeid, fn, 0, 0
    w.events.emit("round_start", p=prop.nodeid, t=w.elapsed())
    threads_before = {t.ident for t in threading.enumerate() if t.ident is not None}
    start = time.perf_counter()
    assert w.guard is not None
    w.guard.progress()
    try:
        item.ihook.pytest_runtest_protocol(item=item, nextitem=None)
    except KeyboardInterrupt:
        # Stopped (Ctrl-C, or the campaign's grace period ran out) while
        # searching or shrinking: a failure already seen is not lost; it is
        # reported with the smallest case found so far.
        record = last_failure(fn)
        if record is not None:
            _emit_failure(w, prop, seed, record, "stopped before shrinking finished", shrunk=False)
        w.events.emit("stopped", p=prop.nodeid, failing_seen=w.current_failing > 0, t=w.elapsed())
        raise
    finally:
        w.guard.idle()
        w.current = None
    seconds = time.perf_counter() - start
    prop.rounds += 1
    prop.cases += max(1, w.current_cases)
    prop.seconds += seconds
    prop.last_examples = examples
    prop.last_per_case = seconds / max(1, w.current_cases)
    _report_leaks(w, prop.nodeid, threads_before)
    w.events.emit(
        "round",
        p=prop.nodeid,
        seed=seed,
        examples=examples,
        cases=w.current_cases,
        sec=round(seconds, 3),
        t=w.elapsed(),
    )
    longrepr = w.call_failed.get(item.nodeid)
    error = w.database.take_error() if isinstance(w.database, GuardedDatabase) else None
    if error is not None:
        # Raised by the database, not by the property: the environment's
        # failure, whatever the round's outcome says.
        w.environment_failed = True
        w.events.emit(
            "environment",
            p=prop.nodeid,
            what=f"the example database ({w.database.spec})",
            error=f"{type(error).__name__}: {error}",
            t=w.elapsed(),
        )
        return
    if longrepr is None:
        return
    _emit_failure(w, prop, seed, last_failure(fn), longrepr, shrunk=True)


def _report_leaks(w: _Worker, nodeid: str, before: set[int]) -> None:
    """Threads started since ``before`` still alive after up to half a second, once per property."""
    if nodeid in w.leaked:
        return
    assert w.guard is not None
    limit = time.monotonic() + 0.5
    new = [t for t in threading.enumerate() if t.ident not in before and t.ident != w.guard.thread.ident]
    for t in new:
        t.join(max(0.0, limit - time.monotonic()))
    names = [f"{t.name}{' (daemon)' if t.daemon else ''}" for t in new if t.is_alive()]
    if names:
        w.leaked.add(nodeid)
        w.events.emit("leak", p=nodeid, threads=names, t=w.elapsed())


def _on_hang(w: _Worker, seconds: float) -> None:
    """From the deadline thread: the main thread is stuck in a case; report it and end the worker."""
    nodeid, fn = w.current, w.current_fn
    if nodeid is None:
        return
    case = in_flight_case(fn) if fn is not None else None
    frame = current_frames().get(threading.main_thread().ident or -1)
    stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"
    _marker(w.run_dir, nodeid).touch()
    w.events.emit(
        "failure",
        p=nodeid,
        seed=None,
        t=w.elapsed(),
        first=True,
        shrunk=False,
        replayable=case is not None,
        case=case,
        error_type="CaseTimeout",
        error=f"a case of {nodeid} was still running after {seconds:g} s (--case-timeout): it may hang",
        report="the stuck case's stack (main thread):\n" + stack,
    )
    w.events.emit("hung", p=nodeid, t=w.elapsed())
    w.events.close()
    # End the process at once: its main thread is stuck and cannot unwind.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_HUNG_CASE)


def _emit_failure(
    w: _Worker, prop: _PropertyState, seed: int, record: Any, report: str, *, shrunk: bool
) -> None:
    prop.failed = True
    marker = _marker(w.run_dir, prop.nodeid)
    first = not marker.exists()
    marker.touch()
    w.events.emit(
        "failure",
        p=prop.nodeid,
        seed=seed,
        t=w.elapsed(),
        first=first,
        shrunk=shrunk,
        replayable=spec_of(prop.function) is not None,
        case=record.case if record else None,
        error_type=record.error_type if record else _error_type(report),
        error=record.error if record else "",
        report=report[-20000:],
    )


def _error_type(longrepr: str) -> str:
    for line in reversed(longrepr.splitlines()):
        if line.startswith("E   ") and ":" in line:
            return line[4:].split(":", 1)[0].strip()
    return "failure"


def pytest_unconfigure(config: pytest.Config) -> None:
    if _worker is not None:
        _worker.events.close()
