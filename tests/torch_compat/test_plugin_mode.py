"""``pytest -p simdist.torch_compat`` on a test file written for PyTorch's
harnesses, unedited: its tests run as simdist ranks and pytest reports them
as the native harness would (pass, skip, every failing rank's traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

# A user's file, as it would be written against torch's own test bases.
USER_FILE = textwrap.dedent(
    """
    import os
    import unittest

    import torch
    import torch.distributed as dist
    from torch.testing._internal.common_distributed import MultiProcessTestCase


    class TestOnGloo(MultiProcessTestCase):
        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def _init(self):
            dist.init_process_group(
                "gloo", init_method=f"file://{self.file_name}", world_size=2, rank=self.rank
            )

        def test_sum(self):
            self._init()
            t = torch.ones(3) * (self.rank + 1)
            dist.all_reduce(t)
            self.assertEqual(t, torch.full((3,), 3.0))
            # every rank a thread of the one pytest process
            self.assertEqual(os.environ["SIMDIST_TEST_PID"], str(os.getpid()))

        def test_skip(self):
            raise unittest.SkipTest("later")

        def test_wrong(self):
            self._init()
            t = torch.ones(1)
            dist.all_reduce(t)
            self.assertEqual(t.item(), 2.0 if self.rank == 0 else 1.0)
    """
)


def test_pytest_plugin_runs_an_unedited_file(tmp_path: Path) -> None:
    (tmp_path / "test_user_file.py").write_text(USER_FILE)
    env = dict(os.environ, PYTORCH_PRINT_REPRO_ON_FAILURE="0")
    # The pid check: the test runs in the pytest process itself, not in spawned children.
    code = (
        "import os, sys, pytest; os.environ['SIMDIST_TEST_PID'] = str(os.getpid()); "
        "sys.exit(pytest.main(['-p', 'simdist.torch_compat', '-q', '-p', 'no:cacheprovider', "
        "'-rs', sys.argv[1]]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "test_user_file.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # test_wrong fails
    assert "1 failed, 1 passed, 1 skipped" in out, out
    # rank 0's assertion holds; rank 1's fails and is the one reported
    assert "Process 1 exited with error code 10" in out, out
    assert "Process 0 exited" not in out, out
