"""Hypothesis strategies for differential programs (small, shrinkable, plain data).

Most drawn calls are valid on every backend; combinations that a backend may
refuse (a reduce op the dtype does not support, a strided output where a
contiguous one is needed, 0-dim tensors where a dim 0 is needed) are drawn
as often as the options make them, so "both refuse" is exercised too. A few
steps skip a member (``skip``): a hang on both sides, costly on gloo (the
world is killed and restarted), so rare.
"""

from __future__ import annotations

from typing import Any

from diff_program import DTYPES, OPS, REDUCE_OPS, VIEWS, Program, step
from hypothesis import strategies as st

MAX_WORLD = 6
FLOATS = ("float32", "float64", "bfloat16", "float16")
INTEGERS = ("int8", "uint8", "int32", "int64")


def _red_for(dtype: str) -> st.SearchStrategy[str]:
    """Mostly an op the dtype supports; sometimes any (both should refuse)."""
    valid: tuple[str, ...]
    if dtype in FLOATS:
        valid = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
    elif dtype == "complex64":
        valid = ("SUM", "AVG", "PRODUCT")
    else:
        valid = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
    return st.one_of(st.sampled_from(valid), st.sampled_from(REDUCE_OPS)) if valid else st.just("SUM")


shapes: st.SearchStrategy[list[int]] = st.one_of(
    st.lists(st.integers(1, 3), min_size=1, max_size=2),
    st.just([]),  # 0-dim
    st.lists(st.integers(0, 2), min_size=1, max_size=2),  # 0-size allowed
)


@st.composite
def steps(draw: Any, world: int) -> dict[str, Any]:
    op = draw(st.sampled_from(OPS))
    p2p = op in ("send_recv", "batch_ring")
    if draw(st.booleans()) and not (p2p and world < 2):
        group = None
    else:
        group = sorted(draw(st.sets(st.integers(0, world - 1), min_size=2, max_size=world)))
    n = world if group is None else len(group)
    dtype = draw(st.sampled_from(DTYPES))
    saved = draw(st.integers(0, 4)) == 0
    if saved:
        dtype = draw(st.sampled_from(("float32", "float64")))
    fields: dict[str, Any] = {
        "group": group,
        "dtype": dtype,
        "shape": draw(shapes),
        "values": draw(st.sampled_from(("int", "randn"))),
        "red": draw(_red_for(dtype)),
        "root": draw(st.integers(0, n - 1)),
        # Forms gloo refuses or garbles (registry entries) are drawn less often,
        # so most steps reach a value comparison.
        "view": draw(st.sampled_from(VIEWS)) if draw(st.integers(0, 3)) == 1 else "contig",
        "inplace": draw(st.booleans()),
        "stack": draw(st.integers(0, 3)) == 1,
        "uneven": draw(st.booleans()),
        "async": draw(st.booleans()),
        "group_arg": draw(st.booleans()),
        "saved": saved,
        "skip": draw(st.integers(0, 99)) == 37,
    }
    if op == "send_recv":
        fields["peer"] = (fields["root"] + 1 + draw(st.integers(0, n - 2))) % n
    return step(op, **fields)


@st.composite
def programs(draw: Any, max_steps: int = 3) -> Program:
    world = draw(st.integers(2, MAX_WORLD))
    seed = draw(st.integers(0, 2**16))
    drawn = draw(st.lists(steps(world), min_size=1, max_size=max_steps))
    return Program(world=world, seed=seed, steps=tuple(drawn))
