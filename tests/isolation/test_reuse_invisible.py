"""What a run reuses from the runs before it (``simdist/_core/reuse.py``: parked
rank threads, the prepared c10d init) must be invisible: a rank observes the
same world with reuse on as with reuse off.

The reference is always the same scenario run with reuse off
(``reuse.ENABLED = False``: new threads, c10d's own
``init_process_group``), from the same caller state. Reuse is switched on
explicitly for the other half, so the comparison means something under the
nightly ``SIMDIST_REUSE=0`` profile too. What a rank records is normalised so
that two runs can be compared: no ids or addresses, and the run's number taken
out of the registry scope of group names.
"""

from __future__ import annotations

import contextvars
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import numpy
import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import simdist
import simdist._run.watchdog
from simdist._core import pool, reuse
from simdist._isolation import c10d_init
from simdist._isolation.c10d_state import SCOPE_SEP

pytest_plugins = ["pytester"]

TIMEOUT = 30.0
SEED = 20240611
MAIN = threading.main_thread().ident
# A key each probe writes into its world store once every rank has looked:
# a later run's store must not hold it.
LEFT_KEY = "reuse-invisible/left-by-an-earlier-run"

# What a rank leaves in its thread for the next run to (not) see.
_local = threading.local()
_var: contextvars.ContextVar[str] = contextvars.ContextVar("reuse_invisible", default="default")

# Each rank's process groups from the last run that kept them, as a module
# that caches groups across runs would: using one in a later run must fail.
_KEPT: dict[int, list[Any]] = {}
# A module-level cache of tp groups keyed by (rank, tp ranks), filled by one run, read by the next.
_CACHE: dict[tuple[int, tuple[int, ...]], Any] = {}
# Shared by the ranks of explore's racy body (the race explore must find).
_RACE: list[int] = []

# The run's number in a registry scope ("0@simdist12.r3"), unique per run.
_RUN_IN_SCOPE = re.compile(re.escape(SCOPE_SEP) + r"\d+\.")


@pytest.fixture(autouse=True)
def _module_globals_emptied() -> Iterator[None]:
    """No test sees groups another test kept (xdist runs them in any order)."""
    _KEPT.clear()
    _CACHE.clear()
    _RACE.clear()
    yield
    _KEPT.clear()
    _CACHE.clear()
    _RACE.clear()


# ----------------------------------------------------------------- the probe


def _norm(name: str) -> str:
    """A group name without its run's number (the rank in the scope stays)."""
    return _RUN_IN_SCOPE.sub(SCOPE_SEP + "<run>.", name)


def _num_keys(store: Any) -> Any:
    try:
        return store.num_keys()
    except Exception as exc:  # a store that cannot count: its error's type is what a rank sees
        return type(exc).__name__


def _groups_of(ctx: simdist.RankContext) -> list[Any]:
    """This rank's process groups (default first, each once) and their backends."""
    seen: list[Any] = []
    for group in [ctx.groups.world, *(g for _, g in sorted(ctx.groups.by_axis.items())), *c10d._world.pg_map]:
        if not any(group is s for s in seen):
            seen.append(group)
    return seen + [g._get_backend(torch.device("cpu")) for g in seen]


def _use_kept(rank: int) -> Any:
    """Use every group kept from an earlier run: each must fail as "already ended"."""
    kept = _KEPT.get(rank)
    if kept is None:
        return "nothing kept"
    outcomes: list[Any] = []
    for group in kept:
        if not isinstance(group, dist.ProcessGroup):
            continue  # a backend object: not something a program passes as group=
        try:
            dist.all_reduce(torch.ones(1), group=group)
            outcomes.append("worked")
        except Exception as exc:
            outcomes.append((type(exc).__name__, "already ended" in str(exc)))
    return outcomes


def _own_groups_work(ctx: simdist.RankContext) -> dict[str, float]:
    """An all-reduce of rank + 1 on the world and on each layout group."""
    sums = {}
    for axis, group in [("world", ctx.groups.world), *sorted(ctx.groups.by_axis.items())]:
        t = torch.tensor([float(ctx.rank + 1)])
        dist.all_reduce(t, group=group)
        sums[axis] = t.item()
    return sums


