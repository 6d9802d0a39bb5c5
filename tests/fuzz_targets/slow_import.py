"""A target whose import takes longer than the campaign's budget: it must still
get its rounds (the budget counts from the worker being ready)."""

from __future__ import annotations

import os
import time

from hypothesis import given
from hypothesis import strategies as st

from simdist import fuzz

time.sleep(float(os.environ.get("SLOW_IMPORT_SECONDS", "4")))


@given(case=st.fixed_dictionaries({"n": st.integers(0, 10)}))
@fuzz.replayable(dict)
def test_after_a_slow_import(case: dict) -> None:
    fuzz.cover(n=case["n"])
