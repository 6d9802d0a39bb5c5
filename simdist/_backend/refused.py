"""What a simulated communicator does not have: c10d calls simdist refuses.

Each refusal is noted world-wide (``_refused``), so a body that catches the
error and falls back still fails the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from ..errors import UnsupportedOperationError
from .current import _refused

if TYPE_CHECKING:
    pass

# Type-checked as the ProcessGroup it is mixed into; at run time a plain class.
if TYPE_CHECKING:
    _Group = dist.ProcessGroup
else:
    _Group = object


class Refusals(_Group):
    """``SimProcessGroup``'s refused calls."""

    def _start_coalescing(self, device: Any) -> None:
        raise _refused(UnsupportedOperationError("coalescing managers are not supported by simdist"))
