"""A property that leaks a thread, then one whose cases hang: a campaign must
report the hang as a failure with its case (never exit 0) and name the leak.

Not collected by the normal test run; tests/test_fuzz_user_path.py fuzzes it.
The leaking property comes first in the file, so its first round runs before
the hanging one stops the worker.
"""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from simdist import fuzz

_forever = threading.Event()


@given(case=st.fixed_dictionaries({"n": st.integers(0, 3)}))
@fuzz.replayable(dict)
def test_leaks_a_thread(case: dict) -> None:
    threading.Thread(target=_forever.wait, name=f"leaked-by-case-{case['n']}", daemon=True).start()


@given(case=st.fixed_dictionaries({"n": st.integers(0, 3)}))
@fuzz.replayable(dict)
def test_hangs(case: dict) -> None:
    _forever.wait()  # never set: every case hangs
