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


# The wrapper last built, with what it wraps: every run installs the patch
# again, and building the wrapper (``functools.wraps``) was most of the
# install. Matched by identity (whatever sits there may not be hashable).
_built: list[tuple[Any, Any, Callable[..., Any]]] = []


def _wrapper(original: Callable[..., Any], resync: Callable[[], None]) -> Callable[..., Any]:
    if _built and _built[0][0] is original and _built[0][1] is resync:
        return _built[0][2]

    @functools.wraps(original)
    def run_backward(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            resync()

    _built[:] = [(original, resync, run_backward)]
    return run_backward


def _install(resync: Callable[[], None]) -> None:
    original = torch.autograd.graph._engine_run_backward
    _original.append(original)
    run_backward = _wrapper(original, resync)
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
