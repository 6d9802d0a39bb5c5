"""Properties that test less than they seem: one leaks a thread, one runs a
FaultPlan that never fires, and the last one's cases hang. A campaign must
name the leak and the unfired plan, and report the hang as a failure with
its case (never exit 0).

Not collected by the normal test run; tests/fuzz_runner/test_fuzz_user_path.py fuzzes it.
The hanging property comes last in the file, so the others' first rounds run
before it stops the worker.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

import simdist
from simdist import fuzz

_forever = threading.Event()


@given(case=st.fixed_dictionaries({"n": st.integers(0, 3)}))
@fuzz.replayable(dict)
def test_leaks_a_thread(case: dict) -> None:
    threading.Thread(target=_forever.wait, name=f"leaked-by-case-{case['n']}", daemon=True).start()


def _all_reduce_once(ctx: simdist.RankContext) -> torch.Tensor:
    t = torch.ones(1)
    dist.all_reduce(t)
    return t


@given(st.integers(1, 2))
def test_a_crash_is_survived(world: int) -> None:
    plan = simdist.FaultPlan.crash(rank=0, op="broadcast")  # the body never broadcasts
    try:
        simdist.run(_all_reduce_once, world_size=world, faults=plan)
    except simdist.SimulationError:
        pass


@given(case=st.fixed_dictionaries({"n": st.integers(0, 3)}))
@fuzz.replayable(dict)
def test_hangs(case: dict) -> None:
    _forever.wait()  # never set: every case hangs
