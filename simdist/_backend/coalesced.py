"""The coalesced gather and scatter forms: one call per tensor pair, one Work for all.

(``all_reduce_coalesced`` is one op with its own completion, in the group itself.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from .._core.scheduler import Scheduler
from .shadow import modes_active, show
from .work import SimWork, all_of

# Type-checked as the ProcessGroup it is mixed into; at run time a plain class.
if TYPE_CHECKING:
    _Group = dist.ProcessGroup
else:
    _Group = object


class Coalesced(_Group):
    """``SimProcessGroup``'s coalesced forms, issued as the single calls they coalesce."""

    _scheduler: Scheduler
    _global_rank: int

    # Provided by the group (its single forms past the dispatch modes).
    def _all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        raise NotImplementedError

    def _reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> SimWork:
        raise NotImplementedError

    def all_gather_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        if modes_active():  # gloo's path: one coalesced op for all the pairs (CommDebugMode counts one)
            show(
                self,
                "allgather_into_tensor_coalesced",
                list(outputs),
                list(inputs),
                _or(opts, _c10d.AllgatherOptions),
            )
        works: list[dist.Work] = [self._all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return all_of(self._scheduler, self._global_rank, works, list(outputs))

    def allgather_into_tensor_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        return self.all_gather_single_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        if modes_active():  # gloo's path: one coalesced op for all the pairs (CommDebugMode counts one)
            show(
                self,
                "reduce_scatter_tensor_coalesced",
                list(outputs),
                list(inputs),
                _or(opts, _c10d.ReduceScatterOptions),
            )
        works: list[dist.Work] = [self._reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return all_of(self._scheduler, self._global_rank, works, list(outputs))

    def reduce_scatter_tensor_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts)


def _or(opts: Any, default: Callable[[], Any]) -> Any:
    return default() if opts is None else opts
