"""Context parallelism: sequences sharded over the CP group, and the one-token shift across shards.

Sharding follows Megatron's load balancing for causal attention: the sequence
(dim 1) is cut into ``2 * cp`` equal chunks and CP rank r holds chunks r and
``2 * cp - 1 - r``, concatenated in that order ("chunk A" then "chunk B"). A
length that does not divide by ``2 * cp`` is PADDED at the end with
``pad_value`` (0) up to the next multiple: a token mask of 0 there means the
padding never trains and never counts, so the result equals that of the
unpadded sequence. With ``cp == 1`` nothing is cut or padded.

The draft model and the policy's labels both look one token ahead: position t
needs position t + 1. Inside a chunk that is local. Across chunks:

* the last slot of chunk A (chunk r) needs the first position of chunk r + 1,
  which is chunk A of CP rank r + 1, or, on the last CP rank, the rank's own
  chunk B (chunks cp - 1 and cp are adjacent);
* the last slot of chunk B (chunk 2cp-1-r) needs the first position of chunk
  2cp-r, which is chunk B of CP rank r - 1; on CP rank 0 it is the end of the
  sequence (zero, as in the unsharded shift).

So each rank sends exactly two rows per tensor, its chunk A head to rank r - 1
and its chunk B head to rank r + 1, by point-to-point messages (every tensor
of one call packed into one byte buffer per direction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["load_balanced_positions", "padded_length", "shard_sequence", "shift_left"]

_WHAT = "shift_left"


def padded_length(seq_len: int, cp_size: int) -> int:
    """The sequence length after padding for ``cp_size`` ranks (a multiple of ``2 * cp_size``)."""
    _check_positive("seq_len", seq_len, "padded_length")
    _check_positive("cp_size", cp_size, "padded_length")
    if cp_size == 1:
        return seq_len
    chunks = 2 * cp_size
    return math.ceil(seq_len / chunks) * chunks


def load_balanced_positions(seq_len: int, cp_rank: int, cp_size: int) -> torch.Tensor:
    """Positions in the padded sequence of CP rank ``cp_rank``'s local slots, in local order."""
    total = padded_length(seq_len, cp_size)
    _check_rank(cp_rank, cp_size, "load_balanced_positions")
    if cp_size == 1:
        return torch.arange(total)
    chunk = total // (2 * cp_size)
    first, second = cp_rank, 2 * cp_size - 1 - cp_rank
    return torch.cat(
        [torch.arange(first * chunk, (first + 1) * chunk), torch.arange(second * chunk, (second + 1) * chunk)]
    )


def shard_sequence(
    values: torch.Tensor, cp_rank: int, cp_size: int, *, pad_value: float | int = 0
) -> torch.Tensor:
    """CP rank ``cp_rank``'s load-balanced shard of ``values`` ``[batch, seq, ...]`` (padded, see the module doc)."""
    if not isinstance(values, torch.Tensor) or values.dim() < 2:
        raise ValueError(f"shard_sequence: values must be a tensor [batch, seq, ...], got {values!r:.80}")
    seq_len = int(values.shape[1])
    positions = load_balanced_positions(seq_len, cp_rank, cp_size)
    total = padded_length(seq_len, cp_size)
    if total > seq_len:
        pad = values.new_full((values.shape[0], total - seq_len, *values.shape[2:]), pad_value)
        values = torch.cat([values, pad], dim=1)
    return values.index_select(1, positions.to(values.device)).clone()


def shift_left(*values: torch.Tensor, cp_group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, ...]:
    """``out[:, t] = values[:, t + 1]`` of the unsharded sequence, sliced to this CP rank.

    Args:
        values: tensors ``[batch, seq_local, ...]`` of any dtypes, sharing
            ``batch``, ``seq_local`` and device: this rank's load-balanced shard
            (``shard_sequence``). They must not require grad: nothing that
            crosses a shard boundary in the draft alignment needs a gradient
            (token ids, masks, bins, the detached teacher), and a shift that
            silently cut one would be wrong; pass ``.detach()``.
        cp_group: the context-parallel group, or None (no CP: a local shift).

    Every CP rank must call with tensors of the same shapes and dtypes (the
    messages' sizes follow from them). Returns new tensors; the slot after the
    end of the sequence is zero.
    """
    rows, length = _check_values(values)
    size = 1 if cp_group is None else dist.get_world_size(cp_group)
    shifted = tuple(_local_shift(v) for v in values)
    if size == 1 or not values:
        return shifted
    if length % 2:
        raise ValueError(
            f"{_WHAT}: under context parallelism each rank holds two equal chunks, so seq_local must be "
            f"even, got {length}; shard with shard_sequence"
        )
    if rows == 0:
        return shifted  # every CP rank holds the same (empty) shape: nothing to send
    half = length // 2
    rank = dist.get_rank(cp_group)
    heads_a = _pack([v[:, 0] for v in values], rows)
    heads_b = _pack([v[:, half] for v in values], rows)
    assert cp_group is not None  # size > 1
    next_a, next_b = _neighbour_heads(heads_a, heads_b, cp_group, rank, size)
    # The local shift already holds the right values inside each chunk, at the
    # A/B seam of the last rank (its chunks are adjacent) and at the end of
    # the sequence (rank 0's chunk B): only the other seams are overwritten.
    if next_a is not None:
        for out, row in zip(shifted, _unpack(next_a, values, rows)):
            out[:, half - 1] = row
    if next_b is not None:
        for out, row in zip(shifted, _unpack(next_b, values, rows)):
            out[:, length - 1] = row
    return shifted


