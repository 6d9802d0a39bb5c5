"""Fixtures shared by every test folder (see tests/README.md for the layout).

Helper modules live in tests/support/ and are put on the import path once by
pyproject's ``pythonpath`` setting, so no test patches ``sys.path``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist.debug import _options as debug_options


def pytest_configure(config: pytest.Config) -> None:
    # A test run started in the background without job control (`cmd &` in a
    # script, nohup) inherits SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler, for itself or for the interpreters it starts.
    # The Ctrl-C tests need what an interactive run has.
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    ):
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Nothing here imports tests/support: `simdist replay` and campaign workers import
# this file outside pytest's configuration, where that folder is not on the path.


def sum_ranks(ctx: simdist.RankContext) -> float:
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    return t.item()


@pytest.fixture
def clean_world() -> Iterator[None]:
    """For tests that abuse simdist: afterwards no thread simdist started is
    alive, no default group is left initialised, and the next run works."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == [], f"threads left running after the run: {left}"
    assert not dist.is_initialized()
    assert simdist.run(sum_ranks, world_size=3, timeout=30.0) == [3.0, 3.0, 3.0]


@pytest.fixture(autouse=True)
def _debug_defaults_left_as_found() -> Iterator[None]:
    """A test that leaves simdist.debug's defaults changed (trace-on-failure
    switched on through the environment, a ``debug.defaults()`` block never
    closed) makes every later failing run write a trace: it fails here, and
    the defaults are put back for the tests after it."""
    before = debug_options.state()
    yield
    after = debug_options.state()
    if after != before:
        debug_options.restore_state(before)
        pytest.fail(
            f"the test left simdist.debug's defaults changed: {debug_options.TRACE_ENV}="
            f"{after[0]!r} (was {before[0]!r}), {len(after[1])} open defaults() block(s) "
            f"(was {len(before[1])})",
            pytrace=False,
        )
