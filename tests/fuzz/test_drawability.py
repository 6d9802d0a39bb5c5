"""Every documented corner of the default campaign's strategies is drawn in at least
5% of cases (tests/fuzz/corners.py): reach before cleverness."""

from __future__ import annotations

import pytest
from corners import FLOOR, draws, shares, targets

_TARGETS = targets()


@pytest.mark.parametrize("name", sorted(_TARGETS))
def test_every_corner_is_drawn_in_its_floor_share_of_cases(name: str) -> None:
    strategy, corners = _TARGETS[name]
    cases = draws(strategy, 150, range(2))
    below = {corner: share for corner, share in shares(cases, corners).items() if share < FLOOR}
    assert not below, f"{name}: corners drawn in under {FLOOR:.0%} of {len(cases)} cases: " + ", ".join(
        f"{corner} {share:.1%}" for corner, share in sorted(below.items())
    )
