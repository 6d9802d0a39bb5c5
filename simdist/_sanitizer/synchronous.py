"""Which calls c10d waits for before the program's next line: they never go in flight.

A race needs an operation of the rank between a call's issue and its wait. For
a synchronous call there is none: c10d's wrapper waits as soon as the backend
returns. Such calls are recognised so that they pay nothing (no entry, no
mode on the stack); anything not recognised is treated as asynchronous, so a
torch whose c10d changes shape costs time, never a missed race.

- A collective: c10d's wrappers set the options' ``asyncOp`` to their
  ``async_op`` argument and, when it is False, call ``work.wait()`` right after
  the backend returns (NCCL runs such a call on the current stream). Callers
  in C++ (DDP's reducer, the functional collectives) pass the default options,
  ``asyncOp=True``: in flight.
- A send or recv has no options: ``dist.send`` and ``dist.recv`` call
  ``isend``/``irecv`` and wait at once. They are recognised by their code
  among the c10d frames directly above the backend; ``isend`` from the
  program, ``batch_isend_irecv`` or a pipeline schedule are in flight.
"""

from __future__ import annotations

import inspect
from types import FrameType
from typing import Any

from torch.distributed import distributed_c10d as c10d


def collective(opts: Any) -> bool:
    """Whether a collective's options say c10d waits for it at once."""
    return opts is not None and getattr(opts, "asyncOp", True) is False


def _code(fn: Any) -> Any:
    return inspect.unwrap(fn).__code__


# The two synchronous P2P wrappers (compared by identity: hashing a code
# object hashes its contents), and the files of the c10d frames that may stand
# between them and the backend (the wrappers themselves, c10d's logger).
_SEND, _RECV = _code(c10d.send), _code(c10d.recv)
_C10D_FILES = frozenset({_code(c10d.isend).co_filename, c10d.send.__code__.co_filename})
_MAX_C10D_FRAMES = 4


def p2p(caller: FrameType | None) -> bool:
    """Whether the backend's send or recv, called from ``caller``, is inside
    ``dist.send``/``dist.recv``."""
    frame = caller
    for _ in range(_MAX_C10D_FRAMES):
        if frame is None:
            return False
        code = frame.f_code
        if code is _SEND or code is _RECV:
            return True
        if code.co_filename not in _C10D_FILES:
            return False
        frame = frame.f_back
    return False
