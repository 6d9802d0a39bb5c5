"""A property that fails at once but takes long to shrink (each failing case
sleeps 1.5 s, and a full shrink of 20 values needs dozens of failing calls):
stopping the campaign mid-shrink must still report the failure."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from simdist import fuzz


@given(case=st.fixed_dictionaries({"values": st.lists(st.integers(0, 10**6), min_size=20, max_size=20)}))
@fuzz.replayable(dict)
def test_fails_slowly(case: dict) -> None:
    if sum(case["values"]) > 0:
        time.sleep(1.5)
        raise AssertionError(f"sum {sum(case['values'])} > 0")
