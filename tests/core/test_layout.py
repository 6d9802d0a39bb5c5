"""Layout: Megatron rank order, group membership and input validation.

Expected values come from ``collective_reference`` (a numpy reshape of the world
grid) or from the rank formula written out here, never from Layout itself.
"""

from __future__ import annotations

import itertools
import re

import pytest
from collective_reference import Sizes, megatron_rank, reference_coords, reference_group_ranks
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist import Layout

AXES = ("tp", "cp", "dp", "pp")
GROUP_AXES = ("tp", "cp", "dp", "pp", "dp_cp", "mp", "world")


@st.composite
def sizes(draw: st.DrawFn) -> Sizes:
    """Axis sizes of 1..4 each, non-powers of two included; worlds above 48 ranks
    keep only tp and dp so examples stay cheap without rejecting draws."""
    s = Sizes(**{a: draw(st.integers(1, 4)) for a in AXES})
    return s if s.world_size <= 48 else Sizes(tp=s.tp, dp=s.dp)


def layout_of(s: Sizes) -> Layout:
    return Layout(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp)


EXAMPLES = [
    Sizes(),
    Sizes(tp=2, dp=2, pp=2),
    Sizes(tp=3, dp=2, pp=2),
    Sizes(tp=2, cp=3, dp=1, pp=2),
    Sizes(tp=1, cp=2, dp=3, pp=1),
    Sizes(tp=4, cp=1, dp=1, pp=3),
]


@pytest.mark.parametrize("s", EXAMPLES, ids=str)
def test_world_size_is_product_of_axes(s: Sizes) -> None:
    assert layout_of(s).world_size == s.tp * s.cp * s.dp * s.pp


