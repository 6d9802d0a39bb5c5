"""What the adapter adds to a harness test beyond the test's own work, pinned
by what it must not do: start the harness's event-listener thread in every
rank, format a stack for every seed a rank sets on a device type the process
has none of, decode the whole environment to put it back, or leave entries
in torch's lazy-initialisation queues behind. Each is checked against what
the native harness does (the same seed, the same environment afterwards)."""

from __future__ import annotations

import os
import threading
import traceback
import unittest
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch_harness_cases as cases

import simdist
from simdist import torch_compat

DEVICE_MODULES = (torch.cuda, torch.xpu, torch.mtia)


def run_case(case: type[unittest.TestCase], name: str) -> unittest.TestResult:
    result = unittest.TestResult()
    case(name).run(result)
    assert result.wasSuccessful() and not result.skipped, result.errors + result.failures
    return result


class FormattedStacks:
    """``traceback.format_stack`` calls, in the test's own thread and elsewhere (rank threads)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.here = 0
        self.elsewhere = 0
        real = traceback.format_stack
        main = threading.current_thread()

        def counting(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is main:
                self.here += 1
            else:
                self.elsewhere += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(traceback, "format_stack", counting)


def lazily_seeded_devices() -> int:
    """Device modules whose manual_seed_all still queues a seed (with its
    stack) because the device exists but is not initialised yet."""
    return sum(m.is_available() and not m.is_initialized() for m in DEVICE_MODULES)


def test_a_harness_rank_starts_no_event_listener_thread(
    compat: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_case(cases.ProcessCases, "test_all_reduce")  # the rank threads' pool is warm now
    started: list[Callable[..., Any] | None] = []
    real = threading.Thread.start

    def counting(self: threading.Thread) -> None:
        started.append(getattr(self, "_target", None))
        real(self)

    monkeypatch.setattr(threading.Thread, "start", counting)
    run_case(cases.ProcessCases, "test_all_reduce")
    run_case(cases.DTensorCases, "test_redistribute_shard_to_replicate")
    # simdist's own rank threads (a cold pool starts them from its spawner) aside, none
    theirs = [t for t in started if not getattr(t, "__module__", "").startswith("simdist._core")]
    assert theirs == []


def test_the_harness_sees_the_real_threading_otherwise_and_uninstall_puts_all_back(compat: None) -> None:
    common = torch_compat.harness.common
    torch_compat.uninstall()
    seeding = [m.manual_seed_all for m in DEVICE_MODULES]
    torch_compat.install()
    assert all(m.manual_seed_all is not theirs for m, theirs in zip(DEVICE_MODULES, seeding))
    assert common.threading.local is threading.local and common.threading.Lock is threading.Lock
    thread = common.threading.Thread(target=lambda: None, daemon=True)
    assert type(thread) is threading.Thread
    thread.start()
    thread.join()
    torch_compat.uninstall()
    assert common.threading is threading
    assert all(m.manual_seed_all is theirs for m, theirs in zip(DEVICE_MODULES, seeding))


def test_harness_ranks_are_seeded_as_processes_without_formatting_stacks(
    compat: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_case(cases.ProcessCases, "test_all_reduce")
    stacks = FormattedStacks(monkeypatch)
    # Each rank draws what a generator seeded with the harness's SEED draws.
    run_case(cases.ProcessCases, "test_seeded_by_the_harness")
    assert stacks.elsewhere == 3 * lazily_seeded_devices()  # 3 ranks; 0 on a machine without devices


def test_a_rank_seeding_gets_torchs_generator_state_and_the_caller_keeps_torchs_seeding(
    compat: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    stacks = FormattedStacks(monkeypatch)

    def body(ctx: simdist.RankContext) -> torch.Tensor:
        torch.manual_seed(1234 + ctx.rank)
        torch.seed()  # reseeds every device too
        torch.manual_seed(1234 + ctx.rank)
        return torch.rand(4)

    drawn = simdist.run(body, world_size=2)
    for rank, values in enumerate(drawn):
        assert torch.equal(values, torch.rand(4, generator=torch.Generator().manual_seed(1234 + rank)))
    assert stacks.elsewhere == 2 * 3 * lazily_seeded_devices()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)  # outside ranks: torch's own, stack and all
    assert stacks.here == len(DEVICE_MODULES)


def test_a_rank_seed_torch_would_refuse_is_refused(compat: None) -> None:
    def body(ctx: simdist.RankContext) -> None:
        torch.cuda.manual_seed_all("not a seed")  # type: ignore[arg-type]

    with pytest.raises(simdist.RankError) as info:
        simdist.run(body, world_size=2)
    assert isinstance(info.value.__cause__, ValueError)
    assert "invalid literal for int()" in str(info.value.__cause__)


def test_what_a_test_does_to_the_environment_dies_with_it(
    compat: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIMDIST_CASE_CHANGED", "caf\u00e9")  # not ASCII: stored encoded
    monkeypatch.setenv("SIMDIST_CASE_REMOVED", "here")
    monkeypatch.delenv("SIMDIST_CASE_ADDED", raising=False)
    before = dict(os.environ)
    run_case(cases.ProcessCases, "test_changes_its_environment")
    assert dict(os.environ) == before
    assert os.environ["SIMDIST_CASE_CHANGED"] == "caf\u00e9"
    assert "SIMDIST_CASE_ADDED" not in os.environ


def lazy_queues() -> list[int]:
    return [len(m._queued_calls) for m in DEVICE_MODULES] + [
        len([c for c in m._lazy_seed_tracker.get_calls() if c]) for m in DEVICE_MODULES
    ]


def test_repeated_harness_tests_leave_torchs_lazy_init_queues_as_they_were(compat: None) -> None:
    decorated = cases.decorated_cases()
    kinds = [
        (cases.ProcessCases, "test_all_reduce"),
        (cases.ProcessCases, "test_seeded_by_the_harness"),
        (cases.ThreadCases, "test_all_gather"),
        (cases.DTensorCases, "test_redistribute_shard_to_replicate"),
        (decorated, "test_broadcast"),
    ]
    for case, name in kinds:
        run_case(case, name)
    before = lazy_queues()
    for _ in range(3):
        for case, name in kinds:
            run_case(case, name)
    assert lazy_queues() == before
    assert not dist.is_initialized()