def probe(ctx: simdist.RankContext) -> tuple[dict[str, Any], list[Any]]:
    """What this rank can observe of its world, then traces left for the next run.

    Returns the record and this rank's group objects (compared by identity only)."""
    # Drawn first: a rank starts from the caller's generators at run start.
    draws = (torch.rand(2).tolist(), random.random(), float(numpy.random.rand()))
    world = c10d._world
    default = c10d._get_default_group()
    names = dict(world.pg_names)
    store: Any = world.pg_map[default][1]  # the default group's store, prefixed over the world's
    chain, root = [], store
    while isinstance(root, dist.PrefixStore):
        chain.append(type(root).__name__)
        root = root.underlying_store
    chain.append(type(root).__name__)
    kept = [g for gs in _KEPT.values() for g in gs]
    mine = _groups_of(ctx)
    thread = threading.current_thread()
    record: dict[str, Any] = {
        "draws": draws,
        "c10d": {
            "is_initialized": dist.is_initialized(),
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "backend": str(dist.get_backend()),
            "backend_config": dist.get_backend_config(),
            "group_count": world.group_count,
            "pg_count": dist.get_pg_count(),
            "pg_names": sorted(names.values()),
            "pg_group_ranks": sorted(
                (names[g], tuple(sorted(ranks.items()))) for g, ranks in world.pg_group_ranks.items()
            ),
            "pg_backend_config": sorted((names[g], cfg) for g, cfg in world.pg_backend_config.items()),
            "pg_map": sorted(
                (names[g], str(backend), type(s).__name__) for g, (backend, s) in world.pg_map.items()
            ),
            "tags_to_pg": sorted(
                (tag, sorted(names[g] for g in pgs)) for tag, pgs in world.tags_to_pg.items()
            ),
            "pg_to_tag": sorted(world.pg_to_tag.values()),
            "pg_coalesce_state": len(world.pg_coalesce_state),
            "comms": len(world.comms),
            "module_backend": str(c10d._backend),
            "module_init_method": c10d._default_pg_init_method,
        },
        "default": {
            "rank": default.rank(),
            "size": default.size(),
            "group_name": _norm(default.group_name),
            "group_desc": default.group_desc,
            "backend_name": default._get_backend_name(),
            "bound_device_id": default.bound_device_id,
            "is_group_world": dist.group.WORLD is default and c10d.GroupMember.WORLD is default,
            "resolves": c10d._resolve_process_group(default.group_name) is default,
        },
        "axes": {
            axis: (
                dist.get_process_group_ranks(g),
                _norm(g.group_name),
                g.group_desc,
                dist.get_rank(g),
                g.size(),
                str(dist.get_backend(g)),
                c10d._resolve_process_group(g.group_name) is g,
            )
            for axis, g in sorted(ctx.groups.by_axis.items())
        },
        "store": {
            "chain": chain,
            "left_key_present": store.check([LEFT_KEY]),
            "num_keys": _num_keys(store),
        },
        "thread": {
            "name": thread.name,
            "daemon": thread.daemon,
            "alive": thread.is_alive(),
            "main": thread is threading.main_thread(),
            "ident_matches": thread.ident == threading.get_ident(),
            "native_id_matches": thread.native_id == threading.get_native_id(),
            "local": getattr(_local, "left", "absent"),
            "contextvar": _var.get(),
            "grad_enabled": torch.is_grad_enabled(),
            "default_dtype": str(torch.get_default_dtype()),
            "listed": sorted(
                t.name for t in threading.enumerate() if t.name.startswith(("simdist-rank", "reuse-"))
            ),
        },
        # Identity freshness (also asserted by every scenario).
        "kept_used": _use_kept(ctx.rank),
        "none_kept_is_mine": not any(g is k for g in mine for k in kept),
        "own_groups": _own_groups_work(ctx),
    }
    dist.barrier()  # every rank has looked before any leaves something behind
    store.set(LEFT_KEY, "1")
    # Where the key landed in the world store: under the group's own prefix, and
    # under init_process_group's "default_pg" too or not.
    prefixes = [f"default_pg/{names[default]}//", f"{names[default]}//"]
    record["store"]["landed_under"] = [p for p in prefixes if root.check([p + LEFT_KEY])]
    _local.left = "an earlier run"
    _var.set("an earlier run")
    _KEPT[ctx.rank] = mine
    return record, mine


# --------------------------------------------------------------- the harness


def _seed() -> None:
    torch.manual_seed(SEED)
    random.seed(SEED)
    numpy.random.seed(SEED)


