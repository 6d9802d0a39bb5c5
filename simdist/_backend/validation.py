"""Argument checks the process group's methods share, worded as the user's call.

Each check names the op as torch.distributed spells it (``all_gather``, not
c10d's ``allgather``), the argument, what was expected and what came.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import UnsupportedOperationError
from . import kernels
from .current import _refused


def shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def one(tensors: Sequence[Any], op: str) -> Any:
    """The one tensor (or tensor list) a rank passes per call."""
    if len(tensors) != 1:
        raise _refused(
            UnsupportedOperationError(f"{op}: simdist takes one tensor per rank per call, got {len(tensors)}")
        )
    return tensors[0]


def same_dtype(op: str, name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    """gloo and NCCL refuse outputs and inputs of different dtypes; so does simdist
    (a silent cast would pass a test that fails on a cluster)."""
    if a.dtype != b.dtype:
        raise ValueError(
            f"{op}: {name_a} has dtype {a.dtype} but {name_b} has dtype {b.dtype}; real "
            f"backends (gloo, NCCL) refuse mixed dtypes: cast one of them"
        )


def root_in_group(root: int, size: int, op: str) -> None:
    if not 0 <= root < size:
        raise ValueError(f"{op}: root group rank {root} is outside the group of size {size}")


def group_sized(
    op: str, name: str, whole: torch.Tensor, part_name: str, part: torch.Tensor, size: int
) -> None:
    """The flat forms' big tensor (all_gather_into_tensor's output,
    reduce_scatter_tensor's input) holds one ``part`` per member."""
    if whole.numel() != size * part.numel():
        raise ValueError(
            f"{op}: {name} has {whole.numel()} elements, expected "
            f"group size {size} * {part_name} numel {part.numel()} = {size * part.numel()}"
        )


def member_list(
    op: str,
    name: str,
    lists: Sequence[Sequence[torch.Tensor]],
    size: int,
    other_name: str,
    other: torch.Tensor,
    *,
    list_first: bool,
    dense: bool = False,
) -> list[torch.Tensor]:
    """The one list of one tensor per member (all_gather's ``tensor_list``,
    reduce_scatter's ``input_list``, gather's and scatter's root list): the
    group's size, each entry of ``other``'s dtype.

    ``list_first`` orders a dtype error's two names as the op's signature does;
    ``dense`` refuses a non-contiguous entry (``kernels.require_dense``).
    """
    tensors = list(one(lists, op))
    if len(tensors) != size:
        raise ValueError(f"{op}: {name} has {len(tensors)} tensors, expected group size {size}")
    for i, t in enumerate(tensors):
        if list_first:
            same_dtype(op, f"{name}[{i}]", t, other_name, other)
        else:
            same_dtype(op, other_name, other, f"{name}[{i}]", t)
        if dense:
            kernels.require_dense(t, op, f"{name}[{i}]")
    return tensors


def root_list(
    op: str,
    root: int,
    group_rank: int,
    size: int,
    name: str,
    lists: Sequence[Sequence[torch.Tensor]],
    tensor: torch.Tensor,
    list_first: bool,
    dense: bool = False,
) -> list[torch.Tensor]:
    """gather's ``gather_list`` or scatter's ``scatter_list``: only the root
    passes one (elsewhere it is empty); ``root`` is checked on every rank."""
    root_in_group(root, size, op)
    if group_rank != root:
        return []
    return member_list(op, name, lists, size, "tensor", tensor, list_first=list_first, dense=dense)
