"""The flat-buffer collectives and their coalesced forms.

``all_gather_into_tensor``, ``reduce_scatter_tensor`` and
``all_to_all_single`` take one tensor a rank, split in blocks; their
coalesced forms are one call per tensor pair, one Work for all.
(``all_reduce_coalesced`` is one op with its own completion, in the group itself.)
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .._core.scheduler import Scheduler
from .._isolation import profiler as _profiler
from . import kernels as K
from .group import MixinBase
from .ops import IN, IN_SPLITS, OPS, OUT, OUT_FLAT, OUT_SPLITS, OpSpec
from .profiled import as_one_call
from .shadow import show
from .validation import group_sized, same_dtype, shape
from .work import SimWork, all_of


class Coalesced(MixinBase):
    """``SimProcessGroup``'s flat-buffer collectives, and their coalesced forms
    issued as the single calls they coalesce."""

    _scheduler: Scheduler
    _global_rank: int

    if TYPE_CHECKING:  # provided by the group

        def _collective(
            self,
            spec: OpSpec,
            fingerprint: tuple[tuple[str, Any], ...],
            payload: dict[str, Any],
            result: list[torch.Tensor],
            red: str = "SUM",
            root: int = 0,
            opts: Any = None,
        ) -> SimWork: ...

        def _reduce_op(self, opts: Any, dtype: torch.dtype, op: str) -> str: ...

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        show(self, "all_gather_single", output, input, opts)
        return self._all_gather_single(output, input, opts)

    def _all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        """``all_gather_single`` past the modes (a coalesced call shows them one op for all)."""
        same_dtype("all_gather_into_tensor", "output_tensor", output, "input_tensor", input)
        group_sized("all_gather_into_tensor", "output_tensor", output, "input", input, self.size())
        out_flat = _flat_or_blocks(output, "all_gather_into_tensor", "output_tensor", self.size())
        fp = (("shape", shape(input)), ("dtype", input.dtype))
        payload = {IN: input, OUT_FLAT: out_flat}
        return self._collective(OPS["all_gather_into_tensor"], fp, payload, [output], opts=opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        show(self, "reduce_scatter_single", output, input, opts)
        return self._reduce_scatter_single(output, input, opts)

    def _reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> SimWork:
        """``reduce_scatter_single`` past the modes (a coalesced call shows them one op for all)."""
        same_dtype("reduce_scatter_tensor", "output", output, "input", input)
        group_sized("reduce_scatter_tensor", "input", input, "output", output, self.size())
        red = self._reduce_op(opts, output.dtype, "reduce_scatter_tensor")
        in_flat = input if K.dense(input) else K.flat(input, "reduce_scatter_tensor input")
        out_flat = (
            output.view(-1) if output.is_contiguous() else _dense(output, "reduce_scatter_tensor output")
        )
        fp = (("shape", shape(output)), ("dtype", output.dtype), ("reduce_op", red))
        payload = {IN: in_flat, OUT: out_flat}
        return self._collective(OPS["reduce_scatter_tensor"], fp, payload, [output], red, opts=opts)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> SimWork:
        show(
            self, "all_to_all_single", output, input, list(output_split_sizes), list(input_split_sizes), opts
        )
        n = self.size()
        K.require_dense(output, "all_to_all_single", "output")
        K.require_dense(input, "all_to_all_single", "input")
        out_splits = K.check_splits(
            output_split_sizes,
            output.shape[0] if output.dim() else 0,
            n,
            "all_to_all_single output_split_sizes",
        )
        in_splits = K.check_splits(
            input_split_sizes, input.shape[0] if input.dim() else 0, n, "all_to_all_single input_split_sizes"
        )
        if output.shape[1:] != input.shape[1:]:
            raise ValueError(
                f"all_to_all_single: output and input must agree beyond dim 0, got "
                f"{list(output.shape)} and {list(input.shape)}"
            )
        fp = (("row_shape", shape(input)[1:]), ("dtype", input.dtype))
        payload = {OUT: output, IN: input, OUT_SPLITS: out_splits, IN_SPLITS: in_splits}
        return self._collective(OPS["all_to_all_single"], fp, payload, [output], opts=opts)

    def allgather_coalesced(
        self,
        output_lists: Sequence[Sequence[torch.Tensor]],
        inputs: Sequence[torch.Tensor],
        opts: Any = None,
    ) -> SimWork:
        """``all_gather_coalesced`` (deprecated in torch): ``output_lists[r][i]``
        receives input ``i`` of group rank ``r``, as gloo fills it. One
        all_gather per input, waited for as one call."""
        n = self.size()
        if len(output_lists) != n:
            raise ValueError(
                f"all_gather_coalesced: output_tensor_lists has {len(output_lists)} lists, "
                f"expected group size {n}"
            )
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise ValueError(
                    f"all_gather_coalesced: output_tensor_lists[{r}] has {len(outs)} tensors, "
                    f"expected one per input tensor ({len(inputs)})"
                )
        with as_one_call(self, "all_gather", inputs, perf_counter_ns() if _profiler.active else 0):
            works: list[dist.Work] = [
                self.allgather([[outs[i] for outs in output_lists]], [t], opts) for i, t in enumerate(inputs)
            ]
        return all_of(self._scheduler, self._global_rank, works, [t for outs in output_lists for t in outs])

    def all_gather_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        # gloo's path: one coalesced op for all the pairs (CommDebugMode counts one)
        show(self, "allgather_into_tensor_coalesced", list(outputs), list(inputs), opts)
        works: list[dist.Work] = [self._all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return all_of(self._scheduler, self._global_rank, works, list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]  # as before: the stub names the parameters otherwise

    def reduce_scatter_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        # gloo's path: one coalesced op for all the pairs (CommDebugMode counts one)
        show(self, "reduce_scatter_tensor_coalesced", list(outputs), list(inputs), opts)
        works: list[dist.Work] = [self._reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return all_of(self._scheduler, self._global_rank, works, list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]  # as before: the stub names the parameters otherwise


def _dense(t: torch.Tensor, what: str) -> torch.Tensor:
    """A channels-last tensor as it is (gloo and NCCL take one); else ``flat``'s refusal."""
    if not K.dense(t):
        K.flat(t, what)
    return t


def _flat_or_blocks(output: torch.Tensor, op: str, what: str, size: int) -> torch.Tensor:
    """A contiguous output as a flat view; a channels-last one as it is, its
    slots being blocks of dim 0 (refused when dim 0 does not split so)."""
    if output.is_contiguous():
        return output.view(-1)
    _dense(output, f"{op} {what}")
    if output.shape[0] % size:
        raise ValueError(
            f"{op}: a channels-last {what} must split into {size} slots along dim 0, got shape {list(output.shape)}"
        )
    return output
