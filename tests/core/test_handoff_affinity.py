"""Handing the run token on keeps the next holder on the hander's CPU, and
nothing else: a rank runs its own code with its own CPU mask, every thread
has its mask back after the run, and where threads ran changes no result.

(The speed this buys is printed by benchmarks/scale.py; here only what must
hold.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist._core import affinity
from simdist._core.identity import me

CPUS = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
needs_pins = pytest.mark.skipif(
    not affinity.ENABLED or len(CPUS) < 2,
    reason="pinning needs Linux's sched_getcpu and a process that may use 2 or more CPUs",
)


@pytest.fixture(autouse=True)
def _an_idle_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests run beside others (pytest -n): they ask for pins as a
    quiet machine gets them. Whether a busy machine gets none is tested below."""
    monkeypatch.setattr(affinity, "_machine_busy", lambda: False)


def _handoffs() -> affinity.Handoffs:
    world = me.world
    assert world is not None
    handoffs = world.scheduler._turns.handoffs
    assert isinstance(handoffs, affinity.Handoffs)
    return handoffs


def _masks_of_every_thread() -> dict[int, set[int]]:
    masks = {}
    for thread in threading.enumerate():
        if thread.native_id is not None:
            try:
                masks[thread.native_id] = os.sched_getaffinity(thread.native_id)
            except OSError:
                pass  # the thread ended meanwhile
    return masks


@needs_pins
def test_a_sleeping_thread_is_pinned_to_the_callers_cpu_and_takes_its_own_mask_back() -> None:
    handoffs = affinity.Handoffs(affinity.caller_mask())
    assert handoffs.enabled
    woken, restored = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def sleeper() -> None:
        woken.wait(30)
        seen["while pinned"] = os.sched_getaffinity(0)
        affinity.restore()
        seen["after restore"] = os.sched_getaffinity(0)
        restored.set()

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        assert thread.native_id is not None
        own = os.sched_getaffinity(thread.native_id)
        handoffs.pin(thread.native_id)
        pinned = os.sched_getaffinity(thread.native_id)
        assert len(pinned) == 1 and pinned < CPUS
        assert handoffs.pins == 1
    finally:
        woken.set()
        thread.join(30)
    assert restored.is_set()
    assert seen["while pinned"] == pinned
    assert seen["after restore"] == own
    # A thread that was not pinned is left as it is.
    before = os.sched_getaffinity(0)
    affinity.restore()
    assert os.sched_getaffinity(0) == before


@needs_pins
def test_a_thread_that_is_gone_turns_pinning_off_instead_of_failing() -> None:
    handoffs = affinity.Handoffs(affinity.caller_mask())
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    assert thread.native_id is not None
    handoffs.pin(thread.native_id)  # (an id the OS may not have reused this soon)
    if handoffs.enabled:
        pytest.skip("the OS reused the thread id at once")
    assert handoffs.pins == 0
    handoffs.pin(threading.get_native_id())  # off: touches nothing any more
    assert os.sched_getaffinity(0) == CPUS


def _collectives(ctx: Any, own_mask: set[int] | None, calls: int = 12) -> list[Any]:
    """All-reduces and sends between ranks, reading the rank's mask after each."""
    if own_mask is not None and ctx.rank == 1:
        os.sched_setaffinity(0, own_mask)  # what a process may do for itself
    t = torch.full((4,), float(ctx.rank + 1))
    masks = []
    for i in range(calls):
        dist.all_reduce(t)
        masks.append(os.sched_getaffinity(0))
        peer = (ctx.rank + 1) % ctx.world_size
        if ctx.rank % 2 == 0:
            dist.send(t * i, dst=peer)
        else:
            got = torch.empty(4)
            dist.recv(got, src=(ctx.rank - 1) % ctx.world_size)
            t += got
        masks.append(os.sched_getaffinity(0))
    return [t.tolist(), masks, _handoffs().pins, _handoffs().enabled]


@needs_pins
def test_ranks_are_pinned_between_turns_and_run_their_own_code_with_their_own_mask() -> None:
    before = _masks_of_every_thread()
    results = simdist.run(_collectives, world_size=4, args=(None,))
    pins = results[0][2]
    assert results[0][3], "pinning was turned off during the run"
    assert pins >= 12, f"expected a pin at (nearly) every switch, got {pins}"
    for rank, (_, masks, _, _) in enumerate(results):
        assert all(m == CPUS for m in masks), f"rank {rank} ran its own code pinned: {masks}"
    after = _masks_of_every_thread()
    changed = {tid: m for tid, m in after.items() if m != before.get(tid, CPUS)}
    assert not changed, f"threads left pinned after the run: {changed}"


