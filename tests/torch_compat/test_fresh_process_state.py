"""What a spawned process changes dies with it: after each harness test
(``_join_processes``) the adapter forgets torch.compile's caches, as a fresh
process starts without them. Kept, four ranks' entries a test for the same
code reached dynamo's recompile limit in a later test (PyTorch's
test_dtensor_compile)."""

from __future__ import annotations

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from simdist import torch_compat


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_compiled_code_is_forgotten_after_a_harness_test() -> None:
    with torch_compat._as_in_a_child_process():
        torch.compile(_double, backend="eager")(torch.ones(2))
        assert len(_debug_get_cache_entry_list(_double.__code__)) == 1
    assert _debug_get_cache_entry_list(_double.__code__) == []
