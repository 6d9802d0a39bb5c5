"""What a simulated communicator does not have: c10d calls simdist refuses.

Each refusal is noted world-wide (``_refused``), so a body that catches the
error and falls back still fails the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..errors import UnsupportedOperationError
from .current import _refused

if TYPE_CHECKING:
    from .work import SimWork

# Type-checked as the ProcessGroup it is mixed into; at run time a plain class.
if TYPE_CHECKING:
    _Group = dist.ProcessGroup
else:
    _Group = object


class Refusals(_Group):
    """``SimProcessGroup``'s refused calls."""

    def recv_anysource(self, tensors: Sequence[torch.Tensor], tag: int = 0) -> SimWork:
        raise _refused(
            UnsupportedOperationError(
                "recv without src (any source) is not supported by simdist: its match would "
                "depend on thread timing; pass src="
            )
        )

    def monitored_barrier(self, *args: Any, **kwargs: Any) -> None:
        raise _refused(
            UnsupportedOperationError("monitored_barrier is not supported by simdist; use barrier()")
        )

    def _start_coalescing(self, device: Any) -> None:
        raise _refused(UnsupportedOperationError("coalescing managers are not supported by simdist"))