def _caller_draws() -> tuple[list[float], float, float]:
    """What the caller's generators give next, drawn from copies (the caller's
    own state is left as it is): what every rank of the next run must draw."""
    g = torch.Generator()
    g.set_state(torch.get_rng_state())
    r = random.Random()
    r.setstate(random.getstate())
    n = numpy.random.RandomState()
    n.set_state(numpy.random.get_state())
    return (torch.rand(2, generator=g).tolist(), r.random(), float(n.rand()))


def _probe_run(runs: list[list[Any]], **world: Any) -> list[dict[str, Any]]:
    """One probe run; its records, after the checks that need the objects.

    ``runs`` holds the group objects of the probe runs so far, newest last."""
    expected = _caller_draws()
    kept = [g for gs in _KEPT.values() for g in gs]
    out = simdist.run(probe, timeout=TIMEOUT, **world)
    records = [rec for rec, _ in out]
    groups = [g for _, gs in out for g in gs]
    # Each rank started from the caller's generators as they were at run start.
    assert [rec["draws"] for rec in records] == [expected] * len(records)
    # No group object of this run is one of the previous run's, or one kept by a failed run.
    earlier = (runs[-1] if runs else []) + kept
    assert not [g for g in groups if any(g is e for e in earlier)]
    # A group kept from an earlier run fails as "already ended"; this run's own work.
    for rec in records:
        assert rec["none_kept_is_mine"]
        if rec["kept_used"] != "nothing kept":
            assert rec["kept_used"] and all(o == ("SimulationError", True) for o in rec["kept_used"])
        size = rec["c10d"]["world_size"]
        assert rec["own_groups"]["world"] == size * (size + 1) / 2
        assert rec["default"]["resolves"]
    runs.append(groups)
    return records


def _differences(on: Any, off: Any, path: str = "") -> list[str]:
    """Every field where the reuse-on record differs from the reference."""
    if isinstance(on, dict) and isinstance(off, dict):
        out = [f"{path}: keys {sorted(on)} vs {sorted(off)}"] if on.keys() != off.keys() else []
        for key in on.keys() & off.keys():
            out += _differences(on[key], off[key], f"{path}.{key}")
        return out
    if isinstance(on, (list, tuple)) and isinstance(off, (list, tuple)) and len(on) == len(off):
        out = []
        for i, (a, b) in enumerate(zip(on, off)):
            out += _differences(a, b, f"{path}[{i}]")
        return out
    return [] if on == off else [f"{path}: reuse on {on!r}, reuse off {off!r}"]


def _on_and_off(monkeypatch: pytest.MonkeyPatch, scenario: Callable[[], Any]) -> tuple[Any, Any]:
    """The scenario with reuse on, then off, each from the same caller state and
    with the caller's generators as the scenario left them."""
    got = []
    for on in (True, False):
        monkeypatch.setattr(reuse, "ENABLED", on)
        if on:
            monkeypatch.setattr(reuse, "THREADS", True)
        _KEPT.clear()
        _seed()
        got.append({"scenario": scenario(), "caller_after": _caller_draws()})
    return got[0], got[1]


def _assert_same(monkeypatch: pytest.MonkeyPatch, scenario: Callable[[], Any]) -> Any:
    on, off = _on_and_off(monkeypatch, scenario)
    differences = _differences(on, off)
    assert not differences, "\n".join(differences)
    return off


def _outcome(exc: BaseException) -> tuple[Any, ...]:
    """A failed run as the caller sees it, without its run-unique text."""
    failures = getattr(exc, "failures", None) or {}
    cause = exc.__cause__
    return (type(exc).__name__, sorted(failures), None if cause is None else type(cause).__name__)


# ------------------------------------------------- 1 and 2: runs back to back


@pytest.mark.parametrize(
    "world",
    [
        pytest.param({"world_size": 4}, id="world4"),
        pytest.param({"layout": simdist.Layout(tp=2, dp=2)}, id="tp2-dp2"),
    ],
)
def test_a_second_run_of_the_same_shape_sees_what_it_sees_without_reuse(
    monkeypatch: pytest.MonkeyPatch, world: dict[str, Any]
) -> None:
    def scenario() -> list[Any]:
        runs: list[list[Any]] = []
        first = _probe_run(runs, **world)
        second = _probe_run(runs, **world)
        return [first, second]

    off = _assert_same(monkeypatch, scenario)
    # Each run's store was new: the key the first run left is not in the second's
    # (and the key was found where it landed, so that field is no vacuous []).
    stores = [rec["store"] for run in off["scenario"] for rec in run]
    assert [(s["left_key_present"], len(s["landed_under"])) for s in stores] == [(False, 1)] * 8


