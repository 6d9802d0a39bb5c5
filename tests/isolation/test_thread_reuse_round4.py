"""A parked rank thread starts its next task as a new thread would (issue 28,
points 1-4): every torch thread-local setting, threading's trace and profile
hooks as they are now, and a ``Thread`` object of its own.

The reference is a fresh ``threading.Thread`` (or the running torch itself,
probed by setting each setting in one thread and reading it in another),
never a value simdist computes. A thread left with a torch setting changed
is not parked (it ends, as every rank thread once did); where what was left
behind is reset instead (the Thread object, threading's hooks), the test
checks that the next run did run on the parked threads, so a pool that
parks nothing cannot pass for one that resets well.
"""

from __future__ import annotations

import _threading_local
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import simdist
from simdist._core import pool
from simdist._isolation import thread_state as torch_tls

TIMEOUT = 60.0
WORLD = 3


def in_fresh_thread(read: Callable[[], Any]) -> Any:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(read()))
    t.start()
    t.join(TIMEOUT)
    return out[0]


def _next_run(leave: Callable[[], None], read: Callable[[], Any], *, parked: bool = False) -> list[Any]:
    """Run ``leave`` in every rank, then ``read`` in the next run; with
    ``parked``, check that the next run ran on the first run's threads."""

    def leaving(ctx: simdist.RankContext) -> int:
        leave()
        return threading.get_ident()

    first = simdist.run(leaving, world_size=WORLD, timeout=TIMEOUT)
    if parked and pool.capacity() < WORLD:
        pytest.skip("thread reuse is off in this process")
    second = simdist.run(lambda ctx: (threading.get_ident(), read()), world_size=WORLD, timeout=TIMEOUT)
    if parked:
        assert sorted(i for i, _ in second) == sorted(first)
    return [value for _, value in second]


def test_every_setting_torch_keeps_per_thread_is_enumerated() -> None:
    # The probe sets each getter/setter pair of torch._C in one thread and
    # reads it in a fresh one: a torch release that adds a thread-local pair
    # fails here until TOGGLES names it.
    found = set(torch_tls.discover())
    assert ("torch._C", "is_grad_enabled", "_set_grad_enabled") in found  # the probe works
    assert found - set(torch_tls.TOGGLES) == set()
    assert torch_tls.missing() == []


@pytest.mark.parametrize(
    ("getter", "setter"),
    [
        ("_is_view_replay_enabled", "_set_view_replay_enabled"),
        ("_get_dtensor_allow_implicit_replication", "_set_dtensor_allow_implicit_replication"),
        ("_is_grad_layout_enforcement_enabled", "_set_grad_layout_enforcement_enabled"),
        ("_only_lift_cpu_tensors", "_set_only_lift_cpu_tensors"),
    ],
)
def test_a_thread_local_torch_setting_a_rank_left_changed_is_new_in_the_next_run(
    getter: str, setter: str
) -> None:
    get, put = getattr(torch._C, getter), getattr(torch._C, setter)
    fresh = in_fresh_thread(get)
    assert _next_run(lambda: put(not fresh), get) == [fresh] * WORLD


def _flip_every_toggle() -> None:
    for space, getter, setter in torch_tls.TOGGLES:
        module = torch_tls.NAMESPACES[space]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the per-device autocast pairs are deprecated
                getattr(module, setter)(not getattr(module, getter)())
        except Exception:
            pass  # refused on this build


def test_every_enumerated_setting_a_rank_flipped_reads_as_new_in_the_next_run() -> None:
    def as_a_new_rank_reads() -> tuple[Any, ...]:
        # A rank body runs with autograd's multithreading off (_run/rank.py).
        with torch.autograd.set_multithreading_enabled(False):
            return torch_tls.read_toggles()

    got = _next_run(_flip_every_toggle, torch_tls.read_toggles)
    assert got == [in_fresh_thread(as_a_new_rank_reads)] * WORLD


