"""Replays every scenario of ``fixtures/hang_scenarios.py``.

Each one must end with its specific error (not a timeout, unless the scenario is
the watchdog's), a message that names what hung and where, no rank thread left
behind, torch.distributed untouched in the main thread, and a working next run.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import Layout


def _load_catalogue() -> ModuleType:
    # By path: fixtures/ is not a package on sys.path under every pytest launcher.
    path = Path(__file__).resolve().parents[2] / "fixtures" / "hang_scenarios.py"
    spec = importlib.util.spec_from_file_location("hang_scenarios", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("hang_scenarios", module)
    spec.loader.exec_module(module)
    return module


catalogue = _load_catalogue()


def rank_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("simdist-")]


def healthy_body(ctx: simdist.RankContext) -> list[float]:
    t = torch.tensor([float(ctx.rank), 1.0])
    dist.all_reduce(t, group=ctx.groups.dp)
    return t.tolist()


def assert_next_run_works() -> None:
    layout = Layout(tp=2, dp=2)
    results = simdist.run(healthy_body, layout=layout, timeout=catalogue.TIMEOUT)
    for rank, got in enumerate(results):
        members = layout.group_of("dp", rank)
        assert got == [float(sum(members)), float(len(members))]


def test_catalogue_covers_the_issue_list() -> None:
    expected = {
        "pp_stage_skips_collective",
        "send_without_recv",
        "recv_without_send",
        "rank_returns_early_in_dp_all_reduce",
        "collectives_in_different_order",
        "shape_mismatch",
        "dtype_mismatch",
        "op_mismatch",
        "reduce_op_mismatch",
        "crash_in_autograd_backward",
        "rank_stuck_in_compute",
    }
    assert expected <= set(catalogue.BY_NAME)
    assert len(catalogue.BY_NAME) == len(catalogue.SCENARIOS), "scenario names must be unique"


@pytest.mark.parametrize("scenario", catalogue.SCENARIOS, ids=lambda s: s.name)
def test_scenario_ends_with_its_specific_error(scenario: Any) -> None:
    assert rank_threads() == []
    with pytest.raises(simdist.SimulationError) as info:
        simdist.run(scenario.body, **scenario.run_kwargs())
    err = info.value
    # Exact class: a DeadlockError reported as a generic RankError (or a
    # timeout) would mean the precise diagnosis was lost.
    assert type(err) is scenario.error, f"{type(err).__name__}: {err}"
    message = str(err)
    for needle in scenario.contains:
        assert needle in message, f"{needle!r} missing from:\n{message}"
    assert "last calls per rank (flight recorder):" in message
    if scenario.cause is not None:
        assert isinstance(err.__cause__, scenario.cause)
    if scenario.failed_ranks is not None:
        assert isinstance(err, simdist.RankError)
        assert sorted(err.failures) == list(scenario.failed_ranks)
        assert set(err.released).isdisjoint(err.failures)
    # Nothing left running, nothing left initialised in this thread.
    assert rank_threads() == []
    assert not dist.is_initialized()
    assert_next_run_works()
    assert rank_threads() == []
