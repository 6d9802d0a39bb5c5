"""pytest started by torchrun: this process is one rank of a real world.

The plugin joins that world once per session (``env://``), runs each marked
test's body as this rank, and uses a side gloo group to agree with the other
ranks on what was collected and on each test's outcome. A real backend has no
deadlock detector: a rank that fails while its peers wait in a collective
leaves them waiting until the process group's timeout (``--simdist-timeout``).
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

import pytest


class TorchrunWorld:
    def __init__(self, backend: str, timeout: float) -> None:
        import torch
        import torch.distributed as dist

        self.backend = backend
        self.owns_default_group = not dist.is_initialized()
        if self.owns_default_group:
            if backend == "nccl":
                import os

                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(
                backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout)
            )
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        # Outcomes and collection checks are Python objects: gloo carries them
        # whatever the tests' backend is.
        self.side_group = dist.new_group(backend="gloo")

    def check_same_collection(self, nodeids: list[str]) -> None:
        """Every rank must run the same marked tests in the same order, or the worlds would cross."""
        import torch.distributed as dist

        digest = hashlib.sha256("\n".join(nodeids).encode()).hexdigest()[:16]
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, (digest, len(nodeids)), group=self.side_group)
        if len({d for d, _ in everyone}) > 1:
            table = ", ".join(f"rank {r}: {n} tests ({d})" for r, (d, n) in enumerate(everyone))
            raise pytest.UsageError(
                "simdist under torchrun: the ranks collected different simdist tests ("
                f"{table}); start every rank with the same arguments and files"
            )

    def close(self) -> None:
        import torch.distributed as dist

        if self.owns_default_group and dist.is_initialized():
            dist.destroy_process_group()
