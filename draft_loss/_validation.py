"""Argument checks for the draft losses, and their agreement across a TP group.

Each rank first checks its own arguments without communicating. Under tensor
parallelism the ranks then exchange a small structural header (shapes, dtypes,
scalars, digests of the exact mask/bin/weight values, or the local error) in
ONE all-reduce whose size depends only on the group size. A rank with a
malformed input therefore still joins that collective with a well-formed
payload, and every rank decides from the same gathered data: either all raise
the same exception or all proceed. Nothing downstream can then leave a peer
waiting in a collective that another rank never reaches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

LOGIT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Stable small codes for dtypes in the header (never reorder: ranks compare them).
_DTYPE_CODES = {
    torch.bool: 1,
    torch.uint8: 2,
    torch.int8: 3,
    torch.int16: 4,
    torch.int32: 5,
    torch.int64: 6,
    torch.float16: 7,
    torch.bfloat16: 8,
    torch.float32: 9,
    torch.float64: 10,
}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}

# Payload slots per rank: [status, field_count, fields..., message...].
_HEADER_SLOTS = 24
_MESSAGE_SLOTS = 64
_BYTES_PER_SLOT = 7  # keeps every slot a non-negative int64
_PAYLOAD_SLOTS = 2 + _HEADER_SLOTS + _MESSAGE_SLOTS
_MESSAGE_BYTES = _MESSAGE_SLOTS * _BYTES_PER_SLOT

_STATUS_OK = 0
# Anything else that escapes a check (a bug, an odd device) travels as code 3
# and is raised as RuntimeError on every rank.
_ERROR_TYPES: dict[int, type[Exception]] = {1: ValueError, 2: TypeError, 3: RuntimeError}
_ERROR_CODES: dict[type, int] = {ValueError: 1, TypeError: 2}

Header = tuple[tuple[str, int], ...]

# A header field whose disagreement has its own explanation (a backward collective).
GRADIENTS_FIELD = "whether gradients flow (an input requires grad, grad mode on)"
_FIELD_REASONS = {
    GRADIENTS_FIELD: (
        "its backward all-reduces over the TP group, so a rank without a backward would leave the others "
        "waiting there; every TP rank must need gradients (inputs that require grad, grad mode on) or none"
    ),
}

# The first header field of every loss: which loss this rank is computing.
FUNCTION_FIELD = "function"
FUNCTION_NAMES = {1: "soft_cross_entropy", 2: "projected_soft_cross_entropy"}


@dataclass(frozen=True)
class TokenInputs:
    """Validated, flattened per-token inputs shared by the plain and projected losses."""

    mask: torch.Tensor  # [T], compute dtype
    bins: torch.Tensor  # [T], int64
    num_bins: int
    weights: torch.Tensor  # [num_bins], compute dtype
    compute_dtype: torch.dtype
    header: Header


# ---------------------------------------------------------------- local checks


def check_group(tp_group: object, what: str) -> int:
    """Size of ``tp_group`` (1 for None). Checked before any communication."""
    if tp_group is None:
        return 1
    if not isinstance(tp_group, dist.ProcessGroup):
        raise TypeError(
            f"{what}: tp_group must be a torch.distributed ProcessGroup or None, got {type(tp_group).__name__}"
        )
    if dist.get_rank(tp_group) < 0:
        raise ValueError(f"{what}: this rank is not a member of tp_group")
    return dist.get_world_size(tp_group)


def check_chunk_size(token_chunk_size: object, what: str) -> int:
    if isinstance(token_chunk_size, bool) or not isinstance(token_chunk_size, int):
        raise TypeError(f"{what}: token_chunk_size must be an int, got {type(token_chunk_size).__name__}")
    if token_chunk_size < 1:
        raise ValueError(f"{what}: token_chunk_size must be >= 1, got {token_chunk_size}")
    return token_chunk_size


def check_floating(name: str, value: object, what: str, min_dim: int = 1) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what}: {name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in LOGIT_DTYPES:
        raise TypeError(
            f"{what}: {name} must be float16, bfloat16, float32 or float64, got dtype {value.dtype}"
        )
    if value.dim() < min_dim:
        raise ValueError(
            f"{what}: {name} must have at least {min_dim} dim(s), got shape {tuple(value.shape)}"
        )
    return value


def check_same_device(
    name: str, value: torch.Tensor, device: torch.device, reference: str, what: str
) -> None:
    if value.device != device:
        raise ValueError(
            f"{what}: {name} must be on the same device as {reference} ({device}), got {value.device}"
        )


def check_token_inputs(
    what: str,
    leading_shape: tuple[int, ...],
    device: torch.device,
    reference: str,
    mask: object,
    bin_ids: object,
    weights: object,
    compute_dtype: torch.dtype,
) -> TokenInputs:
    """Checks mask, bin_ids and weights against the logits' leading shape."""
    mask_t, mask_f = _check_mask(what, leading_shape, device, reference, mask, compute_dtype)
    weights_t = _check_weights(what, device, reference, weights)
    bins, num_bins = _check_bins(what, leading_shape, device, reference, bin_ids, weights_t)
    if weights_t is None:
        weights_f = torch.ones(num_bins, dtype=compute_dtype, device=device)
    else:
        # Weights are constants of the loss: their gradient is never wanted.
        weights_f = weights_t.detach().to(compute_dtype)
    header: Header = (
        ("mask dtype", _DTYPE_CODES[mask_t.dtype]),
        ("mask values (digest)", digest(mask_f)),
        ("bin_ids given", int(bin_ids is not None)),
        ("bin_ids values (digest)", digest(bins) if bin_ids is not None else 0),
        ("number of bins", num_bins),
        ("weights given", int(weights is not None)),
        ("weights values (digest)", digest(weights_f) if weights is not None else 0),
    )
    return TokenInputs(mask_f, bins, num_bins, weights_f, compute_dtype, header)


