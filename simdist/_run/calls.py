"""What the World does on every call: the backend's per-call hooks, read
through the run's options.

The hooks themselves (flight record, faults, fingerprint and call-site
comparison) live with the op semantics in ``simdist._backend.hooks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._backend.hooks import CallHooks as _BackendHooks
from .._backend.world_hooks import WorldHooks

if TYPE_CHECKING:
    from .options import RunOptions


class CallHooks(_BackendHooks, WorldHooks):
    """The per-call half of ``_backend.world_hooks.WorldHooks``."""

    options: RunOptions

    @property
    def strict_call_sites(self) -> bool:  # type: ignore[override]  # read from the options, over the backend's plain attribute
        return self.options.strict_call_sites
