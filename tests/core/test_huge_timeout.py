"""A finite timeout is a valid timeout, however large (issue 28, point 15):
``timeout=1e10`` in ``run``, in the marker and as ``--simdist-timeout``
runs (it waits at most ``MAX_SECONDS``, longer than any test), where it
raised ``OverflowError: timestamp out of range`` from a wait."""

from __future__ import annotations

import pytest

import simdist

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("timeout", [1e10, 1e300, 1e9])
def test_run_takes_a_huge_finite_timeout(timeout: float) -> None:
    assert simdist.run(lambda ctx: ctx.rank, world_size=2, timeout=timeout) == [0, 1]


def test_a_huge_timeout_reads_as_the_longest_wait_and_others_are_kept() -> None:
    from simdist._checks import MAX_SECONDS, check_positive_seconds

    assert check_positive_seconds("timeout", 1e10) == MAX_SECONDS
    assert check_positive_seconds("timeout", 2.5) == 2.5
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds, got inf"):
        check_positive_seconds("timeout", float("inf"))


def test_the_marker_and_the_option_take_a_huge_finite_timeout(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch
        import torch.distributed as dist

        @pytest.mark.simdist(world_size=2, timeout=1e10)
        def test_marked(ctx):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == 2.0

        @pytest.mark.simdist(world_size=2)
        def test_session_timeout(ctx):
            dist.barrier()

        def test_fixture(simdist_run):
            assert simdist_run(lambda ctx: ctx.rank, world_size=2) == [0, 1]
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--simdist-timeout", "1e10")
    result.assert_outcomes(passed=3)