@pytest.mark.parametrize("flipped", [False, True], ids=["as-new", "every-toggle-flipped"])
def test_the_toggles_read_as_their_own_getters_do_and_warn_nothing(flipped: bool) -> None:
    # read_toggles reads torch's deprecated autocast getters through the
    # device-typed getter (no warning, no warnings.catch_warnings): it must
    # read what each listed getter itself reads, in a thread where every
    # setting is flipped too, and warn nothing (warnings are errors here).
    def read_direct() -> tuple[Any, ...]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tuple(getattr(torch_tls.NAMESPACES[s], g)() for s, g, _ in torch_tls.TOGGLES)

    def read_both() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        if flipped:
            _flip_every_toggle()
        direct = read_direct()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            quiet = torch_tls.read_toggles()
        return direct, quiet

    direct, quiet = in_fresh_thread(read_both)
    assert quiet == direct
    if flipped:
        assert direct != in_fresh_thread(read_direct)  # the flips took: the comparison means something


@pytest.mark.parametrize("hook", ["trace", "profile"])
def test_a_hook_removed_between_runs_is_not_called_by_the_next_run(hook: str) -> None:
    calls: list[str] = []

    def counting(frame: Any, event: str, arg: Any) -> None:
        calls.append(event)

    install = threading.settrace if hook == "trace" else threading.setprofile
    if pool.capacity() < pool.idle_count() + WORLD:
        pytest.skip("thread reuse is off or the pool is full in this process")
    # More ranks than threads are parked: some start new, under the hook.
    n = pool.idle_count() + WORLD
    install(counting)  # type: ignore[operator]
    try:
        first = simdist.run(lambda ctx: threading.get_ident(), world_size=n, timeout=TIMEOUT)
    finally:
        install(None)  # type: ignore[operator]
        sys.settrace(None)
        sys.setprofile(None)
    assert calls, "the hook never ran in the run it was set for"
    calls.clear()
    again = simdist.run(lambda ctx: threading.get_ident(), world_size=n, timeout=TIMEOUT)
    assert set(again) & set(first)  # threads of the hooked run ran this one
    assert calls == []


def test_a_hook_set_between_runs_reaches_the_reused_threads() -> None:
    calls: list[str] = []

    def counting(frame: Any, event: str, arg: Any) -> None:
        calls.append(event)

    simdist.run(lambda ctx: None, world_size=WORLD, timeout=TIMEOUT)
    threading.setprofile(counting)
    try:
        simdist.run(lambda ctx: sum(range(3)), world_size=WORLD, timeout=TIMEOUT)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(None)
    assert calls


def test_an_attribute_set_on_the_current_thread_is_gone_in_the_next_run() -> None:
    def leave() -> None:
        threading.current_thread().left_by_run_one = True  # type: ignore[attr-defined]

    got = _next_run(leave, lambda: hasattr(threading.current_thread(), "left_by_run_one"), parked=True)
    assert got == [False] * WORLD


_py_local = _threading_local.local()


def test_a_pure_python_thread_local_value_is_gone_in_the_next_run() -> None:
    def leave() -> None:
        _py_local.value = "run one"

    got = _next_run(leave, lambda: getattr(_py_local, "value", "absent"), parked=True)
    assert got == [in_fresh_thread(lambda: getattr(_py_local, "value", "absent"))] * WORLD


def test_each_run_sees_a_thread_object_of_its_own() -> None:
    first = simdist.run(lambda ctx: threading.current_thread(), world_size=WORLD, timeout=TIMEOUT)
    second = simdist.run(lambda ctx: threading.current_thread(), world_size=WORLD, timeout=TIMEOUT)
    assert {id(t) for t in first}.isdisjoint(id(t) for t in second)
    for t in second:
        assert t.name.startswith("simdist-rank-") and t.ident is not None


def test_a_rank_threads_handle_reads_as_ended_once_the_run_returns() -> None:
    # Decided (docs/threads-and-exits.md): as with a process's thread that
    # has ended, whether its OS thread is parked or not.
    simdist.run(lambda ctx: None, world_size=WORLD, timeout=TIMEOUT)
    handles = simdist.run(lambda ctx: threading.current_thread(), world_size=WORLD, timeout=TIMEOUT)
    for handle in handles:
        handle.join(TIMEOUT)
        assert not handle.is_alive()
    assert all(h not in threading.enumerate() for h in handles)


def test_a_rank_threads_handle_is_alive_while_its_rank_runs() -> None:
    def body(ctx: simdist.RankContext) -> tuple[bool, bool]:
        me = threading.current_thread()
        return me.is_alive(), me in threading.enumerate()

    simdist.run(lambda ctx: None, world_size=WORLD, timeout=TIMEOUT)
    assert simdist.run(body, world_size=WORLD, timeout=TIMEOUT) == [(True, True)] * WORLD
