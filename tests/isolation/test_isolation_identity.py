"""The one rank identity (``_core.identity``) and the one patch registry
(``_isolation.patches``): stop requests never land in a thread's clean-up,
and a patch set-up that fails half way leaves nothing installed."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch.distributed.distributed_c10d as c10d

import simdist
from simdist._core import identity
from simdist._isolation import patches


def test_a_bound_thread_is_asked_to_stop_at_most_once_and_never_in_its_clean_up() -> None:
    caught: list[str] = []
    phase: list[str] = []
    bound, asked, cleaning, done = (threading.Event() for _ in range(4))
    cleanup_raised: list[BaseException] = []

    def cleanup() -> None:
        cleaning.set()
        end = time.monotonic() + 0.5
        while time.monotonic() < end:  # Python bytecode: a pending stop would land here
            pass
        phase.append("cleaned")

    def thread_body() -> None:
        identity.bind(object(), 0)
        bound.set()
        end = time.monotonic() + 30
        while not asked.is_set() and time.monotonic() < end:
            try:
                time.sleep(0.001)
            except simdist.SimulationError as exc:  # catches its stop and goes on
                caught.append(type(exc).__name__)
        try:
            identity.leave(cleanup)
        except BaseException as exc:
            cleanup_raised.append(exc)
        done.set()

    thread = threading.Thread(target=thread_body)
    thread.start()
    assert bound.wait(30)
    assert thread.ident is not None
    identity.interrupt(thread.ident, simdist.SimulationError)
    deadline = time.monotonic() + 30
    while not caught and time.monotonic() < deadline:
        time.sleep(0.01)
    identity.interrupt(thread.ident, simdist.SimulationError)  # a second ask: not sent
    time.sleep(0.2)
    asked.set()
    assert cleaning.wait(30)
    identity.interrupt(thread.ident, simdist.SimulationTimeout)  # during its clean-up: not sent
    assert done.wait(30)
    thread.join(30)
    assert caught == ["SimulationError"]
    assert phase == ["cleaned"] and cleanup_raised == []
    assert identity.me.world is None  # this thread was never bound


def test_unbind_leaves_the_class_defaults() -> None:
    seen: list[Any] = []

    def body() -> None:
        identity.bind("world", 3, c10d="state", helper="slot")
        seen.append((identity.me.world, identity.me.rank, identity.me.c10d, identity.me.helper))
        identity.unbind()
        seen.append((identity.me.world, identity.me.rank, identity.me.c10d, identity.me.helper))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(30)
    assert seen == [("world", 3, "state", "slot"), (None, -1, None, None)]


def test_a_patch_whose_install_fails_removes_those_installed_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original_world = type(c10d._world)
    start = threading.Thread.start
    helper_patch = patches._BY_NAME["helper threads"]

    def broken() -> None:
        raise RuntimeError("cannot patch")

    monkeypatch.setattr(helper_patch, "install", broken)
    with pytest.raises(RuntimeError, match="cannot patch"):
        simdist.run(lambda ctx: ctx.rank, world_size=2, timeout=60.0)
    assert patches.installed() == []
    assert type(c10d._world) is original_world and threading.Thread.start is start
    monkeypatch.undo()
    assert simdist.run(lambda ctx: ctx.rank, world_size=2, timeout=60.0) == [0, 1]


def test_leases_count_users_and_release_once() -> None:
    first = patches.lease()
    second = patches.lease()
    every_run = [
        "c10d routing",
        "ddp logging",
        "prefix store",
        "debugger",
        "helper threads",
        "profiler",
        "async sanitizer",
    ]
    assert patches.installed() == every_run
    first.release()
    first.release()  # twice: nothing more
    assert patches.installed() == every_run
    second.release()
    assert patches.installed() == []
    with pytest.raises(ValueError, match="unknown simdist patch"):
        patches.lease(("c10d routnig",))
