"""A slice of PyTorch's own c10d suite (the wheel's distributed_test.py, gloo,
world 3) through simdist.torch_compat, in a child process: the module reads
its environment once at import, and this keeps it out of the suite's process.

The slice: tests of distinct kinds that pass natively (barrier, P2P, object
collectives, groups, DDP with no_sync and hooks). benchmarks/torch_tests.py
runs the whole file and compares with spawned gloo processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PASSING = [
    "test_barrier",
    "test_barrier_full_group",
    "test_send_recv",
    "test_send_recv_with_tag",
    "test_isend",
    "test_irecv",
    "test_batch_isend_irecv_gloo",
    "test_all_gather_object_default_pg",
    "test_scatter_object_list",
    "test_get_rank_size_group",
    "test_destroy_group",
    "test_get_future",
    "test_DistributedDataParallelCPU",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_static_graph_api_cpu",
    # every rank inside torch's profiler at once, counting gloo's events
    "test_all_reduce_sum",
    "test_all_reduce_coalesced_sum",
    "test_all_gather_coalesced_simple",
    "test_broadcast_full_group",
    "test_send_recv_autograd_profiler",
    "test_send_recv_any_source_torch_profiler",
    "test_isend_torch_profiler",
    # the timeout is waited out (1 s) before gloo's error: the test asserts the time passed
    "test_barrier_timeout_full_group",
    "test_barrier_timeout_global",  # needs INIT_METHOD=file://, as PyTorch's CI sets it
    "test_ddp_logging_data_cpu",  # backend_name and the gloo keys of a gloo group
    # rank 0 times out (2 s, waited out) before rank 2 arrives: rank 2 reports gloo's wrapped error
    "test_monitored_barrier_gloo",
]
# Skipped natively on a CPU-only machine too: the harness's own skip, read back.
SKIPPED = ["test_nccl_backend_bool_allreduce", "test_broadcast_cuda"]
# Needs one process per rank (docs/pytorch-tests.md, "What differs"): it names
# files by os.getpid() and counts one per rank; every simdist rank shares the pid.
NEEDS_PROCESSES = {"test_get_rank": "Expected 3 but got 1"}

CHILD = """
import json, sys, unittest
from simdist import torch_compat
torch_compat.install()
cls = torch_compat.distributed_test_class(world_size=3)
out = {}
for name in sys.argv[1:]:
    result = unittest.TestResult()
    cls(name).run(result)
    problems = result.errors + result.failures
    out[name] = "fail: " + problems[0][1][-2000:] if problems else ("skip" if result.skipped else "pass")
print("RESULTS " + json.dumps(out))
"""


def test_a_slice_of_pytorchs_c10d_suite(tmp_path) -> None:
    env = dict(os.environ, PYTORCH_PRINT_REPRO_ON_FAILURE="0", INIT_METHOD=f"file://{tmp_path / 'init'}")
    for name in ("BACKEND", "WORLD_SIZE", "TEMP_DIR"):  # (INIT_METHOD: set above)
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *PASSING, *SKIPPED, *NEEDS_PROCESSES],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(lines[-1][len("RESULTS ") :])
    assert {n: results[n] for n in PASSING} == dict.fromkeys(PASSING, "pass")
    assert {n: results[n] for n in SKIPPED} == dict.fromkeys(SKIPPED, "skip")
    for name, why in NEEDS_PROCESSES.items():
        assert results[name].startswith("fail") and why in results[name], results[name]
