"""PyTorch's harnesses on simdist: what the native harness would report,
read back the same way (passes, skips, every failing rank's traceback),
and simdist's own verdicts raised as they are."""

from __future__ import annotations

import unittest
from collections.abc import Iterator

import pytest
import torch
import torch_harness_cases as cases

import simdist
from simdist import torch_compat
from simdist._backend import timeouts


@pytest.fixture
def native() -> Iterator[None]:
    """torch's own launchers, whatever an earlier test of this process installed."""
    was = torch_compat.installed()
    torch_compat.uninstall()
    yield
    if was:
        torch_compat.install()


def outcome(case: type[unittest.TestCase], name: str) -> unittest.TestResult:
    result = unittest.TestResult()
    case(name).run(result)
    return result


def error_text(result: unittest.TestResult) -> str:
    problems = result.errors + result.failures
    assert len(problems) == 1, problems
    return problems[0][1]


def passed(result: unittest.TestResult) -> bool:
    return result.wasSuccessful() and not result.skipped and result.testsRun == 1


@pytest.mark.parametrize("name", ["test_all_reduce", "test_destroys_and_reinitialises"])
def test_process_cases_pass(compat: None, name: str) -> None:
    assert passed(outcome(cases.ProcessCases, name))


def test_process_skip_read_back_as_the_harness_does(compat: None) -> None:
    result = outcome(cases.ProcessCases, "test_skips_on_every_rank")
    assert len(result.skipped) == 1 and result.wasSuccessful()


def test_process_rank_failure_reported_with_its_traceback(compat: None) -> None:
    text = error_text(outcome(cases.ProcessCases, "test_rank_one_fails"))
    assert "Process 1 exited with error code 10" in text
    assert "rank one's own mistake" in text
    assert "Process 0 exited" not in text and "Process 2 exited" not in text


def test_process_deadlock_is_simdists_own_verdict(compat: None) -> None:
    text = error_text(outcome(cases.ProcessCases, "test_rank_two_skips_its_collective"))
    assert text.splitlines()[-1].startswith("simdist.errors.DeadlockError") or "DeadlockError" in text
    assert "still missing rank(s) [2]" in text


def test_thread_cases(compat: None) -> None:
    assert passed(outcome(cases.ThreadCases, "test_all_gather"))
    skipped = outcome(cases.ThreadCases, "test_skips")
    assert len(skipped.skipped) == 1 and skipped.wasSuccessful()
    text = error_text(outcome(cases.ThreadCases, "test_rank_three_fails"))
    assert "Thread 3 exited with exception" in text and "rank three's own mistake" in text
    assert "Thread 0 exited" not in text


def test_spawn_threads_and_init_comms(compat: None) -> None:
    decorated = cases.decorated_cases()
    assert passed(outcome(decorated, "test_broadcast"))
    text = error_text(outcome(decorated, "test_rank_zero_fails"))
    assert "Thread 0 exited with exception" in text and "rank zero's own mistake" in text


@pytest.mark.parametrize("adapter", ["simdist", "native"])
def test_peers_waiting_on_a_failed_rank_report_the_failure_not_a_deadlock(adapter: str) -> None:
    """The threaded PG wakes the peers of a rank that raised; the harness then
    reports the rank's own error. simdist releases them the same way (a
    DeadlockError is for worlds where no rank failed)."""
    was = torch_compat.installed()
    (torch_compat.install if adapter == "simdist" else torch_compat.uninstall)()
    try:
        text = error_text(outcome(cases.ThreadCases, "test_rank_one_fails_while_the_others_wait_for_it"))
        assert "Thread 1 exited with exception" in text and "rank one fails between two all_gathers" in text
        assert "DeadlockError" not in text and "Thread 0 exited" not in text
        decorated = cases.decorated_cases()
        text = error_text(outcome(decorated, "test_every_rank_but_zero_fails_while_zero_waits"))
        assert "Mimic real test failure." in text and "DeadlockError" not in text
        # Which failing threads the native harness lists depends on thread timing.
        assert any(f"Thread {rank} exited with exception" in text for rank in (1, 2, 3))
    finally:
        (torch_compat.install if was else torch_compat.uninstall)()


def test_dtensor_with_comms(compat: None) -> None:
    assert passed(outcome(cases.DTensorCases, "test_redistribute_shard_to_replicate"))


def test_runs_on_simdist_ranks(compat: None) -> None:
    """The adapter's ranks are simdist's: a run's observers see the test's collectives."""
    with simdist.CommStats() as stats:
        assert passed(outcome(cases.ProcessCases, "test_all_reduce"))
    assert stats.count(op="all_reduce").calls == 3  # one per rank


def test_threaded_cases_pass_natively_too(native: None) -> None:
    """The cases are right as written: torch's own threaded harness passes them."""
    assert not torch_compat.installed()
    assert passed(outcome(cases.ThreadCases, "test_all_gather"))
    text = error_text(outcome(cases.ThreadCases, "test_rank_three_fails"))
    assert "Thread 3 exited with exception" in text


def test_uninstall_puts_the_harnesses_back(native: None) -> None:
    mp = torch_compat.harness.MultiProcessTestCase
    mt = torch_compat.harness.MultiThreadedTestCase
    before = (vars(mp)["_spawn_processes"], vars(mp)["_join_processes"], vars(mt)["_join_threads"])
    assert timeouts.waited_out_up_to_s == 0  # outside the adapter: every timeout at once
    torch_compat.install()
    torch_compat.install()  # twice: still one install
    assert vars(mp)["_join_processes"] is not before[1]
    assert timeouts.waited_out_up_to_s == timeouts.REAL_TIME_UP_TO_S  # PyTorch's tests time them
    torch_compat.uninstall()
    after = (vars(mp)["_spawn_processes"], vars(mp)["_join_processes"], vars(mt)["_join_threads"])
    assert after == before
    assert timeouts.waited_out_up_to_s == 0
    assert not torch_compat.installed()


def test_unknown_torch_release_refused(native: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.99.0+cpu")
    monkeypatch.delenv("SIMDIST_TORCH_COMPAT_ANY", raising=False)
    with pytest.raises(
        torch_compat.TorchCompatError, match=r"not torch 2\.99\.0\+cpu.*SIMDIST_TORCH_COMPAT_ANY=1"
    ):
        torch_compat.install()
    assert not torch_compat.installed()
    with pytest.raises(torch_compat.TorchCompatError):
        torch_compat.harness.MultiProcessTestCase  # noqa: B018
    monkeypatch.setenv("SIMDIST_TORCH_COMPAT_ANY", "1")
    torch_compat.check_torch_version()  # the user asked to try
