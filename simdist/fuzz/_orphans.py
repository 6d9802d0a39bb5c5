"""A campaign's processes end with the process that started them.

A supervisor killed outright (SIGKILL, an out-of-memory kill) runs none of
its stop path, and its workers would search on, unseen, to the end of their
budgets. On Linux each worker, and the worker server (``_zygote``), asks the
kernel to kill it when its parent dies (``PR_SET_PDEATHSIG``): a server's
workers then go with the server. Nobody reads their events any more, so
nothing is lost that a gentler stop would keep, and a kill needs no
cooperation (a SIGINT passed on by the server was tried first and did not
always stop its workers). Elsewhere
nothing is asked, and workers end at their budgets as before. (SIGTERM and
Ctrl-C reach the supervisor, whose stop path stops the workers and writes
the summary.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

__all__ = ["kill_when_parent_dies"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def kill_when_parent_dies(parent: int) -> bool:
    """Ask the kernel to SIGKILL this process when its parent (pid ``parent``)
    ends, and end now if it already has. False where the OS has no such request."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    # The parent may have died before the request: the kernel sends nothing then.
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return True