def test_a_caller_that_draws_between_runs_is_seen_with_its_new_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing a run keeps (its threads, the state it put back) may hide the caller's change."""

    def scenario() -> list[Any]:
        runs: list[list[Any]] = []
        first = _probe_run(runs, world_size=3)
        torch.rand(3), random.random(), numpy.random.rand(2)
        second = _probe_run(runs, world_size=3)
        torch.manual_seed(SEED)  # back to a state seen before, the others not
        third = _probe_run(runs, world_size=3)
        return [first, second, third]

    _assert_same(monkeypatch, scenario)


def test_runs_of_different_shapes_back_to_back_see_what_they_see_without_reuse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worlds: list[dict[str, Any]] = [
        {"world_size": 8},
        {"world_size": 2},
        {"layout": simdist.Layout(tp=2, pp=2)},
        {"world_size": 3},
    ]

    def scenario() -> list[Any]:
        runs: list[list[Any]] = []
        return [_probe_run(runs, **world) for world in worlds]

    _assert_same(monkeypatch, scenario)


# ------------------------------------------------------ 3: after a failed run


def _keep_groups(ctx: simdist.RankContext) -> None:
    _KEPT[ctx.rank] = _groups_of(ctx)


def raises_on_rank_1(ctx: simdist.RankContext) -> int:
    _keep_groups(ctx)
    if ctx.rank == 1:
        raise ValueError("rank 1 fails on purpose")
    return ctx.rank


def deadlocks(ctx: simdist.RankContext) -> int:
    _keep_groups(ctx)
    if ctx.rank == 0:
        dist.all_reduce(torch.ones(1))  # the others have returned: never completes
    return ctx.rank


def keyboard_interrupt_on_rank_1(ctx: simdist.RankContext) -> int:
    _keep_groups(ctx)
    if ctx.rank == 1:
        raise KeyboardInterrupt
    return ctx.rank


def ctrl_c_while_rank_0_computes(ctx: simdist.RankContext) -> int:
    _keep_groups(ctx)
    dist.barrier()
    if ctx.rank == 0:
        # Started from inside the run, so it cannot fire before or after it.
        threading.Timer(0.2, signal.pthread_kill, (MAIN, signal.SIGINT)).start()
        while True:
            pass
    return ctx.rank


def leaks_a_helper(ctx: simdist.RankContext, blocker: threading.Event) -> int:
    _keep_groups(ctx)
    if ctx.rank == 1:
        # Blocked in C: it cannot be stopped, so it outlives the run.
        threading.Thread(target=blocker.wait, name="reuse-leaked-helper", daemon=True).start()
    return ctx.rank


_ctrl_c_works = pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    or threading.current_thread() is not threading.main_thread(),
    reason="Ctrl-C is not delivered as KeyboardInterrupt to this thread",
)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        pytest.param(raises_on_rank_1, simdist.RankError, id="rank-error"),
        pytest.param(deadlocks, simdist.DeadlockError, id="deadlock"),
        pytest.param(keyboard_interrupt_on_rank_1, simdist.RankError, id="keyboard-interrupt-in-a-body"),
        pytest.param(ctrl_c_while_rank_0_computes, KeyboardInterrupt, id="ctrl-c", marks=_ctrl_c_works),
    ],
)
def test_a_run_after_a_failed_run_sees_what_it_sees_without_reuse(
    monkeypatch: pytest.MonkeyPatch, body: Callable[[simdist.RankContext], int], error: type[BaseException]
) -> None:
    def scenario() -> list[Any]:
        runs: list[list[Any]] = []
        with pytest.raises(error) as info:
            simdist.run(body, world_size=3, timeout=TIMEOUT)
        assert not dist.is_initialized()
        after = _probe_run(runs, world_size=3)
        again = _probe_run(runs, world_size=3)
        return [_outcome(info.value), after, again]

    _assert_same(monkeypatch, scenario)


