"""simdist.strategies' reach: cost-weighted layouts, swarm features, microbatch remainders."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, find, given, seed, settings
from hypothesis import strategies as st

from simdist import strategies as S

AXES = ("tp", "cp", "dp", "pp")


def _draws(strategy: st.SearchStrategy, examples: int = 300) -> list:
    out: list = []

    @seed(0)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def draw(value) -> None:
        out.append(value)

    draw()
    return out


def test_cost_weighted_layouts_reach_every_degree_of_every_axis_within_the_bound() -> None:
    layouts = _draws(S.layouts(max_world_size=64, axes=AXES, max_degree=8, weighting="cost"), 600)
    assert all(layout.world_size <= 64 for layout in layouts)
    for axis in AXES:
        degrees = Counter(getattr(layout, axis) for layout in layouts)
        assert set(degrees) == set(range(1, 9)), (axis, degrees)
        assert sum(n for d, n in degrees.items() if d >= 5) >= 0.03 * len(layouts), (axis, degrees)


def test_cost_weighted_layouts_spend_most_cases_on_small_worlds() -> None:
    # The "world" weighting draws the world size uniformly: mostly large worlds at bound 64.
    cost = [
        layout.world_size
        for layout in _draws(S.layouts(max_world_size=64, axes=AXES, max_degree=8, weighting="cost"))
    ]
    world = [layout.world_size for layout in _draws(S.layouts(max_world_size=64, axes=AXES, max_degree=8))]
    assert sorted(cost)[len(cost) // 2] <= 16 < sorted(world)[len(world) // 2]


@pytest.mark.parametrize("axis", AXES)
def test_a_failure_at_degree_4_or_more_shrinks_to_degree_4_with_every_other_axis_at_1(axis: str) -> None:
    strategy = S.layouts(max_world_size=64, axes=AXES, max_degree=8, weighting="cost")
    # Its own budget and seed: the suite's profile (10 examples) often draws no
    # degree >= 4 on a given axis at all, and then find() has nothing to shrink.
    searching = settings(settings.get_profile("default"), database=None, derandomize=True, max_examples=1000)
    smallest = find(strategy, lambda layout: getattr(layout, axis) >= 4, settings=searching)
    assert getattr(smallest, axis) == 4 and smallest.world_size == 4, smallest


def test_cost_weighting_respects_a_small_bound_and_refuses_an_unknown_weighting() -> None:
    assert all(
        layout.world_size <= 6
        for layout in _draws(S.layouts(max_world_size=6, axes=AXES, weighting="cost"), 100)
    )
    with pytest.raises(ValueError, match="weighting must be one of"):
        S.layouts(weighting="uniform")


def test_swarm_turns_a_random_subset_of_features_off_and_shrinks_to_none() -> None:
    names = ("a", "b", "c", "d")
    drawn = _draws(S.swarm(names), 200)
    assert all(isinstance(features, S.Features) and features <= set(names) for features in drawn)
    for name in names:
        share = sum(features.on(name) for features in drawn) / len(drawn)
        assert 0.3 < share < 0.7, (name, share)
    assert len({frozenset(f) for f in drawn}) == 16  # every subset
    assert find(S.swarm(names), lambda features: True, settings=settings(database=None)) == S.Features()


def test_swarm_off_keeps_every_feature_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(S.SWARM_ENV, "0")
    assert all(features == set("ab") for features in _draws(S.swarm(("a", "b")), 50))
    monkeypatch.setenv(S.SWARM_ENV, "no")
    with pytest.raises(ValueError, match="SIMDIST_FUZZ_SWARM must be 0 or 1"):
        _draws(S.swarm(("a",)), 1)


@pytest.mark.parametrize("features", [(), ("a", "a"), ("a", 1)])
def test_swarm_refuses_features_that_are_not_distinct_names(features) -> None:
    with pytest.raises(ValueError, match="features must be distinct names"):
        S.swarm(features)


def test_remainders_split_a_ranks_rows_as_tensor_split_does() -> None:
    import torch

    seen_remainder = False
    for masks in _draws(S.token_distributions(3, 3, 4, rows_per_microbatch=(1, 3), remainders=True), 200):
        for rank in masks:
            sizes = [len(micro) for micro in rank]
            total = sum(sizes)
            assert sizes == [len(part) for part in torch.arange(total).tensor_split(3)], sizes
            seen_remainder |= len(set(sizes)) > 1
    assert seen_remainder
