"""A run leaves no cyclic garbage: its world is freed by reference counting
the moment the last reference goes, not at the collector's next pass.

The world's parts hold callbacks, not the world: the scheduler gets a
description function over the layout, a resume function over the rank
states, the detector is reached from the run token through a weak method,
the sanitizer's mode holds its book's calls in flight (not the book), and
the debug session every run has holds its world weakly. Each case warms up (first runs
install patches, park threads, fill caches), then counts what the
collector finds after one more run with the collector off.
"""

from __future__ import annotations

import gc
from collections import Counter

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist._core import reuse


def _empty(ctx):
    return None


def _all_reduce(ctx):
    t = torch.ones(4)
    dist.all_reduce(t)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    return None


CASES = {
    "empty, 2 ranks": (_empty, {"world_size": 2}),
    "empty, 8 ranks": (_empty, {"world_size": 8}),
    "a layout": (_empty, {"layout": simdist.Layout(tp=2, dp=2)}),
    "concurrent": (_empty, {"world_size": 4, "schedule": "concurrent"}),
    "collectives": (_all_reduce, {"world_size": 4}),
    "without the sanitizer": (_all_reduce, {"world_size": 2, "check_async": False}),
    "cuda emulated": (_empty, {"world_size": 2, "cuda": "emulate"}),
}


@pytest.mark.parametrize("reused", [True, False], ids=["reuse on", "reuse off"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_run_leaves_no_cyclic_garbage(case: str, reused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With reuse off (SIMDIST_REUSE=0) every rank thread is new and ends with its run."""
    monkeypatch.setattr(reuse, "ENABLED", reused)
    fn, options = CASES[case]
    for _ in range(2):
        simdist.run(fn, **options)
    gc.collect()
    was = gc.get_debug()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept, to be named
    try:
        simdist.run(fn, **options)
        found = gc.collect()
        kinds = Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(was)
        gc.enable()
    assert found == 0, f"{found} objects in cycles: {kinds.most_common(10)}"