def test_a_run_after_a_rank_leaked_a_helper_thread_sees_what_it_sees_without_reuse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(simdist._run.watchdog, "GRACE_S", 0.3)  # how long a rank waits for it

    def scenario() -> list[Any]:
        runs: list[list[Any]] = []
        blocker = threading.Event()
        before = set(threading.enumerate())
        try:
            with pytest.raises(simdist.RankError) as info:
                simdist.run(leaks_a_helper, world_size=3, timeout=TIMEOUT, args=(blocker,), share_args=True)
            assert "reuse-leaked-helper" in str(info.value.__cause__)
            after = _probe_run(runs, world_size=3)  # with the helper still blocked
        finally:
            blocker.set()
            for t in set(threading.enumerate()) - before:
                if t.name == "reuse-leaked-helper":
                    t.join(TIMEOUT)
        assert [t.name for t in threading.enumerate() if t.name == "reuse-leaked-helper"] == []
        again = _probe_run(runs, world_size=3)
        return [_outcome(info.value), after, again]

    _assert_same(monkeypatch, scenario)


# ------------------------------------------- 4: a module caching a group across runs


def caches_its_tp_group(ctx: simdist.RankContext) -> tuple[Any, float]:
    key = (ctx.rank, tuple(dist.get_process_group_ranks(ctx.groups.tp)))
    cached = _CACHE.get(key)
    if cached is None:
        _CACHE[key] = ctx.groups.tp
        outcome: Any = "filled"
    else:
        try:
            dist.all_reduce(torch.ones(1), group=cached)
            outcome = "the cached group worked"
        except Exception as exc:
            outcome = (type(exc).__name__, "already ended" in str(exc), cached is ctx.groups.tp)
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t, group=ctx.groups.tp)  # this run's own group works
    return outcome, t.item()


def test_a_group_cached_by_a_module_fails_in_the_next_run_with_reuse_on_and_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layout = simdist.Layout(tp=2, dp=2)

    def scenario() -> list[Any]:
        _CACHE.clear()
        return [simdist.run(caches_its_tp_group, layout=layout, timeout=TIMEOUT) for _ in range(2)]

    on, off = _on_and_off(monkeypatch, scenario)
    differences = _differences(on, off)
    assert not differences, "\n".join(differences)
    for got in (on, off):
        first, second = got["scenario"]
        assert [o for o, _ in first] == ["filled"] * 4
        # Not silently working on the ended run's group, nor taken for this run's.
        assert [o for o, _ in second] == [("SimulationError", True, False)] * 4
        # tp groups are {0, 1} and {2, 3}: rank + 1 summed over each.
        assert [s for _, s in second] == [3.0, 3.0, 7.0, 7.0]


# ------------------------------------------------------------- 5: explore


def explored_clean(ctx: simdist.RankContext) -> tuple[float, list[float]]:
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return t.item(), torch.rand(2).tolist()


def explored_racy(ctx: simdist.RankContext) -> tuple[int, ...]:
    dist.barrier()
    _RACE.append(ctx.rank)  # in whichever order the ranks get to run
    dist.barrier()
    return tuple(_RACE[-ctx.world_size :])


def test_explore_gives_the_same_verdicts_with_reuse_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def scenario() -> list[Any]:
        _RACE.clear()
        return [
            simdist.explore(explored_clean, schedules=3, world_size=3, timeout=TIMEOUT),
            simdist.explore(explored_racy, schedules=6, seed=1, world_size=3, timeout=TIMEOUT),
        ]

    on, off = _on_and_off(monkeypatch, scenario)
    # Divergences compare by every field: schedules run, seeds, what differed, both outcomes.
    assert on == off
    assert [str(v) for v in on["scenario"]] == [str(v) for v in off["scenario"]]
    # Neither comparison is vacuous: one program has a race to find, the other none.
    clean, racy = off["scenario"]
    assert not clean.found and racy.found


# ------------------------------------------------ 6: the pytest marker under xdist