def _check_mask(
    what: str,
    leading_shape: tuple[int, ...],
    device: torch.device,
    reference: str,
    mask: object,
    compute_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mask as given, and flattened in the compute dtype."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{what}: mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype not in _DTYPE_CODES:
        raise TypeError(f"{what}: mask must be bool, integer or real floating, got dtype {mask.dtype}")
    if tuple(mask.shape) != leading_shape:
        raise ValueError(
            f"{what}: mask must have the logits' leading shape {leading_shape}, got {tuple(mask.shape)}"
        )
    check_same_device("mask", mask, device, reference, what)
    mask_f = mask.detach().reshape(-1).to(compute_dtype)
    if mask_f.numel() and not bool((torch.isfinite(mask_f) & (mask_f >= 0)).all()):
        bad = mask_f[~(torch.isfinite(mask_f) & (mask_f >= 0))][:4].tolist()
        raise ValueError(f"{what}: mask values must be finite and >= 0, got e.g. {bad}")
    return mask, mask_f


def _check_weights(what: str, device: torch.device, reference: str, weights: object) -> torch.Tensor | None:
    if weights is not None:
        if not isinstance(weights, torch.Tensor):
            raise TypeError(f"{what}: weights must be a torch.Tensor or None, got {type(weights).__name__}")
        if not weights.is_floating_point():
            raise TypeError(f"{what}: weights must be a floating tensor, got dtype {weights.dtype}")
        if weights.dim() != 1 or weights.shape[0] < 1:
            raise ValueError(
                f"{what}: weights must be 1-D with one entry per bin (>= 1), got shape {tuple(weights.shape)}"
            )
        check_same_device("weights", weights, device, reference, what)
        valid = torch.isfinite(weights) & (weights >= 0)
        if not bool(valid.all()):
            bad = weights[~valid][:4].tolist()
            raise ValueError(
                f"{what}: weights must be finite and >= 0, got e.g. {bad} (of {weights.shape[0]} weights)"
            )
    return weights


def _check_bins(
    what: str,
    leading_shape: tuple[int, ...],
    device: torch.device,
    reference: str,
    bin_ids: object,
    weights: torch.Tensor | None,
) -> tuple[torch.Tensor, int]:
    if bin_ids is None:
        num_bins = 1 if weights is None else int(weights.shape[0])
        return torch.zeros(leading_shape, dtype=torch.int64, device=device).reshape(-1), num_bins
    if not isinstance(bin_ids, torch.Tensor):
        raise TypeError(f"{what}: bin_ids must be a torch.Tensor or None, got {type(bin_ids).__name__}")
    if bin_ids.dtype == torch.bool or bin_ids.is_floating_point() or bin_ids.is_complex():
        raise TypeError(f"{what}: bin_ids must be an integer tensor, got dtype {bin_ids.dtype}")
    if tuple(bin_ids.shape) != leading_shape:
        raise ValueError(
            f"{what}: bin_ids must have the logits' leading shape {leading_shape}, got {tuple(bin_ids.shape)}"
        )
    check_same_device("bin_ids", bin_ids, device, reference, what)
    bins = bin_ids.detach().reshape(-1).to(torch.int64)
    if bins.numel() and int(bins.min()) < 0:
        raise ValueError(f"{what}: bin_ids must be >= 0, got minimum {int(bins.min())}")
    if weights is None:
        # Without weights the bin count follows the data; pass weights to fix it
        # (e.g. so that every DP rank returns statistics of one length).
        num_bins = int(bins.max()) + 1 if bins.numel() else 1
    else:
        num_bins = int(weights.shape[0])
        if bins.numel() and int(bins.max()) >= num_bins:
            raise ValueError(
                f"{what}: bin_ids must be < len(weights) = {num_bins}, got maximum {int(bins.max())}"
            )
    return bins, num_bins


def digest(values: torch.Tensor) -> int:
    """A signed 64-bit digest of a tensor's exact values (dtype included)."""
    data = values.detach().contiguous().cpu()
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(str(data.dtype).encode())
    hasher.update(str(tuple(data.shape)).encode())
    hasher.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(hasher.digest(), "little", signed=True)


def shape_digest(shape: tuple[int, ...]) -> int:
    hasher = hashlib.blake2b(str(shape).encode(), digest_size=8)
    return int.from_bytes(hasher.digest(), "little", signed=True)


def dtype_code(dtype: torch.dtype) -> int:
    return _DTYPE_CODES[dtype]


# ------------------------------------------------------------ TP agreement

Checked = TypeVar("Checked")


def validate_on_every_rank(
    tp_group: dist.ProcessGroup | None,
    group_size: int,
    what: str,
    check: Callable[[], tuple[Checked, Header]],
) -> Checked:
    """Runs ``check`` locally, then makes every TP rank agree on its outcome.

    ``check`` returns the validated arguments and their header, or raises
    (ValueError/TypeError for bad arguments). Without a TP group the local
    error is raised as is. With one, all ranks raise one identical error (the
    lowest failing rank's message, or the first header field on which ranks
    disagree) or all return.
    """
    error: Exception | None = None
    outcome: tuple[Checked, Header] | None = None  # None: the check raised
    try:
        outcome = check()
    except Exception as exc:
        error = exc
    if tp_group is None or group_size == 1:
        if error is not None:
            raise error
    else:
        header = () if outcome is None else outcome[1]
        rows = _exchange(tp_group, group_size, _encode(error, header))
        failure = _decide(rows, what, [name for name, _ in header])
        if failure is not None:
            raise failure from error
    assert outcome is not None  # a rank whose check raised fails in _decide
    return outcome[0]


def _encode(error: Exception | None, header: Header) -> list[int]:
    slots = [0] * _PAYLOAD_SLOTS
    if error is not None:
        code = _ERROR_CODES.get(type(error), 3)
        slots[0] = code
        text = str(error) if code != 3 else f"{type(error).__name__} while checking arguments: {error}"
        message = text.encode("utf-8")
        if len(message) > _MESSAGE_BYTES:
            # Cut on a character boundary: half a character would decode as U+FFFD.
            kept = message[: _MESSAGE_BYTES - 3].decode("utf-8", errors="ignore")
            message = kept.encode("utf-8") + b"..."
        message = message.ljust(_MESSAGE_BYTES, b"\0")
        for i in range(_MESSAGE_SLOTS):
            chunk = message[i * _BYTES_PER_SLOT : (i + 1) * _BYTES_PER_SLOT]
            slots[2 + _HEADER_SLOTS + i] = int.from_bytes(chunk, "little")
        return slots
    if not header or header[0][0] != FUNCTION_FIELD or len(header) > _HEADER_SLOTS:
        raise AssertionError(
            f"a header starts with {FUNCTION_FIELD!r} and has at most {_HEADER_SLOTS} fields, got {header}"
        )
    slots[1] = len(header)
    for i, (_, value) in enumerate(header):
        slots[2 + i] = value
    # Field names are not sent: every rank runs the same function, whose header
    # names are the same; a rank in a different function shows up as a
    # field-count or function-id mismatch.
    return slots


def _exchange(tp_group: dist.ProcessGroup, group_size: int, slots: list[int]) -> list[list[int]]:
    """All-gather of one fixed-size int64 row per rank, made from a single SUM all-reduce.

    An all-reduce is the collective every backend supports for int64; each rank
    fills only its own row, so the sum is an exact gather.
    """
    device = _payload_device(tp_group)
    table = torch.zeros(group_size, _PAYLOAD_SLOTS, dtype=torch.int64, device=device)
    table[dist.get_rank(tp_group)] = torch.tensor(slots, dtype=torch.int64)
    dist.all_reduce(table, op=dist.ReduceOp.SUM, group=tp_group)
    return table.cpu().tolist()


def _payload_device(tp_group: dist.ProcessGroup) -> torch.device:
    try:
        backend = str(dist.get_backend(tp_group)).lower()
    except (RuntimeError, ValueError):
        backend = ""
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _decide(rows: list[list[int]], what: str, names: list[str]) -> Exception | None:
    size = len(rows)
    failed = [rank for rank, row in enumerate(rows) if row[0] != _STATUS_OK]
    if failed:
        first = failed[0]
        message = _decode_message(rows[first])
        others = f"; also failed on TP ranks {failed[1:]}" if len(failed) > 1 else ""
        error_type = _ERROR_TYPES.get(rows[first][0], ValueError)
        return error_type(
            f"{message} [TP rank {first} of {size} found this{others}; every TP rank raises it]"
        )
    # The first header field says which loss a rank is in: compare it first,
    # and word its mismatch so that every rank (whichever loss it is in) prints
    # the same message.
    functions = [row[2] for row in rows]
    if len(set(functions)) > 1:
        called = ", ".join(f"rank {r}: {FUNCTION_NAMES.get(f, f)}" for r, f in enumerate(functions))
        return ValueError(f"draft_loss: TP ranks called different losses: {called}")
    for slot in range(1, 2 + _HEADER_SLOTS):
        values = [row[slot] for row in rows]
        if len(set(values)) > 1:
            if slot == 1:
                field = "number of header fields"
            else:
                field = names[slot - 2] if slot - 2 < len(names) else f"header field {slot - 2}"
            reason = _FIELD_REASONS.get(
                field,
                "every rank of a tensor-parallel group must pass the same token layout, chunk size, dtypes, "
                "mask, bin_ids and weights (only the vocabulary shard differs)",
            )
            return ValueError(f"{what}: TP ranks disagree on {field}: {_per_rank(field, values)}; {reason}")
    return None


def _per_rank(field: str, values: list[int]) -> str:
    if "digest" in field:
        groups: dict[int, list[int]] = {}
        for rank, value in enumerate(values):
            groups.setdefault(value, []).append(rank)
        return "values differ between TP ranks " + " vs ".join(str(ranks) for ranks in groups.values())
    if field.startswith("whether"):
        return ", ".join(f"rank {r}: {'yes' if v else 'no'}" for r, v in enumerate(values))
    if "dtype" in field:
        return ", ".join(f"rank {r}: {_CODE_DTYPES.get(v, v)}" for r, v in enumerate(values))
    return ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))


def _decode_message(row: list[int]) -> str:
    data = b"".join(int(value).to_bytes(_BYTES_PER_SLOT, "little") for value in row[2 + _HEADER_SLOTS :])
    return data.rstrip(b"\0").decode("utf-8", errors="replace")
