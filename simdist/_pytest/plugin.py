"""pytest plugin (auto-loaded): SPMD tests, backends, profiles, a ``simdist_run`` fixture.

A thin layer over the library: everything here can be done without pytest.

- ``@pytest.mark.simdist(layout=Layout(tp=2, dp=2))`` (or ``layouts=[...]``,
  ``world_size=N``) runs the test on every rank; it receives ``ctx``.
- ``--simdist-backend=sim|gloo|nccl`` runs marked tests on the simulator
  (default), on spawned gloo processes, or on one GPU per rank; under torchrun
  the plugin joins the launched world instead of spawning one.
- ``--simdist-profile=dev|ci|nightly`` picks which tests run (``slow`` ones
  only in nightly) and the Hypothesis settings profile.
- ``gpu`` tests are skipped where CUDA is not available.
- ``--simdist-timeout`` bounds every ``simdist_run`` call and marked test.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import inspect
import os
from collections.abc import Callable, Generator
from typing import Any

import pytest

from .._checks import check_positive_seconds
from ..debug import _pytest as debug_pytest
from . import marker
from .profiles import PROFILES, RUNS_SLOW, load_hypothesis_profile, restore_hypothesis_profile
from .runner import SECTIONS, TRACE_DIR, RankFailed

__all__ = ["RankFailed"]

BACKENDS = ("sim", "gloo", "nccl")
_TORCHRUN = pytest.StashKey[Any]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simdist")
    group.addoption(
        "--simdist-profile",
        choices=PROFILES,
        default=os.environ.get("SIMDIST_PROFILE", "ci"),
        help="dev: quick loop; ci (default): slow tests skipped, derandomised Hypothesis; "
        "nightly: every test, many examples (also SIMDIST_PROFILE)",
    )
    group.addoption(
        "--simdist-timeout",
        type=float,
        default=120.0,
        help="watchdog timeout in seconds for each simdist_run call and simdist-marked test (default 120)",
    )
    group.addoption(
        "--simdist-backend",
        choices=BACKENDS,
        default="sim",
        help="where @pytest.mark.simdist tests run: sim (default, threads in this process), "
        "gloo (spawned processes, or the torchrun world), nccl (one GPU per rank)",
    )
    debug_pytest.addoption(parser)  # debug hook: --simdist-trace-on-failure


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs CUDA; skipped where torch.cuda.is_available() is False")
    config.addinivalue_line("markers", "slow: long-running; runs only with --simdist-profile=nightly")
    config.addinivalue_line("markers", "gloo: starts a real gloo world of processes")
    config.addinivalue_line("markers", marker.MARKER_HELP)
    try:  # the same rule as every run's timeout (a watchdog that never fires is none)
        check_positive_seconds("--simdist-timeout", config.getoption("--simdist-timeout"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    profile = config.getoption("--simdist-profile")
    if profile not in PROFILES:
        raise pytest.UsageError(f"--simdist-profile must be one of {PROFILES}, got {profile!r}")
    load_hypothesis_profile(config, profile)
    config.pluginmanager.register(debug_pytest.DebugPlugin(config), "simdist-debug")  # debug hook: --pdb
    backend = config.getoption("--simdist-backend")
    from ..launch import under_torchrun

    if backend != "sim" and under_torchrun():
        if config.getoption("numprocesses", None):
            raise pytest.UsageError(
                "simdist: under torchrun each process is already one rank; do not add pytest-xdist's -n"
            )
        config.stash[_TORCHRUN] = TorchrunWorld(backend, config.getoption("--simdist-timeout"))


def pytest_unconfigure(config: pytest.Config) -> None:
    restore_hypothesis_profile(config)
    world = config.stash.get(_TORCHRUN, None)
    if world is not None:
        world.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    mark = metafunc.definition.get_closest_marker(marker.MARKER)
    if mark is None:
        return
    worlds, _ = marker.parse(mark, metafunc.function, metafunc.definition.name)
    if inspect.iscoroutinefunction(metafunc.function):
        raise TypeError(f"@pytest.mark.simdist on {metafunc.definition.name}: async tests are not supported")
    metafunc.parametrize("ctx", worlds, ids=[w.id for w in worlds])


def _spec_of(item: pytest.Item) -> tuple[marker.WorldSpec, marker.SpmdOptions] | None:
    mark = item.get_closest_marker(marker.MARKER)
    callspec = getattr(item, "callspec", None)
    world = None if callspec is None else callspec.params.get("ctx")
    if mark is None or not isinstance(world, marker.WorldSpec):
        return None
    _, options = marker.parse(mark, item.obj, item.name)  # type: ignore[attr-defined]  # pytest.Item has no obj; the marked Function does
    return world, options


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    runs_slow = RUNS_SLOW[config.getoption("--simdist-profile")]
    backend = config.getoption("--simdist-backend")
    torchrun = config.stash.get(_TORCHRUN, None)
    cuda: tuple[bool, int] | None = None
    for item in items:
        if "slow" in item.keywords and not runs_slow:
            item.add_marker(pytest.mark.skip(reason="slow: run with --simdist-profile=nightly"))
        if "gpu" in item.keywords or backend == "nccl":
            if cuda is None:
                import torch

                cuda = (
                    torch.cuda.is_available(),
                    torch.cuda.device_count() if torch.cuda.is_available() else 0,
                )
            if "gpu" in item.keywords and not cuda[0]:
                item.add_marker(pytest.mark.skip(reason="gpu: CUDA is not available here"))
        spec = _spec_of(item)
        if spec is None or backend == "sim":
            continue
        world, options = spec
        why = options.sim_only_reason()
        if why is not None:
            item.add_marker(
                pytest.mark.skip(reason=f"simulator only, not on --simdist-backend={backend}: {why}")
            )
        elif torchrun is not None and world.world_size != torchrun.world_size:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"{world.id} needs {world.world_size} ranks; torchrun started {torchrun.world_size}"
                )
            )
        elif torchrun is None and backend == "nccl" and cuda is not None and cuda[1] < world.world_size:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"nccl: {world.id} needs {world.world_size} GPUs (one per rank); "
                    f"this machine has {cuda[1]}"
                )
            )


def pytest_collection_finish(session: pytest.Session) -> None:
    torchrun = session.config.stash.get(_TORCHRUN, None)
    if torchrun is not None:
        torchrun.check_same_collection(
            [
                item.nodeid
                for item in session.items
                if _spec_of(item) is not None and not item.get_closest_marker("skip")
            ]
        )


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    spec = _spec_of(pyfuncitem)
    if spec is None:
        return None
    __tracebackhide__ = True
    from . import runner

    world, options = spec
    config = pyfuncitem.config
    timeout = float(options.given.get("timeout") or config.getoption("--simdist-timeout"))
    backend = config.getoption("--simdist-backend")
    torchrun = config.stash.get(_TORCHRUN, None)
    if torchrun is not None:
        runner.run_torchrun(pyfuncitem, world, options, backend, torchrun.side_group)
    elif backend == "sim":
        runner.run_sim(pyfuncitem, world, options, timeout)
    else:
        runner.run_spawned(pyfuncitem, world, options, timeout, backend)
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    sections = item.stash.get(SECTIONS, None)
    if sections and call.when == "call":
        report.sections.extend(sections)
        del item.stash[SECTIONS]
    return report


@pytest.fixture(autouse=True)
def _simdist_trace_dir(request: pytest.FixtureRequest) -> None:
    """A tmp dir for tests marked ``simdist(trace=True)`` (their trace file goes there)."""
    mark = request.node.get_closest_marker(marker.MARKER)
    if mark is not None and mark.kwargs.get("trace") is True:
        request.node.stash[TRACE_DIR] = request.getfixturevalue("tmp_path")


@pytest.fixture
def simdist_run(request: pytest.FixtureRequest) -> Callable[..., list[Any]]:
    """``simdist.run`` with the session's watchdog timeout as default."""
    from .._run import run

    return functools.partial(run, timeout=request.config.getoption("--simdist-timeout"))


