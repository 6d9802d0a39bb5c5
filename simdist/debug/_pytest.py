"""pytest's side of debugging (docs/debugging.md): ``--pdb`` into the failing
rank (pytest's own post-mortem, in pluggy's frames, skipped for that test),
``--simdist-trace-on-failure``, and every live run's stacks next to
faulthandler's dump, which names threads only by id.

A trace is ``DIR/<test id>-<hash>.json``: the id made safe for a file name,
then 8 hex digits of the exact id, so ids that read alike (``[a/b]``,
``[a_b]``) never share a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import threading
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from . import _report
from ._options import TRACE_ENV, defaults

_TRACES = pytest.StashKey[list[str]]()
_DEBUGGED = pytest.StashKey[str]()
_OPTION = "--simdist-trace-on-failure"


def trace_stem(nodeid: str) -> str:
    """A file name stem for a test's trace: readable, and unique per test id."""
    readable = re.sub(r"[^\w.-]+", "_", nodeid).strip("._")[:150] or "test"
    digest = hashlib.sha1(nodeid.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{readable}-{digest}"


def addoption(parser: pytest.Parser) -> None:
    parser.getgroup("simdist").addoption(
        _OPTION,
        metavar="DIR",
        default=os.environ.get(TRACE_ENV) or None,
        help="write the Perfetto trace of each failed test's failing simdist run to DIR/<test id>.json "
        f"(also {TRACE_ENV})",
    )


class DebugPlugin:
    """Registered by simdist's pytest plugin for the whole session."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.usepdb = bool(config.getvalue("usepdb"))
        self.trace_dir: str | None = config.getoption(_OPTION)
        # SIGUSR1 and the faulthandler companion write to the terminal, past
        # pytest's capture (the descriptor is taken before capture resumes).
        self.stream: Any = None
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.stream = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
            _report.set_stream(self.stream)
        self._swapped = False

    def pytest_unconfigure(self) -> None:
        _report.set_stream(None)
        if self.stream is not None:
            with contextlib.suppress(OSError):
                self.stream.close()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # After every plugin's pytest_configure: pytest's --pdb handler exists now.
        pm = self.config.pluginmanager
        inner = pm.getplugin("pdbinvoke")
        if inner is not None and not self._swapped:
            pm.unregister(inner)
            pm.register(_PdbUnlessDebugged(inner), "pdbinvoke")
            self._swapped = True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        __tracebackhide__ = True
        settings: dict[str, Any] = {
            "around_prompt": lambda: _capture_suspended(self.config),
            "on_post_mortem": lambda verdict: item.stash.__setitem__(_DEBUGGED, verdict),
        }
        if self.usepdb:
            settings["post_mortem"] = True
        if self.trace_dir is not None:
            item.stash[_TRACES] = []
            settings.update(
                trace_dir=self.trace_dir,
                trace_name=trace_stem(item.nodeid),
                on_trace=lambda path: item.stash[_TRACES].append(path),
            )
        with defaults(**settings):
            return (yield)

    def pytest_exception_interact(self, node: pytest.Item, call: pytest.CallInfo[Any], report: Any) -> None:
        # After the failure is reported, as pytest's own quit: the session ends.
        if node.stash.get(_DEBUGGED, None) == "quit":
            pytest.exit("Quitting debugger")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, Any]:
        report = yield
        if call.when == "call":
            paths = sorted(set(item.stash.get(_TRACES, None) or ()))
            if report.failed and paths:
                report.sections.append(("simdist trace of the failing run", "\n".join(paths)))
            else:
                for path in paths:
                    with contextlib.suppress(OSError):
                        os.remove(path)
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, Any, Any]:
        timeout = _faulthandler_timeout(self.config)
        if timeout <= 0 or self.stream is None:
            return (yield)
        timer = threading.Timer(timeout, _report.dump, kwargs={"file": self.stream})
        timer.name = "simdist-faulthandler-companion"
        timer.daemon = True
        timer.start()
        try:
            return (yield)
        finally:
            timer.cancel()
            timer.join()


class _PdbUnlessDebugged:
    """pytest's --pdb handler, skipped for a test whose rank was already debugged in its own frame."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def pytest_exception_interact(self, node: pytest.Item, call: pytest.CallInfo[Any], report: Any) -> None:
        if node.stash.get(_DEBUGGED, None) is not None:
            return
        self.inner.pytest_exception_interact(node, call, report)

    def pytest_internalerror(self, excinfo: Any) -> None:
        self.inner.pytest_internalerror(excinfo)


@contextlib.contextmanager
def _capture_suspended(config: pytest.Config) -> Iterator[None]:
    """pytest's output capture off while a prompt is open (as its own pdb does)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        yield
        return
    capman.suspend(in_=True)
    try:
        yield
    finally:
        capman.resume()


def _faulthandler_timeout(config: pytest.Config) -> float:
    try:
        return float(config.getini("faulthandler_timeout") or 0)
    except (ValueError, TypeError):
        return 0.0
