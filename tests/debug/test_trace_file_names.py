"""``--simdist-trace-on-failure DIR``: one trace file per failing test id,
named after the test (issue 28, point 13). Ids that read alike once made
safe for a file name (``[a/b]``, ``[a_b]``, ``[a b]``, ``[a:b]``) overwrote
each other's file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

IDS = ["a/b", "a_b", "a b", "a:b"]


def test_tests_whose_ids_read_alike_each_leave_their_own_trace(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_alike=f"""
        import pytest
        import torch
        import torch.distributed as dist
        import simdist

        @pytest.mark.parametrize("name", {IDS!r}, ids={IDS!r})
        def test_fails(name):
            def body(ctx):
                t = torch.ones(1)
                dist.all_reduce(t)
                assert ctx.rank == 0, name
            simdist.run(body, world_size=2, timeout=60)
        """
    )
    traces = tmp_path / "traces"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--simdist-trace-on-failure", str(traces)
    )
    result.assert_outcomes(failed=4)
    written = sorted(traces.glob("*.json"))
    assert len(written) == 4, [p.name for p in written]
    assert all(p.name.startswith("test_alike.py_test_fails_a") for p in written)  # says which test
    for path in written:
        assert json.loads(path.read_text())["traceEvents"]
