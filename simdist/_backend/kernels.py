"""The tensor arithmetic and tensor checks the ops table's completions and the
process group share (no threading)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch

from ..errors import CollectiveMismatchError
from ..reduction import ReductionModel


def reduce_into(
    model: ReductionModel, out: torch.Tensor, inputs: Sequence[torch.Tensor], op: str, key: str
) -> None:
    """Reduce ``inputs`` into ``out``; ``out`` may alias ``inputs[0]`` only, so
    any other aliasing goes through a temporary. Complex tensors reduce as
    their real views (SUM and AVG only: the reduce-op check refuses the rest),
    as gloo and NCCL do."""
    if out.is_complex():
        real = [torch.view_as_real(x) for x in inputs]
        reduce_into(model, torch.view_as_real(out), real, "SUM" if op == "AVG" else op, key)
        if op == "AVG":
            # gloo divides the complex tensor itself, which rounds differently
            # from dividing its real view (measured: 9/5 gives 1.8000000715 here,
            # 1.7999999523 on a float32 tensor).
            out.div_(len(inputs))
        return
    # An input after the first aliases ``out`` when both start at one address
    # (an empty tensor aliases nothing). A plain loop: this runs on every
    # reduction, and a generator costs more than the test itself.
    aliased = False
    if len(inputs) > 1:
        ptr = out.data_ptr()
        for x in inputs[1:]:
            if x.data_ptr() == ptr and out.numel() > 0:
                aliased = True
                break
    if aliased:
        tmp = torch.empty_like(out)
        model.reduce_into(tmp, inputs, op, key)
        out.copy_(tmp)
    else:
        model.reduce_into(out, inputs, op, key)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``, where ``src`` may be ``dst`` itself (an in-place
    collective: the input is this rank's slot of the output)."""
    if src.data_ptr() == dst.data_ptr() and src.stride() == dst.stride() and src.shape == dst.shape:
        return
    dst.copy_(src)


def dense(t: torch.Tensor) -> bool:
    """NCCL's test: contiguous in the tensor's own memory format (a channels-last
    image batch counts; a strided or transposed view does not)."""
    if t.is_contiguous():
        return True
    if t.dim() == 4:
        return t.is_contiguous(memory_format=torch.channels_last)
    if t.dim() == 5:
        return t.is_contiguous(memory_format=torch.channels_last_3d)
    return False


def require_dense(t: torch.Tensor, op: str, what: str) -> None:
    """Refuse a non-contiguous tensor where a real backend cannot take one:
    gloo treats its memory as contiguous (it writes outside the view and leaves
    the view's elements wrong, silently), NCCL refuses it."""
    if not dense(t):
        raise ValueError(
            f"{op}: {what} must be contiguous, got shape {list(t.shape)} with strides {t.stride()} "
            f"(NCCL refuses it: 'Tensors must be contiguous'; gloo would read and write its memory as if "
            f"it were contiguous, outside the view); pass x.contiguous() and copy the result back"
        )


def require_dense_p2p(t: torch.Tensor, op: str) -> None:
    if not dense(t):
        raise ValueError(
            f"{op}: tensor must be contiguous, got shape {list(t.shape)} with strides {t.stride()} "
            f"(gloo refuses it: 'input tensor has to be contiguous', and the peer then waits forever; "
            f"NCCL sends its memory as it lies, so both ends would need the same layout); pass "
            f"x.contiguous() (and copy a received result back)"
        )


def flat(t: torch.Tensor, what: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous, got a tensor with strides {t.stride()}")
    return t.view(-1)


def logical_flat(t: torch.Tensor, what: str) -> torch.Tensor:
    """``t``'s elements in logical order, for reading: a view when contiguous,
    a copy of a channels-last tensor (gloo reads one so); a strided view is refused."""
    if t.is_contiguous():
        return t.view(-1)
    if not dense(t):
        flat(t, what)  # its refusal, in its words
    return t.reshape(-1)


def even_splits(total: int, n: int, what: str) -> list[int]:
    if total % n:
        raise ValueError(f"{what}: dim 0 size {total} is not divisible by the group size {n}")
    return [total // n] * n


def check_splits(splits: Sequence[int], total: int, n: int, what: str) -> list[int]:
    if not splits:
        return even_splits(total, n, what)
    splits = list(splits)
    if len(splits) != n:
        raise ValueError(f"{what} has {len(splits)} entries, expected the group size {n}")
    if any(s < 0 for s in splits) or sum(splits) != total:
        raise ValueError(f"{what} {splits} must be non-negative and sum to dim 0 size {total}")
    return splits


def all_to_all_single(
    outs: Sequence[torch.Tensor],
    ins: Sequence[torch.Tensor],
    out_splits: Sequence[list[int]],
    in_splits: Sequence[list[int]],
    ranks: Sequence[int],
) -> None:
    n = len(outs)
    for i in range(n):
        for j in range(n):
            if in_splits[i][j] != out_splits[j][i]:
                raise CollectiveMismatchError(
                    f"all_to_all_single: rank {ranks[i]} sends {in_splits[i][j]} rows to "
                    f"rank {ranks[j]}, which expects {out_splits[j][i]} rows from it"
                )
    # Where each peer's rows start: the running sums of the splits.
    in_offsets = [list(accumulate(s, initial=0)) for s in in_splits]
    out_offsets = [list(accumulate(s, initial=0)) for s in out_splits]
    for j in range(n):
        for i in range(n):
            rows = in_splits[i][j]
            if rows == 0:
                continue
            src = ins[i].narrow(0, in_offsets[i][j], rows)
            outs[j].narrow(0, out_offsets[j][i], rows).copy_(src)
