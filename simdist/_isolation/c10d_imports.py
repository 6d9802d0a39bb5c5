"""torch.distributed modules a rank imports first run against the process's c10d state.

Some of torch.distributed's modules read c10d's state when their code runs:
``torch.distributed.nn.functional`` (and ZeRO's ``_broadcast_object``,
``ShardedGradScaler``) default ``group=group.WORLD``, evaluated once, at
import. A spawned process usually imports them before ``init_process_group``
(the default is None: "the default group") or, lazily, after it (the default
is that process's own world group, which stays right for the process's life).
In simdist every rank shares the module: imported lazily inside a rank (DDP
imports ``torch.distributed.nn.functional`` on first use), the default would
be that rank's world group of that run, handed to every other rank and to
every later run ("... is not initialized in the world group map"). So while
c10d is routed, such a module's code runs with the thread's routing off: its
defaults see what the process has (normally no default group, so None), the
same in every rank and run.
"""

from __future__ import annotations

import sys
import types

from .._core.identity import me
from .import_chain import WrappingFinder, WrappingLoader

PREFIX = "torch.distributed."


class _Unrouted(WrappingLoader):
    def run(self, module: types.ModuleType) -> None:
        state, me.c10d = me.c10d, None
        try:
            self.loader.exec_module(module)
        finally:
            me.c10d = state


class _ProcessStateImports(WrappingFinder):
    wrapper = _Unrouted

    def wants(self, fullname: str) -> bool:
        return fullname.startswith(PREFIX) and me.c10d is not None


FINDER = _ProcessStateImports()


def install() -> None:
    if FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)


def uninstall() -> None:
    if FINDER in sys.meta_path:
        sys.meta_path.remove(FINDER)
