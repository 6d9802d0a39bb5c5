"""How a call holds the rank's buffers: as autograd-blind aliases, with the
version-counter moves gloo makes."""

from __future__ import annotations

from typing import Any

import torch
from torch._C import _increment_version


def detached(payload: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Detached aliases of every tensor in a payload, and whether any of them
    is an inference tensor.

    A real backend writes results straight into the tensors' memory, unseen by
    autograd: a Parameter can be broadcast into and a non-leaf keeps its
    grad_fn. ``.data`` aliases share that memory but neither the autograd
    history nor the version counter (``detach()`` would share the counter);
    the counter moves only where gloo moves it (``OpSpec.version_bumps``).
    """
    out: dict[str, Any] = {}
    inference = False
    for key, value in payload.items():
        if isinstance(value, torch.Tensor):
            out[key] = value.data
            inference = inference or value.is_inference()
        elif isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            out[key] = [t.data for t in value]
            inference = inference or any(t.is_inference() for t in value)
        else:
            out[key] = value
    return out, inference


def bump(result: list[torch.Tensor], times: int) -> None:
    """Move the outputs' version counters as gloo's kernels do (they write
    some outputs through tensor copies autograd sees). Inference tensors have
    no counter and are skipped by torch."""
    for _ in range(times):
        _increment_version(result)