def _neighbour_heads(
    heads_a: torch.Tensor, heads_b: torch.Tensor, group: dist.ProcessGroup, rank: int, size: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(chunk A head of rank + 1, chunk B head of rank - 1); None where there is no such rank.

    Within each pair of neighbours the lower rank sends first and the higher
    receives first, so the exchange cannot deadlock even where a send waits
    for its receive (NCCL, large messages).
    """
    works = []
    from_right = from_left = None
    if rank > 0:
        from_left = torch.empty_like(heads_b)
        works.append(dist.irecv(from_left, group=group, group_src=rank - 1))
        works.append(dist.isend(heads_a, group=group, group_dst=rank - 1))
    if rank < size - 1:
        works.append(dist.isend(heads_b, group=group, group_dst=rank + 1))
        from_right = torch.empty_like(heads_a)
        works.append(dist.irecv(from_right, group=group, group_src=rank + 1))
    for work in works:
        assert work is not None, "isend/irecv return no Work only on a rank outside the group"
        work.wait()
    # The last rank's chunk A is followed by its own chunk B: already local.
    return from_right, from_left


# ------------------------------------------------------------------ helpers


def _local_shift(values: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(values)
    out[:, :-1] = values[:, 1:]
    return out


def _pack(heads: Sequence[torch.Tensor], rows: int) -> torch.Tensor:
    """One uint8 buffer ``[rows, bytes]`` of every tensor's head rows (exact for any dtype)."""
    # Fresh tensors with standard strides and offset 0: a view across element
    # sizes needs both, and size-1 dims or slices may keep odd ones.
    parts = [_fresh(h.reshape(rows, math.prod(h.shape[1:]))).view(torch.uint8) for h in heads]
    return torch.cat(parts, dim=1)


def _fresh(values: torch.Tensor) -> torch.Tensor:
    return torch.empty(values.shape, dtype=values.dtype, device=values.device).copy_(values)


def _unpack(buffer: torch.Tensor, values: Sequence[torch.Tensor], rows: int) -> list[torch.Tensor]:
    out, offset = [], 0
    for v in values:
        width = math.prod(v.shape[2:]) * v.element_size()
        part = _fresh(buffer[:, offset : offset + width]).view(v.dtype)
        out.append(part.reshape(rows, *v.shape[2:]))
        offset += width
    return out


def _check_values(values: Sequence[object]) -> tuple[int, int]:
    rows = length = -1
    device = None
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{_WHAT}: values[{i}] must be a torch.Tensor, got {type(v).__name__}")
        if v.dim() < 2:
            raise ValueError(
                f"{_WHAT}: values[{i}] must be [batch, seq_local, ...], got shape {tuple(v.shape)}"
            )
        if v.requires_grad:
            raise ValueError(
                f"{_WHAT}: values[{i}] requires grad, but no gradient crosses a CP boundary here; pass .detach()"
            )
        if i == 0:
            rows, length, device = int(v.shape[0]), int(v.shape[1]), v.device
        elif (int(v.shape[0]), int(v.shape[1])) != (rows, length) or v.device != device:
            raise ValueError(
                f"{_WHAT}: every tensor must share [batch, seq_local] = {(rows, length)} and device {device}, "
                f"values[{i}] has {tuple(v.shape[:2])} on {v.device}"
            )
    return rows, length


def _check_positive(name: str, value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what}: {name} must be a positive int, got {value!r}")


def _check_rank(rank: object, size: int, what: str) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"{what}: cp_rank must be an int in [0, {size}), got {rank!r}")
