"""A patch removed at a run's end restores only what it changed (issue 28,
point 14): what the caller set while the run was in progress
(``sys.excepthook``, a wrapper around ``Thread.start``) stays; what the
run's own code set (c10d's rank-prefixing excepthook) is undone."""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch.distributed as dist

import simdist

TIMEOUT = 60.0


def test_an_excepthook_the_caller_sets_during_a_run_stays() -> None:
    before = sys.excepthook

    def mine(*args: Any) -> None:
        before(*args)

    def body(ctx: simdist.RankContext) -> None:
        if ctx.rank == 0:
            sys.excepthook = mine  # the caller's code, running while the run is in progress
        dist.barrier()

    try:
        simdist.run(body, world_size=2, timeout=TIMEOUT)
        assert sys.excepthook is mine
    finally:
        sys.excepthook = before


def test_the_excepthook_ranks_init_process_group_wraps_is_undone() -> None:
    before = sys.excepthook
    simdist.run(lambda ctx: dist.barrier(), world_size=2, timeout=TIMEOUT)
    assert sys.excepthook is before


def test_a_thread_start_wrapper_the_caller_installs_during_a_run_stays() -> None:
    original = threading.Thread.start
    calls: list[str] = []
    wrapped: list[Any] = []

    def body(ctx: simdist.RankContext) -> None:
        if ctx.rank == 0:
            inner = threading.Thread.start

            def start(self: threading.Thread) -> None:
                calls.append(self.name)
                inner(self)

            wrapped.append(start)
            threading.Thread.start = start  # type: ignore[method-assign]
        dist.barrier()

    try:
        simdist.run(body, world_size=2, timeout=TIMEOUT)
        assert threading.Thread.start is wrapped[0]
        t = threading.Thread(target=lambda: None, name="after-the-run")
        t.start()  # the wrapper calls simdist's start, which outside runs is the original
        t.join(TIMEOUT)
        assert calls == ["after-the-run"]
    finally:
        threading.Thread.start = original  # type: ignore[method-assign]
