"""Small properties with known answers, for testing the campaign machinery itself.

Not collected by the normal test run (the file name does not start with
``test_``); tests/fuzz_runner/test_fuzz_campaign.py fuzzes it with ``simdist fuzz``.
The planted bug: ``buggy_sum`` drops the last element of lists longer than
three, so the shrunk counterexample is a list of four zeros... except that a
sum of zeros hides the bug, so the minimal case has one non-zero element.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from simdist import fuzz


@dataclass(frozen=True)
class ListCase:
    values: tuple[int, ...]

    def to_json(self) -> dict:
        return {"values": list(self.values)}

    @classmethod
    def from_json(cls, data: dict) -> ListCase:
        return cls(tuple(int(v) for v in data["values"]))


def buggy_sum(values: tuple[int, ...]) -> int:
    if os.environ.get("TOY_FIXED") == "1":
        return sum(values)
    return sum(values[:3]) if len(values) > 3 else sum(values)


list_cases = st.builds(ListCase, st.lists(st.integers(-1000, 1000), max_size=8).map(tuple))


@given(case=list_cases)
@fuzz.replayable(ListCase.from_json)
def test_buggy_sum_matches_builtin(case: ListCase) -> None:
    fuzz.cover(length=len(case.values), tp=min(len(case.values), 4), dtype="int")
    assert buggy_sum(case.values) == sum(case.values), f"buggy_sum{case.values} != {sum(case.values)}"


@given(case=list_cases)
@fuzz.replayable(ListCase.from_json)
def test_sorted_is_ordered(case: ListCase) -> None:
    fuzz.cover(length=len(case.values))
    out = sorted(case.values)
    assert all(a <= b for a, b in itertools.pairwise(out))


def test_not_a_property() -> None:
    assert True
