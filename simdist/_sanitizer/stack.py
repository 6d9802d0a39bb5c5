"""Putting the sanitizer's mode on this thread's dispatch-mode stack, and off.

The mode goes to the bottom of the stack: a user's mode entered with
``with`` pops whatever is on top when it exits, so the sanitizer's own must
never be the top one it finds. Below the others it also sees the ops they
finally run, not the ones they rewrite.
"""

from __future__ import annotations

from typing import Any

from torch._C import _get_dispatch_stack_at, _len_torch_dispatch_stack
from torch._C import _pop_torch_dispatch_stack as _pop
from torch._C import _push_on_torch_dispatch_stack as _push


def on_stack(mode: Any) -> bool:
    return any(_get_dispatch_stack_at(i) is mode for i in range(_len_torch_dispatch_stack()))


def push_bottom(mode: Any) -> None:
    above = []
    while _len_torch_dispatch_stack():
        above.append(_pop(None))
    _push(mode)
    for other in reversed(above):
        _push(other)


def remove(mode: Any) -> None:
    """Take ``mode`` off the stack wherever it is (a no-op when absent)."""
    above = []
    while _len_torch_dispatch_stack():
        top = _pop(None)
        if top is mode:
            break
        above.append(top)
    for other in reversed(above):
        _push(other)