@needs_pins
def test_a_mask_a_rank_sets_itself_is_kept_across_switches() -> None:
    own = {min(CPUS)}
    results = simdist.run(_collectives, world_size=4, args=(own,))
    assert results[0][2] > 0
    assert all(m == own for m in results[1][1]), results[1][1]
    for rank in (0, 2, 3):
        assert all(m == CPUS for m in results[rank][1])


def test_where_ranks_run_changes_no_result_and_no_order(monkeypatch: pytest.MonkeyPatch) -> None:
    def run() -> list[Any]:
        return [r[0] for r in simdist.run(_order_body, world_size=4, schedule="random", seed=7)]

    pinned = run()
    monkeypatch.setattr(affinity, "ENABLED", False)
    assert run() == pinned


_order: list[int] = []


def _order_body(ctx: Any) -> tuple[list[float], int]:
    t = torch.randn(3, generator=torch.Generator().manual_seed(ctx.rank))
    for _ in range(5):
        dist.all_reduce(t)
        _order.append(ctx.rank)
    return t.tolist(), _handoffs().pins


def test_the_order_ranks_take_turns_is_the_same_pinned_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    _order.clear()
    simdist.run(_order_body, world_size=4, schedule="random", seed=3)
    pinned = list(_order)
    _order.clear()
    monkeypatch.setattr(affinity, "ENABLED", False)
    results = simdist.run(_order_body, world_size=4, schedule="random", seed=3)
    assert list(_order) == pinned
    assert all(pins == 0 for _, pins in results)


