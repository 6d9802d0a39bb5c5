"""Process-wide registries that are each rank's own, as each process's are.

torch.nn's global module hooks: a hook one rank registers never sees a peer's
modules, even when the ranks' forwards interleave at collectives (module
trackers such as CommDebugMode's ModTracker rely on it). c10d's backend
registry: a backend one rank registers is not yet available to a peer. After
the run the caller's hooks and registry are as they were."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.modules.module as nn_module
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode

import simdist

WORLD = 3


class Reducing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        dist.all_reduce(y)  # the ranks switch here, inside the module
        return y


def seen_program(ctx: simdist.RankContext) -> list[str]:
    model = Reducing()
    for m in model.modules():
        m.owner = ctx.rank  # type: ignore[assignment]
    seen: list[str] = []
    handle = nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: seen.append(f"{type(module).__name__}@{module.owner}")
    )
    model(torch.ones(1, 2))
    handle.remove()
    return seen


def test_a_ranks_global_hooks_see_only_its_own_modules() -> None:
    before = dict(nn_module._global_forward_pre_hooks)
    results = simdist.run(seen_program, world_size=WORLD, timeout=60)
    for rank, seen in enumerate(results):
        assert seen == [f"Reducing@{rank}", f"Linear@{rank}"]
    assert dict(nn_module._global_forward_pre_hooks) == before


def comm_mode_program(ctx: simdist.RankContext) -> int:
    model = Reducing()
    with CommDebugMode() as mode:
        model(torch.ones(1, 2))
    return mode.get_total_counts()


def test_comm_debug_mode_tracks_modules_in_every_rank() -> None:
    # a shared hook table failed here with "The Module hierarchy tracking is wrong"
    assert simdist.run(comm_mode_program, world_size=WORLD, timeout=60) == [1] * WORLD


def leaves_a_hook(ctx: simdist.RankContext) -> None:
    nn.modules.module.register_module_forward_hook(lambda *a: None)


def test_hooks_a_rank_leaves_registered_do_not_reach_the_caller() -> None:
    before = len(nn_module._global_forward_hooks)
    simdist.run(leaves_a_hook, world_size=WORLD, timeout=60)
    assert len(nn_module._global_forward_hooks) == before


def _dummy_backend(store: object, rank: int, size: int, timeout: object) -> None:
    raise AssertionError("never built")


def registers_a_backend(ctx: simdist.RankContext) -> list[bool]:
    before = dist.is_backend_available("simdist_test_dummy")
    dist.barrier()  # every rank asks before any registers
    dist.Backend.register_backend("simdist_test_dummy", _dummy_backend)
    after = dist.is_backend_available("simdist_test_dummy")
    dist.barrier()
    return [before, after]


def test_a_backend_a_rank_registers_is_that_ranks_own() -> None:
    assert simdist.run(registers_a_backend, world_size=WORLD, timeout=60) == [[False, True]] * WORLD
    # and the caller's registry is as it was
    assert not dist.is_backend_available("simdist_test_dummy")
    assert "simdist_test_dummy" not in dist.Backend.backend_list
