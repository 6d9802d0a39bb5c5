"""Every known difference between simdist and gloo is still there, exactly as registered.

Each entry of ``diff_known.KNOWN`` carries its minimal program; its pin runs
that program on both worlds and checks that the comparison finds a
difference the entry (and only the entry) explains. When simdist is fixed,
the pin fails: remove the entry (and its row in docs/differences.md).
"""

from __future__ import annotations

import diff_worlds
import pytest
from diff_compare import compare
from diff_known import KNOWN, Known, explain, new_differences

pytestmark = pytest.mark.gloo


@pytest.mark.parametrize("known", KNOWN, ids=[k.name for k in KNOWN])
def test_pinned(known: Known) -> None:
    program = known.program()
    sim = diff_worlds.run_simdist(program)
    for _ in range(known.tries):  # a difference that needs gloo to lose a race: until it shows
        gloo = diff_worlds.run_gloo(program, expect_hang=bool(sim.hung))
        found = compare(program, gloo, sim)
        assert not new_differences(program, found), [str(d) for d in new_differences(program, found)]
        explained = [d for d in found if explain(program, d, found) is known]
        if explained:
            break
    assert explained, f"{known.name} no longer shows for {program}; differences: {[str(d) for d in found]}"


def test_entries_are_distinct_and_explained() -> None:
    names = [k.name for k in KNOWN]
    assert len(set(names)) == len(names)
    for known in KNOWN:
        assert len(known.reason) > 40, known.name
        assert known.pinned_by.endswith(f"test_pinned[{known.name}]")
