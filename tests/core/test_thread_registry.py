"""Parked rank threads and threading's private registry of live threads.

``simdist/_core/pool.py`` hides a parked thread from ``threading.enumerate()``
by taking it out of ``threading._active`` (a CPython internal: a dict keyed by
thread id). These tests pin that behaviour, and check that a Python whose
``threading`` keeps no such dict still imports simdist and runs worlds: its
rank threads are simply not parked (a listed parked thread would look like a
thread leaked by the run). Every reference is computed here, from plain
``threading`` and arithmetic, never by simdist.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist._core import pool

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0
WORLD = 3


def _sum_and_ident(ctx: simdist.RankContext) -> tuple[float, int, bool]:
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    me = threading.current_thread()
    return t.item(), threading.get_ident(), me in threading.enumerate()


def _parked_idents() -> set[int]:
    with pool._lock:
        return {w.thread.ident for w in pool._idle if w.thread.ident is not None}


def _has_room() -> bool:
    return pool.capacity() - pool.idle_count() >= WORLD


def test_a_parked_thread_leaves_threadings_registry_and_is_listed_again_while_it_runs() -> None:
    simdist.run(lambda ctx: None, world_size=WORLD, timeout=TIMEOUT)
    parked = _parked_idents()
    if len(parked) < WORLD:
        pytest.skip("the pool is full or off in this process")
    registry: dict[int, threading.Thread] = threading._active  # type: ignore[attr-defined]  # the internal pinned here
    assert not parked & set(registry)
    assert not parked & {t.ident for t in threading.enumerate()}
    results = simdist.run(_sum_and_ident, world_size=WORLD, timeout=TIMEOUT)
    total = float(sum(range(WORLD)))
    assert [(value, listed) for value, _, listed in results] == [(total, True)] * WORLD
    # The ranks ran on parked threads (the same OS threads), parked again after.
    idents = {ident for _, ident, _ in results}
    assert idents <= parked
    assert not idents & set(registry)


_UNUSABLE = {
    "no _active at all": lambda: types.SimpleNamespace(
        _active_limbo_lock=threading._active_limbo_lock  # type: ignore[attr-defined]
    ),
    "_active is not a dict": lambda: types.SimpleNamespace(
        _active=collections.UserDict(threading._active),  # type: ignore[attr-defined]
        _active_limbo_lock=threading._active_limbo_lock,  # type: ignore[attr-defined]
    ),
    "_active not keyed by thread id": lambda: types.SimpleNamespace(
        _active={t.name: t for t in threading.enumerate()},
        _active_limbo_lock=threading._active_limbo_lock,  # type: ignore[attr-defined]
    ),
    "no registry lock": lambda: types.SimpleNamespace(_active=threading._active),  # type: ignore[attr-defined]
}


@pytest.mark.parametrize("internals", list(_UNUSABLE), ids=list(_UNUSABLE))
def test_without_a_usable_registry_runs_work_and_no_thread_is_parked(
    monkeypatch: pytest.MonkeyPatch, internals: str
) -> None:
    if not _has_room():
        pytest.skip("the pool is full or off in this process: parking could not be seen")
    # raising=False: on a pool that binds the registry at import this changes
    # nothing, and the threads it parks fail the test.
    monkeypatch.setattr(pool, "_internals", _UNUSABLE[internals](), raising=False)
    listed = set(threading.enumerate())
    parked = _parked_idents()
    total = float(sum(range(WORLD)))
    for _ in range(3):
        results = simdist.run(_sum_and_ident, world_size=WORLD, timeout=TIMEOUT)
        assert [(value, listed_) for value, _, listed_ in results] == [(total, True)] * WORLD
        # Parked threads stay parked: none of them runs a rank.
        assert not {ident for _, ident, _ in results} & parked
    assert _parked_idents() == parked
    assert set(threading.enumerate()) == listed


def test_simdist_imports_and_runs_where_threading_has_no_registry() -> None:
    """A Python without ``threading._active`` when simdist is imported (put
    back afterwards only because this CPython's threading needs it itself)."""
    script = textwrap.dedent(
        """
        import threading
        import torch, torch.distributed  # before: their own imports use threading
        saved = threading._active
        del threading._active
        try:
            import simdist
            from simdist._core import pool
        finally:
            threading._active = saved
        import types
        pool._internals = types.SimpleNamespace()
        out = simdist.run(lambda ctx: ctx.rank * 2, world_size=4, timeout=60)
        print(out, pool.idle_count())
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT * 2, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[-2] == f"{[r * 2 for r in range(4)]} 0"
