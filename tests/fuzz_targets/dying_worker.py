"""A property whose process dies under it, as a segfault in native code would kill a
worker: the campaign reports a crash (exit 3), apart from property failures."""

import os
import signal

from hypothesis import given
from hypothesis import strategies as st


@given(st.integers())
def test_kills_its_process(value: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)