_MARKED = """
import json, os, random, re, threading

import numpy
import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from simdist import Layout
from simdist._core import reuse
from simdist._isolation.c10d_state import SCOPE_SEP

# The caller's generators as each test finds them, whichever worker runs it.
torch.manual_seed(7)
random.seed(7)
numpy.random.seed(7)


def norm(name):
    return re.sub(re.escape(SCOPE_SEP) + r"[0-9]+[.]", "<run>.", name)


def record(ctx, test):
    world = c10d._world
    default = c10d._get_default_group()
    names = world.pg_names
    rec = {
        "reuse": reuse.enabled(),
        "draws": [torch.rand(2).tolist(), random.random(), float(numpy.random.rand())],
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": str(dist.get_backend()),
        "pg_names": sorted(names.values()),
        "pg_group_ranks": sorted([names[g], sorted(m.items())] for g, m in world.pg_group_ranks.items()),
        "tags": sorted([t, len(g)] for t, g in world.tags_to_pg.items()),
        "default": [norm(default.group_name), default.group_desc, default._get_backend_name()],
        "axes": {a: [dist.get_process_group_ranks(g), norm(g.group_name), g.group_desc]
                 for a, g in sorted(ctx.groups.by_axis.items())},
        "thread": [threading.current_thread().name, threading.current_thread().daemon],
    }
    with open(os.path.join(os.environ["REUSE_PROBE_OUT"], f"{test}-{ctx.rank}.json"), "w") as f:
        json.dump(rec, f, sort_keys=True)


@pytest.mark.simdist(world_size=4, timeout=30)
def test_flat(ctx):
    record(ctx, "flat")
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    assert t.item() == 6.0


@pytest.mark.simdist(layout=Layout(tp=2, dp=2), timeout=30)
def test_layout(ctx):
    record(ctx, "layout")
    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.groups.tp)
    assert t.item() == 2.0
"""


def _start_marked_tests_under_xdist(pytester: pytest.Pytester, name: str, env: dict[str, str]) -> Any:
    """``pytest -n 2`` on the marked tests in a fresh interpreter with ``env``
    (the switch is read at import); started, not waited for, so that the two
    sessions' interpreters start side by side."""
    records = pytester.mkdir(f"records-{name}")
    base = {k: v for k, v in os.environ.items() if k not in ("SIMDIST_REUSE", "SIMDIST_REUSE_THREADS")}
    args = [
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-n",
        "2",
        "-v",
        f"--basetemp={pytester.path / f'tmp-{name}'}",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *args],
        cwd=pytester.path,
        env={**base, **env, "REUSE_PROBE_OUT": str(records)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, records


def _finish(started: Any) -> tuple[dict[str, int], dict[str, dict[str, Any]], str]:
    proc, records = started
    out, _ = proc.communicate(timeout=300)  # guards this test run only
    result = pytest.RunResult(proc.returncode, out.splitlines(), [], 0.0)
    seen = {p.name: json.loads(p.read_text()) for p in sorted(records.iterdir())}
    return result.parseoutcomes(), seen, out


# Nightly, as tests/plugin's own xdist test: six interpreters importing torch
# (two sessions of a controller and two workers) take about 16 s on 2 cores.
@pytest.mark.slow
def test_marked_tests_under_xdist_pass_alike_with_reuse_on_and_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_marked=_MARKED)
    on_started = _start_marked_tests_under_xdist(pytester, "on", {})
    off_started = _start_marked_tests_under_xdist(pytester, "off", {"SIMDIST_REUSE": "0"})
    on, on_records, on_out = _finish(on_started)
    off, off_records, off_out = _finish(off_started)
    assert on == off == {"passed": 2}, (on_out, off_out)
    for out in (on_out, off_out):  # each test ran in an xdist worker
        assert len(re.findall(r"\[gw\d\].*PASSED", out)) == 2, out
    # Every rank of both worlds recorded, and the workers read the switch they were given.
    assert len(on_records) == len(off_records) == 8
    assert [r.pop("reuse") for r in on_records.values()] == [True] * 8
    assert [r.pop("reuse") for r in off_records.values()] == [False] * 8
    # Every rank of both tests observed the same world.
    differences = _differences(on_records, off_records)
    assert not differences, "\n".join(differences)


# ------------------------------------------ reuse did happen (not vacuous), and the switch


def _native_ids(world_size: int) -> list[int]:
    return simdist.run(lambda ctx: threading.get_native_id(), world_size=world_size, timeout=TIMEOUT)