def test_the_environment_variable_turns_it_off() -> None:
    code = (
        "import simdist; from simdist._core import affinity; import torch.distributed as dist;\n"
        "def body(ctx):\n"
        "    import torch; dist.all_reduce(torch.ones(2))\n"
        "    from simdist._core.identity import me\n"
        "    return me.world.scheduler._turns.handoffs.pins\n"
        "print(affinity.ENABLED, simdist.run(body, world_size=3))\n"
    )
    env = dict(os.environ, SIMDIST_HANDOFF_AFFINITY="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "[0,", "0,", "0]"]


@needs_pins
def test_a_caller_held_to_one_cpu_gets_no_pins() -> None:
    cpu = min(CPUS)
    os.sched_setaffinity(0, {cpu})
    try:
        results = simdist.run(_order_body, world_size=3)
    finally:
        os.sched_setaffinity(0, CPUS)
    assert all(pins == 0 for _, pins in results)


def _fails_or_deadlocks(ctx: Any, how: str) -> None:
    t = torch.ones(2)
    for _ in range(3):
        dist.all_reduce(t)
    if how == "raise" and ctx.rank == 2:
        raise ValueError("rank 2 gives up")
    if how == "deadlock" and ctx.rank == 0:
        dist.recv(t, src=1)  # rank 1 never sends
    dist.all_reduce(t)


@needs_pins
@pytest.mark.parametrize("how", ["raise", "deadlock"])
def test_a_run_that_fails_leaves_no_thread_pinned(how: str) -> None:
    before = _masks_of_every_thread()
    with pytest.raises((ValueError, simdist.DeadlockError, simdist.SimulationError)):
        simdist.run(_fails_or_deadlocks, world_size=4, args=(how,))
    after = _masks_of_every_thread()
    changed = {tid: m for tid, m in after.items() if m != before.get(tid, CPUS)}
    assert not changed, f"threads left pinned after a run that failed ({how}): {changed}"
    live = {t.native_id for t in threading.enumerate()}
    assert not live & set(affinity._own), f"pins never taken back: {affinity._own}"


@needs_pins
def test_runs_from_two_threads_at_once_and_a_nested_run_leave_no_thread_pinned() -> None:
    before = _masks_of_every_thread()
    out: dict[str, Any] = {}

    def nested(ctx: Any) -> list[Any]:
        inner = simdist.run(_collectives, world_size=2, args=(None, 3)) if ctx.rank == 0 else None
        return [_collectives(ctx, None, 3), inner]

    def caller(name: str) -> None:
        out[name] = simdist.run(nested, world_size=4)

    threads = [threading.Thread(target=caller, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(out) == {"a", "b"}
    for results in out.values():
        for rank, (own, inner) in enumerate(results):
            assert all(m == CPUS for m in own[1]), f"rank {rank} ran pinned"
            if inner is not None:
                assert all(m == CPUS for r in inner for m in r[1]), "a nested run's rank ran pinned"
    after = _masks_of_every_thread()
    changed = {tid: m for tid, m in after.items() if m != before.get(tid, CPUS)}
    assert not changed, f"threads left pinned: {changed}"


def _sets_own_mask(ctx: Any, cpu: int) -> set[int]:
    seen = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})  # a rank may hold itself to one CPU; its process would end
    dist.barrier()
    return seen


@pytest.mark.skipif(len(CPUS) < 2, reason="needs a process that may use 2 or more CPUs")
@pytest.mark.parametrize("schedule", ["rank", "concurrent"])
def test_a_pooled_thread_starts_each_run_with_that_runs_callers_mask(schedule: str) -> None:
    cpu = min(CPUS)
    simdist.run(_sets_own_mask, world_size=4, args=(cpu,), schedule=schedule)
    # The next run reuses those threads (parked, not ended): each rank must
    # start as a new thread would, with this caller's mask.
    seen = simdist.run(_sets_own_mask, world_size=4, args=(cpu,), schedule=schedule)
    assert all(mask == CPUS for mask in seen), seen
    held = {max(CPUS)}
    os.sched_setaffinity(0, held)
    try:
        seen = simdist.run(_sets_own_mask, world_size=4, args=(cpu,), schedule=schedule)
    finally:
        os.sched_setaffinity(0, CPUS)
    assert all(mask == held for mask in seen), seen
    simdist.run(lambda ctx: None, world_size=4, schedule=schedule)  # the pool's threads get CPUS back


@pytest.mark.parametrize(
    ("loadavg", "busy"),
    [("0.41 0.30 0.22 1/212 4242\n", False), ("1.93 1.10 0.80 3/215 4250\n", True), ("garbled\n", False)],
)
def test_a_machine_with_another_running_thread_is_busy(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, loadavg: str, busy: bool
) -> None:
    monkeypatch.undo()  # the real _machine_busy, reading a file of ours
    fake = tmp_path / "loadavg"
    fake.write_text(loadavg)
    monkeypatch.setattr(affinity, "_LOADAVG", str(fake))
    assert affinity._machine_busy() is busy
    monkeypatch.setattr(affinity, "_LOADAVG", str(tmp_path / "missing"))
    assert affinity._machine_busy() is False


@needs_pins
def test_a_busy_machine_gets_no_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(affinity, "_machine_busy", lambda: True)
    assert not affinity.Handoffs(affinity.caller_mask()).enabled
    results = simdist.run(_order_body, world_size=3)
    assert all(pins == 0 for _, pins in results)


def test_back_to_back_runs_share_one_look_at_the_machine(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One look answers for ``_LOOK_S``: the file is not read again at every
    run start, and is once the window has passed (a machine that got busy is
    seen)."""
    monkeypatch.undo()  # the real _machine_busy, reading a file of ours
    fake = tmp_path / "loadavg"
    fake.write_text("0.41 0.30 0.22 1/212 4242\n")
    monkeypatch.setattr(affinity, "_LOADAVG", str(fake))
    monkeypatch.setattr(affinity, "_LOOK_S", 60.0)
    assert affinity._machine_busy() is False
    fake.write_text("1.93 1.10 0.80 3/215 4250\n")
    assert affinity._machine_busy() is False  # the same look
    monkeypatch.setattr(affinity, "_LOOK_S", 0.0)
    assert affinity._machine_busy() is True  # looked again: the file is read afresh


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors in /proc")
def test_a_look_never_waits_for_another_and_keeps_one_file_open(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs starting at once: the one that finds the other looking does
    not wait for it and gets no pins (a machine with two callers is busy).
    However often the file changes, one descriptor at most stays open."""
    monkeypatch.undo()  # the real _machine_busy, reading files of ours
    monkeypatch.setattr(affinity, "_LOOK_S", 0.0)
    with affinity._look.lock:
        assert affinity._machine_busy() is True
    before = len(os.listdir("/proc/self/fd"))
    for i in range(50):
        fake = tmp_path / f"loadavg{i % 3}"
        fake.write_text("0.41 0.30 0.22 1/212 4242\n")
        monkeypatch.setattr(affinity, "_LOADAVG", str(fake))
        assert affinity._machine_busy() is False
    assert len(os.listdir("/proc/self/fd")) <= before + 1
    fake.unlink()
    monkeypatch.setattr(affinity, "_LOADAVG", str(tmp_path / "gone"))
    assert affinity._machine_busy() is False and affinity._look.fd is None
