"""What a rank process leaves behind for the parent, and where (both sides read this)."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any

import torch


class RemoteTraceback(Exception):
    """Carries a rank's traceback text; set as ``__cause__`` of its exception.

    Printing the chained exception then shows where, in the rank's process,
    the error was raised.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n" + self.text


class RemoteError(Exception):
    """Stands in for a rank's exception that could not be pickled back."""


@dataclass(frozen=True)
class _Outcome:
    """What one rank left behind in its outcome file."""

    ok: bool
    value: Any = None  # the result when ok
    error: BaseException | None = None
    type_name: str = ""
    message: str = ""
    traceback_text: str = ""
    at: float = 0.0  # time.time() when the error was caught
    # A transport error (connection closed, backend timeout) after a peer had
    # already failed is a consequence of that failure, not a cause.
    is_transport_error: bool = False


def outcome_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"outcome-{rank}.pkl")


def dumps(obj: Any) -> bytes:
    """Pickle as ``torch.save`` does: tensors sharing a storage (a view and its
    base) still share one after loading, as in each rank's deep copy of
    ``simdist.run``'s arguments; plain pickle gives each its own storage."""
    buffer = io.BytesIO()
    torch.save(obj, buffer, pickle_protocol=5)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)