def test_with_reuse_on_a_second_run_reuses_threads_and_the_prepared_init(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TORCH_DIST_INIT_BARRIER", raising=False)  # c10d's own path whatever reuse says
    monkeypatch.setattr(reuse, "ENABLED", True)
    monkeypatch.setattr(reuse, "THREADS", True)
    first = _native_ids(4)
    assert pool.capacity() > 0
    assert pool.idle_count() >= 4
    # The last threads parked are the first taken: the second run runs on the first's.
    assert sorted(_native_ids(4)) == sorted(first)

    store = dist.HashStore()
    prepared = c10d_init.Prepared("simdist", 2, store, timedelta(seconds=5), {0: 0, 1: 1})
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) not in c10d_init.TESTED:
        pytest.skip(f"torch {torch.__version__} always takes c10d's own init path")
    assert prepared.fast is True

    monkeypatch.setattr(reuse, "ENABLED", False)
    assert c10d_init.Prepared("simdist", 2, store, timedelta(seconds=5), {0: 0, 1: 1}).fast is False
    assert pool.capacity() == 0
    third, fourth = _native_ids(4), _native_ids(4)
    assert not set(third) & set(fourth)  # nothing is parked while reuse is off


def test_with_reuse_off_in_process_no_rank_runs_on_a_thread_parked_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reference must be one: with reuse off every run starts new threads,
    even right after reuse was switched off with threads parked."""
    monkeypatch.setattr(reuse, "ENABLED", True)
    monkeypatch.setattr(reuse, "THREADS", True)
    parked = _native_ids(3)
    assert pool.idle_count() >= 3
    monkeypatch.setattr(reuse, "ENABLED", False)
    # The parked threads are alive (parked or taken), so no new thread can have their ids.
    assert not set(_native_ids(3)) & set(parked)


# What a fresh interpreter's switch says; with ``runs``, also whether two runs
# shared threads and which init path a run's c10d state takes.
_SWITCH = """
import sys
from simdist._core import pool, reuse
print(reuse.enabled(), pool.capacity())
if sys.argv[1] == "runs":
    import threading
    from datetime import timedelta
    import torch.distributed as dist
    import simdist
    from simdist._isolation import c10d_init
    ids = [simdist.run(lambda ctx: threading.get_native_id(), world_size=3, timeout=30) for _ in range(2)]
    fast = c10d_init.Prepared("simdist", 2, dist.HashStore(), timedelta(seconds=5), {0: 0, 1: 1}).fast
    print(pool.idle_count(), bool(set(ids[0]) & set(ids[1])), fast)
"""


def _fresh_interpreter(env: dict[str, str], runs: bool) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("SIMDIST_REUSE", "SIMDIST_REUSE_THREADS")}
    base.pop("TORCH_DIST_INIT_BARRIER", None)  # c10d's own path whatever reuse says
    proc = subprocess.run(
        [sys.executable, "-c", _SWITCH, "runs" if runs else "switch"],
        capture_output=True,
        text=True,
        timeout=120,  # guards this test run only
        env={**base, **env},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_the_environment_of_a_fresh_interpreter_switches_reuse() -> None:
    enabled, capacity = _fresh_interpreter({}, runs=False)
    assert enabled == "True" and int(capacity) > 0  # the default the two below differ from
    enabled, capacity = _fresh_interpreter({"SIMDIST_REUSE_THREADS": "0"}, runs=False)
    assert enabled == "True" and int(capacity) == 0
    # The nightly profile's switch: nothing parked, no thread shared, c10d's own init path.
    enabled, capacity, idle, shared, fast = _fresh_interpreter({"SIMDIST_REUSE": "0"}, runs=True)
    assert enabled == "False" and int(capacity) == 0
    assert (idle, shared, fast) == ("0", "False", "False")


@pytest.mark.parametrize("value", ["0", "off", "False", " no "])
def test_every_spelling_of_off_turns_reuse_off(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIMDIST_REUSE", value)
    assert reuse._off("SIMDIST_REUSE") is True


@pytest.mark.parametrize("value", ["1", "on", "TRUE", ""])
def test_every_spelling_of_on_leaves_reuse_on_quietly(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIMDIST_REUSE", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reuse._off("SIMDIST_REUSE") is False


def test_a_value_that_is_neither_says_reuse_stays_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo must not pass for "off" silently: whoever set it is told."""
    monkeypatch.setenv("SIMDIST_REUSE", "of")
    with pytest.warns(RuntimeWarning, match=r"SIMDIST_REUSE='of' is not understood.*reuse stays on"):
        assert reuse._off("SIMDIST_REUSE") is False
