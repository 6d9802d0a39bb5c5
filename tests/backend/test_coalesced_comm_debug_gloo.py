"""Inside ``_coalescing_manager``, ``CommDebugMode`` sees on simdist what it
sees on gloo (issue 28, point 11): one coalesced op for several
``all_gather_into_tensor`` (sync or async) or ``reduce_scatter_tensor``
calls, where simdist showed one op per call. The reference is a real gloo
world running the same program; values are compared too."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager
from torch.distributed.tensor.debug import CommDebugMode

import simdist
from simdist.launch import run_processes

pytestmark = pytest.mark.gloo

WORLD = 2


def program(ctx: Any) -> dict[str, Any]:
    rank = dist.get_rank()
    seen: dict[str, Any] = {}
    for name in ("gather-sync", "gather-async", "reduce-scatter"):
        mode = CommDebugMode()
        values = []
        with mode:
            with _coalescing_manager(async_ops=name == "gather-async") as cm:
                for i in range(2):
                    if name.startswith("gather"):
                        out = torch.zeros(WORLD * 2)
                        dist.all_gather_into_tensor(
                            out, torch.full((2,), float(rank + i)), async_op=name == "gather-async"
                        )
                    else:
                        out = torch.zeros(2)
                        dist.reduce_scatter_tensor(
                            out, torch.arange(WORLD * 2, dtype=torch.float32) + rank + i
                        )
                    values.append(out)
            if name == "gather-async":
                cm.wait()
        counts = {str(op): n for op, n in mode.get_comm_counts().items()}
        seen[name] = (counts, [v.tolist() for v in values])
    return seen


def test_comm_debug_mode_counts_a_coalesced_block_as_gloo_does() -> None:
    gloo = run_processes(program, world_size=WORLD, timeout=120.0)
    sim = simdist.run(program, world_size=WORLD, timeout=120.0)
    assert sim == gloo
