"""The differential property: a random program gives the same outcome on simdist and on gloo.

``simdist fuzz tests/differential`` runs it as a campaign; the suite runs a
few derandomised programs. A failure lists every difference no entry of
``diff_known.KNOWN`` explains, with the program as JSON (also written as a
replayable case by the campaign).
"""

from __future__ import annotations

import diff_worlds
import pytest
from diff_compare import compare, order_defined
from diff_known import new_differences
from diff_program import Program
from diff_strategies import programs
from hypothesis import given

from simdist import fuzz

pytestmark = pytest.mark.gloo


def check_program(program: Program) -> None:
    """Raise AssertionError listing the new differences of ``program``."""
    sim = diff_worlds.run_simdist(program)
    gloo = diff_worlds.run_gloo(program, expect_hang=bool(sim.hung))
    found = compare(program, gloo, sim)
    new = new_differences(program, found)
    assert not new, f"{len(new)} new difference(s) between gloo and simdist for {program}:\n" + "\n".join(
        str(d) for d in new[:20]
    )


@given(program=programs())
@fuzz.replayable(Program.from_json, arg="program")
def test_simdist_agrees_with_gloo(program: Program) -> None:
    for s in program.steps:
        fuzz.cover(op=s["op"], dtype=s["dtype"], view=s["view"], exact=order_defined(program, s))
    fuzz.cover(world=program.world, steps=len(program.steps))
    check_program(program)
