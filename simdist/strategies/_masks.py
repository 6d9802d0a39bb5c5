"""Token masks decoded from one drawn byte string (simdist.strategies' mask strategies).

Hypothesis limits the choices one case may make, and in the first cases of a run
to five times what the simplest continuation needs: a mask drawn choice by choice
(a kind, a scale, a list of 32 tokens per row, rows per rank and microbatch)
overran it in about 5% of a campaign's cases. Drawn as one ``st.binary`` of a
size fixed by the arguments, a mask is a single choice whatever its shape, and
every byte decodes monotonically (byte 0 is the simplest option), so the
shrinker's byte-by-byte minimisation still walks towards fully valid 0/1 masks.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "DISTRIBUTION_HEADER_BYTES",
    "MAX_ROWS",
    "ROW_BYTES",
    "decode_distribution",
    "decode_row",
    "decode_token_mask",
    "token_mask_bytes",
]

# Per row: kind, scale, a two-byte position (prefix cut, single token), and a
# 32-token pattern of 2-bit codes for random rows.
ROW_BYTES = 12
# A random row longer than this repeats a drawn pattern of this length; a row
# of more tokens than this is "long": drawn for its count, mostly (nearly) full.
PATTERN = 32
# Per rank: its number of rows, whether it is all masked; per microbatch: whether it is.
DISTRIBUTION_HEADER_BYTES = 2
# Hypothesis' buffer holds 8 KiB a case; a mask leaves room for the rest of the case.
MAX_ROWS = 400

# Eight kind bins, the simplest first; bins 0-5 mean the same kind at every
# length, so a case whose sequence shrinks from long to short keeps its rows'
# kinds. Long rows are drawn for their counts (mostly nearly full), short ones
# for their shapes (more uneven prefixes and random rows).
SHORT_KINDS = ("full", "empty", "prefix", "single", "first_only", "random", "random", "prefix")
LONG_KINDS = ("full", "empty", "prefix", "single", "first_only", "random", "full", "prefix")
# 2-bit codes of a random row's tokens; code 0 is a valid token (shrinks to a full row).
_FRACTIONAL_CODES = (1.0, 0.0, 0.5, 1.0)
_BINARY_CODES = (1.0, 0.0, 1.0, 0.0)
# A long prefix row masks at most this many trailing tokens: it is drawn for its count.
_LONG_PREFIX_CUT = 8


def pick(byte: int, options: Sequence[object]) -> object:
    """``options[i]`` with ``i`` growing with ``byte`` (0 -> the first, the simplest)."""
    return options[byte * len(options) // 256]


def _below(byte: int, n: int) -> int:
    return byte * n // 256


def decode_row(
    blob: bytes, at: int, seq_len: int, *, fractional: bool, scales: Sequence[float]
) -> list[float]:
    """The mask row whose ROW_BYTES start at ``blob[at]``."""
    long = seq_len > PATTERN
    kind = pick(blob[at], LONG_KINDS if long else SHORT_KINDS)
    scale = float(pick(blob[at + 1], scales)) if fractional else 1.0  # type: ignore[arg-type]  # scales are floats
    where = (blob[at + 2] << 8) | blob[at + 3]
    if kind == "full":
        row = [1.0] * seq_len
    elif kind == "empty":
        row = [0.0] * seq_len
    elif kind == "prefix":
        # The number of masked tokens at the end; 0 (fully valid) is the simplest.
        cut = min(seq_len - 1, _LONG_PREFIX_CUT) if long else seq_len - 1
        masked = where * (cut + 1) // 65536
        row = [1.0] * (seq_len - masked) + [0.0] * masked
    elif kind == "single":
        position = where * seq_len // 65536
        row = [1.0 if t == position else 0.0 for t in range(seq_len)]
    elif kind == "first_only":
        row = [1.0] + [0.0] * (seq_len - 1)
    else:
        codes = _FRACTIONAL_CODES if fractional else _BINARY_CODES
        pattern = [codes[(blob[at + 4 + token // 4] >> (2 * (token % 4))) & 3] for token in range(PATTERN)]
        row = (pattern * -(-seq_len // PATTERN))[:seq_len]
    return [value * scale for value in row]


def distribution_bytes(ranks: int, microbatches: int, high_rows: int, remainders: bool = False) -> int:
    # With remainders a rank has one more header byte (how many microbatches
    # take an extra row) and room for that extra row in every microbatch.
    header = DISTRIBUTION_HEADER_BYTES + (1 if remainders else 0)
    slots = high_rows + (1 if remainders else 0)
    return ranks * (header + microbatches * (1 + slots * ROW_BYTES))


def decode_distribution(
    blob: bytes,
    *,
    ranks: int,
    microbatches: int,
    seq_len: int,
    low_rows: int,
    high_rows: int,
    fractional: bool,
    scales: Sequence[float],
    remainders: bool = False,
) -> list[list[list[list[float]]]]:
    """``masks[rank][microbatch][row][position]`` from ``distribution_bytes(...)`` bytes.

    With ``remainders``, a rank's first microbatches may hold one row more than
    the others, as ``torch.tensor_split`` splits rows that do not divide by the
    microbatch count (the byte 0 is no remainder: the simplest)."""
    # Long rows are drawn for their counts: masked less often (a quarter, not
    # half, of ranks and microbatches), so the DP sum passes 256 often.
    masked_from = 192 if seq_len > PATTERN else 128
    out = []
    at = 0
    for _ in range(ranks):
        rows = low_rows + _below(blob[at], high_rows - low_rows + 1)
        rank_masked = blob[at + 1] >= masked_from
        extra = _below(blob[at + 2], microbatches) if remainders else 0
        at += DISTRIBUTION_HEADER_BYTES + (1 if remainders else 0)
        slots = high_rows + (1 if remainders else 0)
        per_rank = []
        for k in range(microbatches):
            micro_masked = blob[at] >= masked_from
            at += 1
            micro_rows = rows + (1 if k < extra else 0)
            # Every row's bytes are read, used or not, so a byte means the same
            # thing whatever the draws before it (the shrinker keeps alignment).
            micro = [
                decode_row(blob, at + i * ROW_BYTES, seq_len, fractional=fractional, scales=scales)
                for i in range(micro_rows)
            ]
            at += slots * ROW_BYTES
            if rank_masked or micro_masked:
                micro = [[0.0] * seq_len for _ in range(micro_rows)]
            per_rank.append(micro)
        out.append(per_rank)
    return out


# token_masks: per row a kind byte, then one bit per token.
_TOKEN_MASK_KINDS = ("random", "full", "first_only", "empty")


def token_mask_bytes(batch: int, seq_len: int) -> int:
    return batch * (1 + -(-seq_len // 8))


def decode_token_mask(blob: bytes, *, batch: int, seq_len: int, allow_empty_rows: bool) -> list[list[int]]:
    kinds = _TOKEN_MASK_KINDS if allow_empty_rows else _TOKEN_MASK_KINDS[:3]
    per_row = 1 + -(-seq_len // 8)
    rows = []
    for r in range(batch):
        at = r * per_row
        kind = pick(blob[at], kinds)
        if kind == "empty":
            rows.append([0] * seq_len)
        elif kind == "full":
            rows.append([1] * seq_len)
        elif kind == "first_only":
            rows.append([1] + [0] * (seq_len - 1))
        else:
            row = [(blob[at + 1 + t // 8] >> (t % 8)) & 1 for t in range(seq_len)]
            if not allow_empty_rows and not any(row):
                row[0] = 1
            rows.append(row)
    return rows
