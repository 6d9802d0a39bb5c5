"""Properties whose code under test raises a BaseException that is not an
Exception (``sys.exit``, ``KeyboardInterrupt``, ``_thread.exit``), for
tests/fuzz_runner/test_fuzz_base_exceptions.py (not collected by the normal run).
Each fails only for lists longer than three, so its shrunk case is four zeros.
"""

from __future__ import annotations

import sys
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


list_cases = st.builds(ListCase, st.lists(st.integers(0, 9), max_size=8).map(tuple))


@given(case=list_cases)
@fuzz.replayable(ListCase.from_json)
def test_exits_for_long_lists(case: ListCase) -> None:
    if len(case.values) > 3:
        sys.exit(3)


@given(case=list_cases)
@fuzz.replayable(ListCase.from_json)
def test_interrupts_for_long_lists(case: ListCase) -> None:
    if len(case.values) > 3:
        raise KeyboardInterrupt
