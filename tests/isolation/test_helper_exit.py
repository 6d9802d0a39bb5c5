"""A helper thread that ends itself with ``sys.exit()`` or ``_thread.exit()``
ends silently, as in a process (issue 28, point 9): its rank does not fail.

The reference is a plain thread of this process: threading's default
excepthook reports nothing for a SystemExit, and the process goes on.
"""

from __future__ import annotations

import _thread
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist.policy import SCHEDULES

TIMEOUT = 60.0
EXITS: dict[str, Callable[[], None]] = {"sys.exit": lambda: sys.exit(3), "_thread.exit": _thread.exit}


@pytest.mark.parametrize("how", list(EXITS))
def test_a_plain_threads_exit_is_silent_in_a_process(
    how: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Any] = []

    def default_hook(args: Any) -> None:
        seen.append(args.exc_type)
        threading.__excepthook__(args)

    monkeypatch.setattr(threading, "excepthook", default_hook)
    t = threading.Thread(target=EXITS[how])
    t.start()
    t.join(TIMEOUT)
    assert seen == [SystemExit] and not t.is_alive()
    assert capsys.readouterr().err == ""  # the default hook is silent for it


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("how", list(EXITS))
def test_a_helper_that_exits_ends_silently_and_its_rank_goes_on(how: str, schedule: str) -> None:
    def body(ctx: simdist.RankContext) -> tuple[bool, float]:
        reached: list[bool] = []

        def helper() -> None:
            EXITS[how]()
            reached.append(True)  # never: the thread ended above

        thread = threading.Thread(target=helper)
        thread.start()
        thread.join()
        t = torch.ones(1)
        dist.all_reduce(t)
        return bool(reached), t.item()

    got = simdist.run(body, world_size=2, schedule=schedule, timeout=TIMEOUT)
    assert got == [(False, 2.0)] * 2
