"""Which tensors an operation reads and which it writes, from its schema.

The same classification as PyTorch's CUDA stream sanitizer makes (facts, not
its code): an argument annotated ``Tensor(a!)`` is written (in-place ops,
``out=``, ``resize_``); one annotated ``Tensor(a)`` without ``!`` is only
aliased (a view: no data is touched); any other tensor argument is read.
Ops that look at metadata only (``empty_like``, ``new_zeros``) touch nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

READ = "read"
WRITE = "write"

# Ops that take tensors for their shape, dtype or device only.
_METADATA_ONLY = frozenset(
    {
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
        "new_empty",
        "new_empty_strided",
        "new_zeros",
        "new_ones",
        "new_full",
        "is_same_size",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "size",
        "stride",
        "storage_offset",
        "dim",
        "is_nonzero_meta",
        "_has_same_storage_numel",
        "set_",  # re-pointing a tensor at other memory reads nothing of its old buffer
    }
)

# Ops that read values yet carry no data_dependent_output tag (torch 2.13):
# is_nonzero decomposes to a tagged _local_scalar_dense before a mode sees
# it on CPU, but a subclass's dispatch may be handed it whole.
_READ_UNTAGGED = frozenset({"is_nonzero"})

_cache: dict[Any, tuple[tuple[str, int | None, str], ...]] = {}


def _plan(func: Any) -> tuple[tuple[str, int | None, str], ...]:
    """(argument name, position or None for keyword-only, READ/WRITE) per tensor-bearing argument."""
    plan = _cache.get(func)
    if plan is not None:
        return plan
    if func._schema.name.split("::")[-1] in _METADATA_ONLY or _answers_from_metadata(func):
        plan = ()
    else:
        rows = []
        for i, arg in enumerate(func._schema.arguments):
            kind = str(arg.type)
            if "Tensor" not in kind:
                continue
            alias = arg.alias_info
            if alias is not None and not alias.is_write:
                continue  # a view: aliases, touches no data
            access = WRITE if alias is not None and alias.is_write else READ
            rows.append((arg.name, None if arg.kwarg_only else i, access))
        plan = tuple(rows)
    _cache[func] = plan
    return plan


def _answers_from_metadata(func: Any) -> bool:
    """Ops that return no tensor and whose answer does not depend on the
    data (``is_pinned``, ``is_same_size``, ``dim``, ``_version``): PyTorch tags
    the ones that read values (``item``, ``equal``, ``allclose``) with
    ``data_dependent_output``, and ops that write return what they wrote."""
    if func._schema.name.split("::")[-1] in _READ_UNTAGGED:
        return False
    returns = func._schema.returns
    if any("Tensor" in str(r.type) for r in returns):
        return False
    if any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments):
        return False  # writes, returning nothing (record_stream's kind aside, a mutation)
    return torch.Tag.data_dependent_output not in func.tags


def accesses(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[tuple[torch.Tensor, str]]:
    """Each plain tensor ``func`` touches with these arguments, with READ or WRITE."""
    for name, position, access in _plan(func):
        if position is not None and position < len(args):
            value = args[position]
        else:
            value = kwargs.get(name)
        if isinstance(value, torch.Tensor):
            yield value, access
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    yield item, access
