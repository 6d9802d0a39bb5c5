"""DDP's logging data on a group asked for as gloo is what a real gloo group
gives: ``backend_name`` "gloo", the gloo keys c10d's logger adds (its
environment variables, its thread count), none of NCCL's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch
import torch.distributed as dist

import simdist

REAL_GLOO = textwrap.dedent(
    """
    import json
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    print("DATA " + json.dumps(model._get_ddp_logging_data()))
    """
)
# Vary by world, or name the module: not what this compares.
PER_WORLD = {"world_size", "rank"}


def _real_gloo(env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", REAL_GLOO], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("DATA ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("DATA ") :])


def _on_simdist(backend: str | None) -> list[dict]:
    def body(ctx: simdist.RankContext) -> dict:
        group = dist.new_group(backend=backend)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2), process_group=group)
        # What c10d's C++ side reads stays simdist's own (docs/differences.md, cpp-backend-name).
        assert group.getBackendName() == "simdist"
        return model._get_ddp_logging_data()

    return simdist.run(body, world_size=2)


def test_ddp_logging_data_of_a_gloo_group_is_gloos(monkeypatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # read from the environment, as gloo's logger does
    env = dict(os.environ)
    real = _real_gloo(env)
    assert real["backend_name"] == "gloo" and real["gloo_socket_ifname"] == "lo"  # the reference itself
    for data in _on_simdist("gloo"):
        assert {k: v for k, v in data.items() if k not in PER_WORLD} == {
            k: v for k, v in real.items() if k not in PER_WORLD
        }


def test_ddp_logging_data_of_simdists_own_group_names_simdist() -> None:
    for data in _on_simdist(None):  # simdist.run's world group: the program asked for nothing
        assert data["backend_name"] == "simdist"
        assert not [k for k in data if k.startswith(("gloo_", "nccl_"))]