class TorchrunWorld:
    """pytest started by torchrun: this process is one rank of a real world.

    The plugin joins that world once per session (``env://``), runs each marked
    test's body as this rank, and uses a side gloo group to agree with the other
    ranks on what was collected and on each test's outcome. A real backend has no
    deadlock detector: a rank that fails while its peers wait in a collective
    leaves them waiting until the process group's timeout (``--simdist-timeout``).
    """

    def __init__(self, backend: str, timeout: float) -> None:
        import torch
        import torch.distributed as dist

        self.backend = backend
        self.owns_default_group = not dist.is_initialized()
        if self.owns_default_group:
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(
                backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout)
            )
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        # Outcomes and collection checks are Python objects: gloo carries them
        # whatever the tests' backend is.
        self.side_group = dist.new_group(backend="gloo")

    def check_same_collection(self, nodeids: list[str]) -> None:
        """Every rank must run the same marked tests in the same order, or the worlds would cross."""
        import torch.distributed as dist

        digest = hashlib.sha256("\n".join(nodeids).encode()).hexdigest()[:16]
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, (digest, len(nodeids)), group=self.side_group)
        if len({d for d, _ in everyone}) > 1:
            table = ", ".join(f"rank {r}: {n} tests ({d})" for r, (d, n) in enumerate(everyone))
            raise pytest.UsageError(
                "simdist under torchrun: the ranks collected different simdist tests ("
                f"{table}); start every rank with the same arguments and files"
            )

    def close(self) -> None:
        import torch.distributed as dist

        if self.owns_default_group and dist.is_initialized():
            dist.destroy_process_group()
