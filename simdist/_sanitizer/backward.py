"""Autograd restores a thread's dispatch modes as they were when backward began.

A collective issued inside backward (a gradient hook, DDP's reducer) puts the
mode on the stack, and the engine's per-node state guard takes it off again:
after backward the rank would run unchecked with its reductions in flight.
This patch (process-wide, through ``_isolation.patches``) puts the mode back
in step as ``backward()`` / ``autograd.grad()`` return.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.autograd
import torch.autograd.graph

from .._isolation import patches

_original: list[Any] = []
# The wrapper last built, by the function it wraps: every run installs the
# patch again, and building it (``functools.wraps``) is most of the install.
_built: dict[str, Any] = {}


def _install(resync: Callable[[], None]) -> None:
    original = torch.autograd.graph._engine_run_backward
    _original.append(original)
    if _built.get("original") is original and _built.get("resync") is resync:
        run_backward = _built["wrapper"]
    else:

        @functools.wraps(original)
        def run_backward(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                resync()

        _built.update(original=original, resync=resync, wrapper=run_backward)

    torch.autograd.graph._engine_run_backward = run_backward
    torch.autograd._engine_run_backward = run_backward  # its own import of it


def _uninstall() -> None:
    original = _original.pop()
    torch.autograd.graph._engine_run_backward = original
    torch.autograd._engine_run_backward = original  # its own import of it


def register(resync: Callable[[], None]) -> None:
    """Register the patch, calling ``resync`` as each backward returns (the
    package passes it in: this module imports nothing of the package)."""
    patches.register(
        "async sanitizer",
        functools.partial(_install, resync),
        _uninstall,
        [(torch.autograd.graph, "_engine_run_backward"), (torch.autograd, "_engine_run_backward")],
    )
