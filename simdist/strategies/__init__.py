"""Hypothesis strategies for random layouts, token distributions, bin weights,
dtypes, reduction models and faults: the building blocks of fuzz properties.

Needs the ``hypothesis`` package (a test extra); simdist itself does not.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import NamedTuple

import torch
from hypothesis import strategies as st

from .._checks import check_int, is_int
from ..faults import CORRUPT_MODES, KINDS, Fault, FaultPlan
from ..layout import AXES, Layout
from . import _masks

__all__ = [
    "BF16_EXACT_INTEGERS",
    "DTYPE_NAMES",
    "FUZZ_FAULT_KINDS",
    "LAYOUT_WEIGHTINGS",
    "MASK_ROW_KINDS",
    "MASK_SCALES",
    "REDUCTION_NAMES",
    "SWARM_ENV",
    "WEIGHT_VALUES",
    "Features",
    "ProbeFault",
    "ReductionChoice",
    "bin_weights",
    "campaign_max_world_size",
    "dtype_names",
    "fault_from_json",
    "fault_plans",
    "fault_to_json",
    "faults",
    "layouts",
    "mask_rows",
    "probe_faults",
    "reductions",
    "sequence_lengths",
    "swarm",
    "swarm_enabled",
    "token_distributions",
    "token_masks",
]


SWARM_ENV = "SIMDIST_FUZZ_SWARM"


class Features(frozenset[str]):
    """The features a swarm-tested case may use (``swarm`` draws them)."""

    def on(self, name: str) -> bool:
        return name in self


def swarm_enabled() -> bool:
    """False when ``SIMDIST_FUZZ_SWARM=0`` (every case then keeps every feature on)."""
    raw = os.environ.get(SWARM_ENV, "1").strip()
    if raw not in ("0", "1", ""):
        raise ValueError(f"{SWARM_ENV} must be 0 or 1, got {raw!r}")
    return raw != "0"


def swarm(features: Sequence[str]) -> st.SearchStrategy[Features]:
    """Swarm testing (Groce et al., "Swarm testing", ISSTA 2012): each case
    switches a random subset of ``features`` off, so that a bug one feature
    shows is not masked by another feature's noise (a fault that aborts the
    step before the remainder microbatch runs, clipping that rescales away a
    wrong gradient). Each feature is on in about half the cases, drawn
    independently; a failure shrinks towards every feature off, so the shrunk
    case names the features the bug needs. ``SIMDIST_FUZZ_SWARM=0`` keeps
    every feature on in every case (the draws are made all the same), to
    measure what swarm testing adds."""
    names = tuple(features)
    if not names or len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"swarm: features must be distinct names, got {list(names)!r}")
    return _swarm(names)


@st.composite
def _swarm(draw: st.DrawFn, names: tuple[str, ...]) -> Features:
    chosen = [draw(st.booleans()) for _ in names]
    if not swarm_enabled():
        return Features(names)
    return Features(name for name, on in zip(names, chosen) if on)


def campaign_max_world_size(default: int | None = None) -> int | None:
    """The world-size bound a ``simdist fuzz`` campaign sets (``--max-world-size``,
    exported as ``SIMDIST_FUZZ_MAX_WORLD_SIZE``), else ``default``."""
    raw = os.environ.get("SIMDIST_FUZZ_MAX_WORLD_SIZE")
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"SIMDIST_FUZZ_MAX_WORLD_SIZE must be a positive int, got {raw!r}")
    return int(raw)


def layouts(
    *,
    max_world_size: int = 8,
    axes: Sequence[str] = ("tp", "dp", "pp"),
    max_degree: int | None = None,
    weighting: str = "world",
) -> st.SearchStrategy[Layout]:
    """Layouts whose degrees along ``axes`` multiply to at most ``max_world_size``
    (other axes stay 1), each degree in ``1..max_degree`` (by default any degree the
    world-size bound allows); non-power-of-two degrees included. A campaign's
    ``--max-world-size`` lowers the bound.

    Distribution: two draws in three take the world size first, uniformly over
    the sizes the axes can make (small worlds as often as large ones), then one
    of its factorisations over ``axes``, uniformly; the third gives one axis,
    drawn uniformly, its largest degree. So every axis has the same
    distribution of degrees, whatever its place in ``axes``, and each reaches
    its largest degree in about ``1 / (3 * len(axes))`` of draws or more (TP=8
    under ``max_world_size=8`` in over 8% with three axes;
    tests/fuzz_runner/test_strategies_fuzz.py measures it). Pass
    ``axes=("tp", "cp", "dp", "pp")`` to draw context parallelism too. Shrinks
    towards a single rank, then towards the smallest degrees, first axis first,
    also when several draws are composed.

    ``weighting="cost"`` spends a campaign's budget on distinct layouts
    rather than on the largest worlds (which are the slowest and the most
    numerous): one axis, drawn uniformly, takes any degree in
    ``1..max_degree`` uniformly, and every other axis a small one (1 in most
    draws, up to 4), so each axis reaches its degrees of 5 and more in
    several percent of draws (tests/fuzz_runner/test_strategies_reach.py
    measures it) while the median world stays a few times the focus degree. Each degree is its own integer draw,
    so a failure shrinks to the smallest failing degree of each axis."""
    for axis in axes:
        if axis not in AXES:
            raise ValueError(f"unknown axis {axis!r}; expected some of {AXES}")
    if len(set(axes)) != len(axes) or not axes:
        raise ValueError(f"layouts: axes must name each axis once, got {tuple(axes)!r}")
    if not is_int(max_world_size, 1) or (max_degree is not None and not is_int(max_degree, 1)):
        raise ValueError(f"max_world_size and max_degree must be >= 1, got {max_world_size}, {max_degree}")
    if weighting not in LAYOUT_WEIGHTINGS:
        raise ValueError(f"layouts: weighting must be one of {LAYOUT_WEIGHTINGS}, got {weighting!r}")
    bound = min(max_world_size, campaign_max_world_size(max_world_size) or max_world_size)
    degree = bound if max_degree is None else min(max_degree, bound)
    if weighting == "cost":
        return _cost_layouts(tuple(axes), bound, degree)
    return _layouts(_factorisations(bound, len(axes), degree), tuple(axes))


LAYOUT_WEIGHTINGS: tuple[str, ...] = ("world", "cost")
# The degrees of the axes beside the focus axis of a cost-weighted layout,
# simplest first: mostly 1, so a world costs a few times its focus degree.
_SIDE_DEGREES: tuple[int, ...] = (1, 1, 1, 2, 2, 3, 4)


@st.composite
def _cost_layouts(draw: st.DrawFn, axes: tuple[str, ...], bound: int, max_degree: int) -> Layout:
    # Every draw is made whatever the values (the same choices in every case).
    focus = draw(st.integers(0, len(axes) - 1))
    focus_degree = draw(st.integers(1, max_degree))
    side = [min(max_degree, draw(st.sampled_from(_SIDE_DEGREES))) for _ in axes]
    degrees = [focus_degree if i == focus else side[i] for i in range(len(axes))]
    # Over the world bound: the side axes give way first, last axis first,
    # then the focus degree itself.
    for i in reversed(range(len(axes))):
        while i != focus and degrees[i] > 1 and math.prod(degrees) > bound:
            degrees[i] -= 1
    degrees[focus] = min(degrees[focus], bound)
    return Layout(**dict(zip(axes, degrees)))


@functools.lru_cache(maxsize=64)
def _factorisations(
    bound: int, n_axes: int, max_degree: int
) -> tuple[tuple[int, tuple[tuple[int, ...], ...]], ...]:
    """(world, its factorisations over n_axes, lexicographic) for every world <= bound."""

    def products(n: int, room: int) -> list[tuple[int, ...]]:
        if n == 0:
            return [()]
        return [
            (d, *rest) for d in range(1, min(max_degree, room) + 1) for rest in products(n - 1, room // d)
        ]

    by_size: dict[int, list[tuple[int, ...]]] = {}
    for sizes in products(n_axes, bound):
        by_size.setdefault(math.prod(sizes), []).append(sizes)
    # Lexicographic order: a factorisation shrinks towards small degrees on the first axis.
    ordinary = tuple((world, tuple(sorted(by_size[world]))) for world in sorted(by_size))
    if max_degree == 1:
        return ordinary
    # The corners (one axis at its largest degree) as extra choices after the
    # largest world: a third of the draws, and a corner shrinks as an ordinary
    # choice does, by its index, towards smaller worlds (a separate "corner?"
    # draw would not: zeroing it changes what every later draw means).
    corners = tuple(sorted(f for f in by_size[max_degree] if sorted(f)[:-1] == [1] * (n_axes - 1)))
    copies = -(-len(ordinary) // 2)
    return ordinary + ((max_degree, corners),) * copies


# The composite strategies are defined once, at module level, and take their
# parameters as arguments: Hypothesis inspects a function's source each time
# ``@st.composite`` decorates it (about 2.5 ms), so a composite defined inside
# a strategy function that is called per draw (a mask row per row) would cost
# more than many of the cases drawn from it.


@st.composite
def _layouts(
    draw: st.DrawFn, choices: tuple[tuple[int, tuple[tuple[int, ...], ...]], ...], axes: tuple[str, ...]
) -> Layout:
    _, factorisations = draw(st.sampled_from(choices))
    sizes = draw(st.sampled_from(factorisations))
    return Layout(**dict(zip(axes, sizes)))


def token_masks(
    batch: int, seq_len: int, *, allow_empty_rows: bool = True
) -> st.SearchStrategy[torch.Tensor]:
    """``[batch, seq_len]`` 0/1 masks with uneven counts: all-zero rows, rows
    whose only valid token is the first, and random ones."""
    if batch < 1 or seq_len < 1:
        raise ValueError(f"batch and seq_len must be >= 1, got {batch}, {seq_len}")
    return _token_mask(batch, seq_len, allow_empty_rows)


# The bulk draws below are composites, not ``.map()``s: Hypothesis labels every
# mapped strategy alike, and its mutator copies one labelled span's choices
# over another's (a mask's bytes over a list of weights: the case runs out of
# choices and gives up). A composite has a label of its own.
@st.composite
def _token_mask(draw: st.DrawFn, batch: int, seq_len: int, allow_empty_rows: bool) -> torch.Tensor:
    # One drawn byte string, decoded: a case of any shape is one choice (simdist/strategies/_masks.py).
    size = _masks.token_mask_bytes(batch, seq_len)
    blob = draw(st.binary(min_size=size, max_size=size))
    rows = _masks.decode_token_mask(blob, batch=batch, seq_len=seq_len, allow_empty_rows=allow_empty_rows)
    return torch.tensor(rows, dtype=torch.long)


# ------------------------------------------------------------------ fuzzing
#
# The strategies below return plain data (ints, floats, strings, lists and
# NamedTuples of them) rather than tensors or live objects wherever that is
# possible, so a fuzz case built from them has a readable JSON form that
# rebuilds exactly the same inputs on replay. Every choice lists its simplest
# option first: Hypothesis shrinks towards it.

MASK_ROW_KINDS: tuple[str, ...] = ("full", "empty", "prefix", "single", "first_only", "random")
# Mask values other than 0/1 weight a token; 1.0 first so masks shrink to 0/1.
# The non-dyadic values (0.1, 1/3, 1.01) are inexact in bfloat16 and float16:
# a bug that keeps weights or weighted counts in low precision shows only with
# them (dyadic values such as 0.5 round-trip exactly).
MASK_SCALES: tuple[float, ...] = (1.0, 0.5, 2.0, 0.25, 0.1, 1.01)
WEIGHT_VALUES: tuple[float, ...] = (1.0, 0.0, 0.5, 2.0, 0.125, 1000.0, 0.1, 1 / 3, 1.01)
DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16")
REDUCTION_NAMES: tuple[str, ...] = ("rank", "ring", "tree", "shuffled")
FUZZ_FAULT_KINDS: tuple[str, ...] = ("crash", "timeout", "abort", "delay")


# bfloat16 has 8 significant bits: every integer up to 256 is exact, 257 rounds
# to 256. A token count kept in bfloat16 (on a rank, or in the DP sum) is only
# wrong past it, so the default strategies draw counts past it too.
BF16_EXACT_INTEGERS = 256


def sequence_lengths(
    short: tuple[int, int] = (2, 6), long: tuple[int, int] = (129, 320), long_every: int = 8
) -> st.SearchStrategy[int]:
    """Sequence lengths: mostly ``short``, one draw in ``long_every`` from ``long``.

    The default long lengths put one full row, or the DP sum of two, past
    bfloat16's exact integers (``BF16_EXACT_INTEGERS``), where a count kept
    in low precision goes wrong; ``token_distributions``
    and ``mask_rows`` draw long rows cheaply. ``long_every=0`` draws short
    lengths only. Shrinks towards the shortest short length."""
    for name, (low, high) in (("short", short), ("long", long)):
        if not (is_int(low, 1) and is_int(high, low)):
            raise ValueError(
                f"sequence_lengths: {name} must be (low, high) with 1 <= low <= high, got {(low, high)!r}"
            )
    if not is_int(long_every, 0) or long_every == 1:
        raise ValueError(f"sequence_lengths: long_every must be 0 or an int >= 2, got {long_every!r}")
    if long_every == 0:
        return st.integers(*short)
    low, high = long
    return _sequence_length(_length_slots(tuple(short), long_every), (low, high))


_LONG = 0  # a slot meaning "draw a long length"


@functools.lru_cache(maxsize=32)
def _length_slots(short: tuple[int, int], long_every: int) -> tuple[int, ...]:
    """The short lengths in ascending order, each repeated, then the long slots, so
    that one draw in ``long_every`` is long. A long slot is next to the longest
    short length: Hypothesis shrinks the slot index step by step, so a 129-token
    case that fails at 6 tokens shrinks to 6 (a separate "long?" draw flipped to
    short reset the length to the shortest and lost the failure)."""
    shorts = range(short[0], short[1] + 1)
    repeat = long_every - 1
    # Twice the nominal long slots: Hypothesis draws low indices more often than
    # uniform (measured: 9-22% of draws long, depending on the run).
    return tuple(n for n in shorts for _ in range(repeat)) + (_LONG,) * (2 * len(shorts))


@st.composite
def _sequence_length(draw: st.DrawFn, slots: tuple[int, ...], long: tuple[int, int]) -> int:
    slot = draw(st.sampled_from(slots))
    # Drawn whatever the slot: every case makes the same choices (Hypothesis'
    # first cases of a run allow few more choices than the simplest one makes).
    long_length = draw(st.integers(*long))
    return long_length if slot == _LONG else slot


def mask_rows(seq_len: int, *, fractional: bool = True) -> st.SearchStrategy[list[float]]:
    """One row of a token mask as ``seq_len`` floats, of a kind drawn from
    ``MASK_ROW_KINDS``: fully valid, all masked, a valid prefix of any length
    (uneven lengths), a single valid token, only the first token valid (no
    shifted token left), or random; with ``fractional`` the valid tokens of a
    row may carry a weight other than 1 (random rows also mix values; past
    32 tokens a random row repeats a drawn 32-token pattern). Shrinks towards
    a fully valid 0/1 row."""
    check_int("seq_len", seq_len, minimum=1, prefix="mask_rows: ")
    return _mask_row(seq_len, fractional)


@st.composite
def _mask_row(draw: st.DrawFn, seq_len: int, fractional: bool) -> list[float]:
    blob = draw(st.binary(min_size=_masks.ROW_BYTES, max_size=_masks.ROW_BYTES))
    return _masks.decode_row(blob, 0, seq_len, fractional=fractional, scales=MASK_SCALES)


def token_distributions(
    ranks: int,
    microbatches: int,
    seq_len: int,
    *,
    rows_per_microbatch: tuple[int, int] = (1, 2),
    fractional: bool = True,
    remainders: bool = False,
) -> st.SearchStrategy[list[list[list[list[float]]]]]:
    """Token masks per data-parallel rank and microbatch: ``masks[rank][microbatch][row][position]``.

    Each rank draws its own number of rows per microbatch (so ranks hold
    different numbers of rows and tokens), and may be all masked; each
    microbatch may be all masked; rows are drawn by ``mask_rows``. With
    ``remainders``, a rank's first microbatches may hold one row more than its
    others (its rows do not divide by the microbatch count; ``tensor_split``
    gives the microbatches back). Shrinks towards one row per microbatch, no
    remainder, fully valid 0/1 masks. Draw ``seq_len`` from
    ``sequence_lengths()`` to get counts past bfloat16's exact integers.
    """
    for name, value, low in (("ranks", ranks, 1), ("microbatches", microbatches, 1), ("seq_len", seq_len, 1)):
        if not is_int(value, low):
            raise ValueError(f"token_distributions: {name} must be an int >= {low}, got {value!r}")
    low_rows, high_rows = rows_per_microbatch
    if not 1 <= low_rows <= high_rows:
        raise ValueError(
            f"token_distributions: rows_per_microbatch must be (low, high) with 1 <= low <= high, "
            f"got {rows_per_microbatch!r}"
        )
    slots = high_rows + (1 if remainders else 0)
    if ranks * microbatches * slots > _masks.MAX_ROWS:
        raise ValueError(
            f"token_distributions: ranks * microbatches * rows_per_microbatch[1] = "
            f"{ranks * microbatches * slots} rows, more than the {_masks.MAX_ROWS} one Hypothesis case "
            f"can hold{' (with remainders, a microbatch has room for one row more)' if remainders else ''}"
        )
    return _token_distributions(ranks, microbatches, seq_len, low_rows, high_rows, fractional, remainders)


@st.composite
def _token_distributions(
    draw: st.DrawFn,
    ranks: int,
    microbatches: int,
    seq_len: int,
    low_rows: int,
    high_rows: int,
    fractional: bool,
    remainders: bool,
) -> list[list[list[list[float]]]]:
    # One drawn byte string, decoded: the case makes one choice whatever its
    # number of ranks, microbatches and rows (simdist/strategies/_masks.py says why).
    size = _masks.distribution_bytes(ranks, microbatches, high_rows, remainders)
    return _masks.decode_distribution(
        draw(st.binary(min_size=size, max_size=size)),
        ranks=ranks,
        microbatches=microbatches,
        seq_len=seq_len,
        low_rows=low_rows,
        high_rows=high_rows,
        fractional=fractional,
        scales=MASK_SCALES,
        remainders=remainders,
    )


def bin_weights(num_bins: tuple[int, int] = (1, 4)) -> st.SearchStrategy[tuple[float, ...]]:
    """Non-negative bin weights, from ``WEIGHT_VALUES``: zero, fractional and
    large weights; shrinks towards a single weight of 1."""
    low, high = num_bins
    if not 1 <= low <= high:
        raise ValueError(f"bin_weights: num_bins must be (low, high) with 1 <= low <= high, got {num_bins!r}")
    return _bin_weights(low, high)


@st.composite
def _bin_weights(draw: st.DrawFn, low: int, high: int) -> tuple[float, ...]:
    # ``high`` slots, each a "present?" flag and a weight, drawn whatever the
    # flags say: every case makes the same choices (a list's varying length let
    # Hypothesis' mutator run a case out of choices: gave_up). Absent is the
    # simplest flag, so the shrinker drops weights as it would a list's; too
    # few present are filled with weight 1 up to ``low``.
    slots = [(draw(st.booleans()), draw(st.sampled_from(WEIGHT_VALUES))) for _ in range(high)]
    present = [weight for keep, weight in slots if keep]
    return tuple([1.0] * (low - len(present)) + present)


def dtype_names(names: Sequence[str] = DTYPE_NAMES) -> st.SearchStrategy[str]:
    """Floating dtypes by name (``getattr(torch, name)`` gives the dtype); float32 first."""
    for name in names:
        if not isinstance(getattr(torch, name, None), torch.dtype):
            raise ValueError(f"dtype_names: {name!r} is not a torch dtype")
    return st.sampled_from(tuple(names))


class ReductionChoice(NamedTuple):
    """A reduction-order model and its seed, as ``simdist.run`` takes them."""

    model: str
    seed: int = 0

    def run_kwargs(self) -> dict[str, object]:
        return {"reduction": self.model, "seed": self.seed}


def reductions(
    models: Sequence[str] = REDUCTION_NAMES, *, max_seed: int = 2**16
) -> st.SearchStrategy[ReductionChoice]:
    """Reduction-order models with seeds (only ``shuffled`` uses its seed, the
    others keep seed 0); shrinks towards ``rank`` order."""
    unknown = [m for m in models if m not in REDUCTION_NAMES]
    if unknown or not models:
        raise ValueError(f"reductions: models must be some of {REDUCTION_NAMES}, got {list(models)}")
    return _reductions(tuple(models), max_seed)


@st.composite
def _reductions(draw: st.DrawFn, models: tuple[str, ...], max_seed: int) -> ReductionChoice:
    model = draw(st.sampled_from(models))
    seed = draw(st.integers(0, max_seed))  # drawn for every model: the same choices in every case
    return ReductionChoice(model, seed if model == "shuffled" else 0)


def faults(
    world_size: int,
    *,
    kinds: Sequence[str] = FUZZ_FAULT_KINDS,
    ops: Sequence[str | None] = ("all_reduce", None),
    groups: Sequence[str | None] = (None, "tp", "dp", "pp"),
    max_nth: int = 8,
    delay_seconds: float = 0.001,
) -> st.SearchStrategy[Fault]:
    """One ``simdist.Fault`` on a rank of a ``world_size`` world: a kind, an op
    and group filter and the n-th matching call. Corruption is left out by
    default: a corrupted sum that raises nothing is a wrong result, not an
    abort, so "retry equals a clean run" does not apply to it (pass
    ``kinds=KINDS`` to draw it too). A fault whose call never comes does not
    fire. Shrinks towards a crash of rank 0 at its first all_reduce."""
    check_int("world_size", world_size, minimum=1, prefix="faults: ")
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"faults: kinds must be some of {KINDS}, got {list(kinds)}")
    if max_nth < 1:
        raise ValueError(f"faults: max_nth must be >= 1, got {max_nth}")
    return _faults(world_size, tuple(kinds), tuple(ops), tuple(groups), max_nth, delay_seconds)


@st.composite
def _faults(
    draw: st.DrawFn,
    world_size: int,
    kinds: tuple[str, ...],
    ops: tuple[str | None, ...],
    groups: tuple[str | None, ...],
    max_nth: int,
    delay_seconds: float,
) -> Fault:
    kind = draw(st.sampled_from(kinds))
    rank = draw(st.integers(0, world_size - 1))
    op = draw(st.sampled_from(ops))
    group = draw(st.sampled_from(groups))
    nth = draw(st.integers(1, max_nth))
    mode = draw(st.sampled_from(CORRUPT_MODES))  # drawn for every kind: the same choices in every case
    return Fault(
        kind,
        rank=rank,
        op=op,
        group=group,
        nth=nth,
        mode=mode if kind == "corrupt" else "nan",
        seconds=delay_seconds,
    )


def fault_plans(
    world_size: int, *, max_faults: int = 2, **fault_options: object
) -> st.SearchStrategy[FaultPlan]:
    """``simdist.FaultPlan`` of 0..``max_faults`` faults drawn by ``faults``; shrinks towards no fault."""
    if not is_int(max_faults, 0):
        raise ValueError(f"fault_plans: max_faults must be an int >= 0, got {max_faults!r}")
    # A count, then all ``max_faults`` faults (the first ``count`` kept): every
    # case makes the same choices, so none overruns Hypothesis' early size limit.
    each = faults(world_size, **fault_options)  # type: ignore[arg-type]  # options are faults()' keywords
    return _fault_plans(max_faults, each)


@st.composite
def _fault_plans(draw: st.DrawFn, max_faults: int, each: st.SearchStrategy[Fault]) -> FaultPlan:
    count = draw(st.integers(0, max_faults))
    drawn = [draw(each) for _ in range(max_faults)]
    return FaultPlan(tuple(drawn[:count]))


def fault_to_json(fault: Fault) -> dict[str, object]:
    """A ``Fault`` as a JSON-able dict (``fault_from_json`` inverts it)."""
    data = asdict(fault)
    data["where"] = [list(pair) for pair in fault.where]
    return data


def fault_from_json(data: Mapping[str, object]) -> Fault:
    """The ``Fault`` that ``fault_to_json`` wrote (a case file's fault, read back)."""
    fields = dict(data)
    fields["where"] = tuple((str(axis), int(index)) for axis, index in fields.get("where", ()))  # type: ignore[attr-defined]  # JSON values are untyped objects
    return Fault(**fields)  # type: ignore[arg-type]  # JSON values are untyped objects


class ProbeFault(NamedTuple):
    """An exception raised on ``rank`` when the code under test reaches the named
    probe ``point`` (code under test calls a probe at points of its own), on
    the first attempt only; the retry runs clean."""

    point: str
    rank: int


def probe_faults(points: Sequence[str], world_size: int) -> st.SearchStrategy[ProbeFault]:
    """A probe point (from ``points``, listed simplest first) and a rank."""
    if not points:
        raise ValueError("probe_faults: need at least one probe point")
    check_int("world_size", world_size, minimum=1, prefix="probe_faults: ")
    return st.builds(ProbeFault, st.sampled_from(tuple(points)), st.integers(0, world_size - 1))
