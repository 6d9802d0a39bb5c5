"""The sanitizer with CUDA streams: on a GPU (``pytest -m gpu``) and on simdist's emulated devices.

A collective issued on a side stream and read on the compute stream before its
Work is waited is the same race as on the CPU: refused. Waiting (and making
the compute stream wait for the side stream, as on a real GPU) ends it. With
``TORCH_CUDA_SANITIZER=1`` PyTorch's own stream sanitizer runs beside it; a
child process checks that the two compose: simdist's error is the one raised
for the racy form, and the fixed form runs clean under both.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

ON_A_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
# Where the program's streams and tensors live: a GPU alone, a GPU with
# PyTorch's own stream sanitizer, or simdist's emulated devices (anywhere).
WHERE = [
    pytest.param("gpu", marks=ON_A_GPU, id="alone"),
    pytest.param("csan", marks=ON_A_GPU, id="with TORCH_CUDA_SANITIZER"),
    pytest.param("emulated", id="emulated CUDA"),
]

PROGRAM = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    import simdist

    def body(ctx, fixed):
        side = torch.cuda.Stream()
        t = torch.full((1024,), float(ctx.rank + 1), device=ctx.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            work = dist.all_reduce(t, async_op=True)
        if fixed:
            work.wait()
            torch.cuda.current_stream().wait_stream(side)
        total = t.sum()  # on the compute stream
        work.wait()
        torch.cuda.current_stream().wait_stream(side)
        return float(total)

    fixed = sys.argv[1] == "fixed"
    emulate = {"cuda": "emulate"} if sys.argv[2] == "emulated" else {}
    try:
        print("RESULT", simdist.run(body, world_size=2, device="cuda", args=(fixed,), **emulate))
    except simdist.RankError as err:
        print("ERROR", type(err.__cause__).__name__, err.__cause__)
    """
)


def _run(mode: str, where: str) -> str:
    env = dict(os.environ)
    if where == "csan":
        env["TORCH_CUDA_SANITIZER"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode, where], capture_output=True, text=True, timeout=300, env=env
    )
    return done.stdout + done.stderr


@pytest.mark.parametrize("where", WHERE)
def test_a_side_stream_collective_read_on_the_compute_stream_before_its_wait(where: str) -> None:
    racy = _run("racy", where)
    assert "ERROR AsyncRaceError" in racy, racy
    assert "all_reduce on group world [0, 1] seq 0" in racy, racy


@pytest.mark.parametrize("where", WHERE)
def test_with_the_wait_and_the_stream_dependency_it_runs_clean(where: str) -> None:
    fixed = _run("fixed", where)
    assert "RESULT [3072.0, 3072.0]" in fixed, fixed
    assert "CSAN detected a possible data race" not in fixed, fixed