def test_megatron_order_by_hand() -> None:
    # tp fastest, then cp, dp, pp: tp=2, cp=1, dp=2, pp=2 written out.
    layout = Layout(tp=2, cp=1, dp=2, pp=2)
    expected = {
        0: (0, 0, 0, 0),
        1: (1, 0, 0, 0),
        2: (0, 0, 1, 0),
        3: (1, 0, 1, 0),
        4: (0, 0, 0, 1),
        5: (1, 0, 0, 1),
        6: (0, 0, 1, 1),
        7: (1, 0, 1, 1),
    }
    assert {r: tuple(layout.coords(r)) for r in range(8)} == expected
    assert layout.group_ranks("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.group_ranks("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.group_ranks("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.group_ranks("mp") == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert layout.group_ranks("dp_cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.group_ranks("cp") == [[r] for r in range(8)]
    assert layout.group_ranks("world") == [list(range(8))]


def test_coords_fields_are_named_in_tp_cp_dp_pp_order() -> None:
    c = Layout(tp=2, cp=3, dp=2, pp=2).coords(megatron_rank(Sizes(2, 3, 2, 2), tp=1, cp=2, dp=0, pp=1))
    assert (c.tp, c.cp, c.dp, c.pp) == (1, 2, 0, 1)
    assert tuple(c) == (1, 2, 0, 1)


@settings(max_examples=25, deadline=None)
@given(sizes())
def test_coords_match_megatron_formula_and_round_trip(s: Sizes) -> None:
    layout = layout_of(s)
    seen = set()
    for tp, cp, dp, pp in itertools.product(range(s.tp), range(s.cp), range(s.dp), range(s.pp)):
        rank = megatron_rank(s, tp=tp, cp=cp, dp=dp, pp=pp)
        assert layout.rank_of(tp=tp, cp=cp, dp=dp, pp=pp) == rank
        assert tuple(layout.coords(rank)) == (tp, cp, dp, pp)
        seen.add(rank)
    assert seen == set(range(s.world_size))
    for rank in range(s.world_size):
        c = layout.coords(rank)
        assert tuple(c) == reference_coords(s, rank)
        assert layout.rank_of(tp=c.tp, cp=c.cp, dp=c.dp, pp=c.pp) == rank


@settings(max_examples=25, deadline=None)
@given(sizes())
def test_group_ranks_match_independent_reshape(s: Sizes) -> None:
    layout = layout_of(s)
    for axis in GROUP_AXES:
        assert layout.group_ranks(axis) == reference_group_ranks(s, axis), axis


@settings(max_examples=20, deadline=None)
@given(sizes())
def test_groups_partition_the_world_and_vary_only_their_axes(s: Sizes) -> None:
    layout = layout_of(s)
    varying = {
        "tp": {"tp"},
        "cp": {"cp"},
        "dp": {"dp"},
        "pp": {"pp"},
        "dp_cp": {"dp", "cp"},
        "mp": {"tp", "pp"},
        "world": set(AXES),
    }
    for axis, axes in varying.items():
        groups = layout.group_ranks(axis)
        flat = [r for g in groups for r in g]
        assert sorted(flat) == list(range(s.world_size)), axis
        expected_size = 1
        for a in axes:
            expected_size *= getattr(s, a)
        assert all(len(g) == expected_size for g in groups), axis
        for g in groups:
            coords = [reference_coords(s, r) for r in g]
            for i, a in enumerate(AXES):
                if a not in axes:
                    assert len({c[i] for c in coords}) == 1, (axis, a, g)


@settings(max_examples=15, deadline=None)
@given(sizes(), st.data())
def test_group_of_is_the_group_holding_the_rank(s: Sizes, data: st.DataObject) -> None:
    layout = layout_of(s)
    rank = data.draw(st.integers(0, s.world_size - 1))
    for axis in GROUP_AXES:
        group = layout.group_of(axis, rank)
        assert rank in group
        assert group in reference_group_ranks(s, axis)


def test_world_size_argument_is_checked() -> None:
    assert Layout(tp=2, dp=3, world_size=6).world_size == 6


def test_world_size_mismatch_lists_every_degree() -> None:
    with pytest.raises(ValueError) as info:
        Layout(tp=3, cp=1, dp=2, pp=2, world_size=8)
    message = str(info.value)
    assert "dp(2) * cp(1) * tp(3) * pp(2)" in message
    assert "world_size(8)" in message
    assert "12" in message


@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("bad", [0, -1, -4])
def test_non_positive_size_is_rejected_naming_the_axis(axis: str, bad: int) -> None:
    with pytest.raises(ValueError) as info:
        Layout(**{axis: bad})
    message = str(info.value)
    assert re.search(rf"\b{axis}\b", message), message
    assert str(bad) in message


@pytest.mark.parametrize("bad", ["2", 2.5, None])
def test_non_integer_size_is_rejected(bad: object) -> None:
    # A wrong type may fairly be a TypeError; what matters is a clear message.
    with pytest.raises((ValueError, TypeError)) as info:
        Layout(dp=bad)  # type: ignore[arg-type]
    message = str(info.value)
    assert "dp" in message and repr(bad) in message


@pytest.mark.parametrize("axis", ["ep", "TP", "", "data"])
def test_unknown_axis_is_rejected_listing_the_known_ones(axis: str) -> None:
    layout = Layout(tp=2, dp=2)
    with pytest.raises(ValueError) as info:
        layout.group_ranks(axis)
    message = str(info.value)
    assert repr(axis) in message
    for known in GROUP_AXES:
        assert known in message
    with pytest.raises(ValueError):
        layout.group_of(axis, 0)


@pytest.mark.parametrize("rank", [-1, 4, 100])
def test_out_of_range_rank_is_rejected(rank: int) -> None:
    layout = Layout(tp=2, dp=2)
    with pytest.raises(ValueError) as info:
        layout.coords(rank)
    assert str(rank) in str(info.value) and "4" in str(info.value)
    with pytest.raises(ValueError):
        layout.group_of("tp", rank)


@pytest.mark.parametrize("axis,index", [("tp", 2), ("cp", 1), ("dp", -1), ("pp", 3)])
def test_out_of_range_coordinate_is_rejected_naming_the_axis(axis: str, index: int) -> None:
    layout = Layout(tp=2, cp=1, dp=3, pp=3)
    with pytest.raises(ValueError) as info:
        layout.rank_of(**{axis: index})
    assert re.search(rf"\b{axis}\b", str(info.value)), str(info.value)
    assert str(index) in str(info.value)
