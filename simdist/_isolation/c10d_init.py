"""A rank's default group: ``init_process_group``'s effects, from arguments
prepared once per run (docs/internals.md, "Reuse between runs").

c10d's full path per rank costs about as much as the rest of an empty rank's
life and builds each rank its own world rank map (O(world^2) per run).
``init_rank`` does what that path does for simdist's own world (the same
group constructor, name, store prefix, description, registrations and module
globals, with the run's one shared rank map), the per-run work done once by
``Prepared``. Left out on purpose: ``sys.excepthook`` is not wrapped once
more per rank (a process has one hook), and c10d's timing counter does not
count. Used only on a torch it was checked against (``TESTED``), with reuse
on (``_core.reuse``) and ``TORCH_DIST_INIT_BARRIER`` not 1; otherwise every
rank takes the full path. ``tests/isolation/test_reuse_invisible.py``
compares every field of the c10d state the two paths leave.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .._core import reuse

__all__ = ["TESTED", "Prepared"]

# The torch releases (major, minor) whose init_process_group this mirrors.
TESTED = frozenset({(2, 13)})


def _torch_tested() -> bool:
    parts = torch.__version__.split(".")
    try:
        return (int(parts[0]), int(parts[1])) in TESTED
    except (IndexError, ValueError):
        return False


class Prepared:
    """What ``init_process_group`` derives from its arguments, once for a run."""

    def __init__(self, backend: str, world_size: int, store: Any, timeout: timedelta, rank_map: dict) -> None:
        self.world_size = world_size
        self.store = store
        self.timeout = timeout
        self.rank_map = rank_map
        self.fast = reuse.enabled() and _torch_tested() and c10d._is_barrier_after_init() != 1
        if not self.fast:
            self.backend: Any = backend
            return
        self.backend = c10d.Backend(backend)
        c10d._check_valid_timeout(timeout)
        c10d.set_pytorch_distributed_envs_from_justknobs()
        if "torch._dynamo" in sys.modules:  # init_process_group clears these every call
            torch._dynamo.trace_rules.clear_lru_cache()

    def init_rank(self, rank: int) -> None:
        """This rank thread's ``init_process_group(backend, rank=rank, ...)``."""
        if not self.fast:
            dist.init_process_group(
                self.backend, rank=rank, world_size=self.world_size, store=self.store, timeout=self.timeout
            )
            # c10d built this rank its own {i: i} map of the world (250 KiB at
            # 4096 ranks, one per rank); it only reads it: share the run's one.
            default, ranks = c10d._world.default_pg, c10d._world.pg_group_ranks
            if default is not None and len(ranks.get(default, ())) == self.world_size:
                ranks[default] = self.rank_map
            return
        if c10d.GroupMember.WORLD is not None:
            raise ValueError("trying to initialize the default process group twice!")
        c10d.logger.info("Using device: %s", None)
        name = c10d._process_group_name([], use_hashed_name=False)
        pg, _ = c10d._new_process_group_helper(
            self.world_size,
            rank,
            [],
            self.backend,
            self.store,  # (c10d prefixes "default_pg" only to a store it made itself)
            name,
            backend_options=None,
            timeout=self.timeout,
            device_id=None,
            group_desc="default_pg",
        )
        c10d._update_default_pg(pg)
        c10d._world.pg_group_ranks[pg] = self.rank_map
        c10d._backend = c10d._world.pg_map[pg][0]
        c10d._default_pg_init_method = None
