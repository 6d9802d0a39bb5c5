"""Real worlds (``run_processes``) report the rank that went down first.

When a rank's process dies and its peers then lose their connections, the
dead rank is the failure (with its exit code, as it left no traceback) and
the peers' transport errors are consequences; the timeout message never calls
a rank both running and finished.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time

import pytest
import torch
import torch.distributed as dist

from simdist import RankContext, RankError, SimulationTimeout, run_processes

pytestmark = pytest.mark.gloo


def die_then_peers_lose_it(ctx: RankContext) -> float:
    dist.barrier()
    if ctx.rank == 1:
        os._exit(7)  # no traceback, no outcome file
    t = torch.ones(1)
    dist.all_reduce(t)  # the peers find the connection closed
    return t.item()


def test_the_rank_that_died_is_the_failure_not_the_peers_that_lost_it() -> None:
    with pytest.raises(RankError) as info:
        run_processes(die_then_peers_lose_it, world_size=2, timeout=60)
    err = info.value
    assert err.ranks == (1,)
    assert err.released == (0,)
    assert "rank 1 exited with code 7, no traceback" in str(err.__cause__)
    assert str(err).startswith("rank 1 exited with code 7")
    assert not multiprocessing.active_children()


def one_rank_returns_at_once(ctx: RankContext) -> None:
    if ctx.rank == 0:
        time.sleep(600)


def test_the_timeout_message_never_calls_a_rank_both_running_and_finished() -> None:
    with pytest.raises(SimulationTimeout) as info:
        run_processes(one_rank_returns_at_once, world_size=2, timeout=3)
    message = str(info.value)
    # Rank 1 returned at once and then waited for rank 0 at teardown: it was
    # killed, but it is not "still running".
    assert re.search(r"ranks \[0\] were still running their body; ranks \[1\] had returned", message), message
    assert "[0, 1]" not in message
    assert not multiprocessing.active_children()
