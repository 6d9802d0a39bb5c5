"""PyTorch's own distributed test harnesses, run on simdist (docs/pytorch-tests.md).

Tests written for ``MultiProcessTestCase``, ``MultiThreadedTestCase`` and
``spawn_threads_and_init_comms`` run unchanged, every rank a simdist rank
thread::

    pytest -p simdist.torch_compat test/distributed/test_c10d_gloo.py

or ``simdist.torch_compat.install()`` in a ``conftest.py``. The harnesses'
launchers are replaced; everything else is theirs, and simdist's own
verdicts are raised as they are.

This is the one module of simdist that touches ``torch.testing._internal``,
which is private to PyTorch and changes between releases: ``install``
refuses a torch whose harnesses it has not been checked against
(``KNOWN_TORCH``), naming the version, unless ``SIMDIST_TORCH_COMPAT_ANY=1``
says to try anyway.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
import tempfile
import threading
import time
import traceback
import types
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .._backend import timeouts
from .._core import identity
from .._core.records import Waitable
from .._run import run as simdist_run
from ..errors import RankError, SimulationError
from . import gloo

__all__ = [
    "KNOWN_TORCH",
    "TorchCompatError",
    "check_torch_version",
    "distributed_test_class",
    "harness",
    "install",
    "installed",
    "uninstall",
]

# torch releases (major.minor) whose harnesses this module was checked against.
KNOWN_TORCH = ("2.13",)
_FORCE_ENV = "SIMDIST_TORCH_COMPAT_ANY"

# PyTorch's tests compare sums with gloo's: they run under gloo's order of
# addition (``simdist.reduction.GlooRing``), not simdist's default rank order.
REDUCTION = "gloo"

_COMMON = "torch.testing._internal.common_distributed"
_DIST_TEST = "torch.testing._internal.distributed.distributed_test"
_DTENSOR = "torch.testing._internal.distributed._tensor.common_dtensor"


class TorchCompatError(RuntimeError):
    """The installed torch's test harnesses are not the ones this module knows."""


def check_torch_version() -> None:
    """Refuse a torch release whose private harnesses were never checked."""
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])  # major.minor
    if release in KNOWN_TORCH or os.environ.get(_FORCE_ENV) == "1":
        return
    raise TorchCompatError(
        f"simdist.torch_compat knows the test harnesses of torch {', '.join(KNOWN_TORCH)}, "
        f"not torch {torch.__version__}: torch.testing._internal is private and changes between "
        f"releases. Set {_FORCE_ENV}=1 to try anyway."
    )


# harness.<name> -> (module, its attribute; None: the module itself)
_HARNESS_NAMES = {
    "common": (_COMMON, None),
    "dtensor": (_DTENSOR, None),
    "MultiProcessTestCase": (_COMMON, "MultiProcessTestCase"),
    "MultiThreadedTestCase": (_COMMON, "MultiThreadedTestCase"),
    "spawn_threads_and_init_comms": (_COMMON, "spawn_threads_and_init_comms"),
}


class _Harness:
    """PyTorch's harness classes, fetched (after the version check) on first use:
    simdist's own tests and benchmarks subclass them through here."""

    def __getattr__(self, name: str) -> Any:
        if name not in _HARNESS_NAMES:
            raise AttributeError(f"torch_compat.harness has no {name!r}")
        check_torch_version()
        module, attribute = _HARNESS_NAMES[name]
        found = importlib.import_module(module)
        return found if attribute is None else getattr(found, attribute)

    def distributed_test(self) -> types.ModuleType:
        """``distributed_test`` reads BACKEND, WORLD_SIZE and TEMP_DIR from the environment at import."""
        check_torch_version()
        return importlib.import_module(_DIST_TEST)


harness = _Harness()


def distributed_test_class(world_size: int = 3, backend: str = "gloo") -> type:
    """``distributed_test``'s suite as PyTorch's ``test_distributed_spawn.py``
    builds it: ``TestDistBackend`` with ``_DistTestBase``, spawning in setUp.

    The module reads ``BACKEND``, ``WORLD_SIZE`` and ``TEMP_DIR`` from the
    environment when first imported; they are set here (a ``TEMP_DIR`` only
    where none is set), and must agree with a module imported before.
    """
    if backend != "gloo":
        raise ValueError(f"backend must be 'gloo' (simdist runs CPU worlds), got {backend!r}")
    if not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an int of at least 2, got {world_size!r}")
    if _DIST_TEST in sys.modules and (
        os.environ.get("BACKEND") != backend or os.environ.get("WORLD_SIZE") != str(world_size)
    ):
        raise ValueError(
            f"distributed_test was imported with BACKEND={os.environ.get('BACKEND')!r}, "
            f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r}; it reads them once"
        )
    os.environ["BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="simdist-distributed-test-"))
    module = harness.distributed_test()

    global _dist_test_class
    if _dist_test_class is None:

        class TestDistBackendWithSpawn(module.TestDistBackend, module.DistributedTest._DistTestBase):  # type: ignore[name-defined]
            def setUp(self) -> None:
                super().setUp()
                self._spawn_processes()

        # Natively the harness pickles the class into each spawned process:
        # it must be found by name there (module __getattr__ below).
        TestDistBackendWithSpawn.__module__ = __name__
        TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
        _dist_test_class = TestDistBackendWithSpawn
    return _dist_test_class


_dist_test_class: type | None = None


def __getattr__(name: str) -> Any:
    # A process spawned by the native harness unpickles the class by this
    # name, with the parent's environment (BACKEND, WORLD_SIZE, TEMP_DIR).
    if name == "TestDistBackendWithSpawn":
        return distributed_test_class(int(os.environ["WORLD_SIZE"]), os.environ["BACKEND"])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the state of one install --------------------------------------------------


@dataclass
class _Installed:
    originals: list[tuple[object, str, Any]] = field(default_factory=list)
    threaded_tests: dict[int, Any] = field(default_factory=dict)  # main thread id -> test instance
    barrier_patched: bool = False


_state: _Installed | None = None
_lock = threading.Lock()


def installed() -> bool:
    """Whether the harnesses are routed to simdist now."""
    return _state is not None


def _replace(state: _Installed, owner: object, name: str, value: Any) -> None:
    state.originals.append(
        (owner, name, vars(owner)[name] if isinstance(owner, type) else getattr(owner, name))
    )
    setattr(owner, name, value)


def install() -> None:
    """Route PyTorch's distributed test harnesses to simdist (idempotent).

    Raises ``TorchCompatError`` on a torch release not in ``KNOWN_TORCH``.
    Tests decorated with ``spawn_threads_and_init_comms`` must be defined
    after this call (the decorator wraps them when the class is defined).
    """
    global _state
    check_torch_version()
    with _lock:
        if _state is not None:
            return
        common = importlib.import_module(_COMMON)
        state = _Installed()
        mp = common.MultiProcessTestCase
        mt = common.MultiThreadedTestCase
        _replace(state, mp, "_spawn_processes", _spawn_processes)
        _replace(state, mp, "_join_processes", _join_processes)
        _replace(state, mp, "_event_listener", staticmethod(_no_event_listener))
        _replace(state, common, "threading", _HarnessThreading())
        _replace(state, mt, "_spawn_threads", _spawn_threads)
        _replace(state, mt, "_join_threads", classmethod(_join_threads))
        _replace(state, common, "spawn_threads_and_init_comms", spawn_threads_and_init_comms)
        # Tests build gloo groups by hand: inside a rank, a simdist group with gloo's API.
        _replace(state, dist, "ProcessGroupGloo", gloo.ProcessGroupGloo)
        # PyTorch's tests assert that a short timeout took its time (gloo's clock).
        _replace(state, timeouts, "waited_out_up_to_s", timeouts.REAL_TIME_UP_TO_S)
        for device in _LAZILY_SEEDED:
            module = importlib.import_module(device)
            _replace(state, module, "manual_seed_all", _seeded_in_ranks_without_stacks(module))
        _state = state


def uninstall() -> None:
    """Put the harnesses back as torch has them."""
    global _state
    with _lock:
        if _state is None:
            return
        for owner, name, value in reversed(_state.originals):
            setattr(owner, name, value)
        _state = None


# -- MultiProcessTestCase -------------------------------------------------------


class _Ended:
    """A spawned process already over (what ``_check_return_codes`` reads of it:
    its exit code and pid), or the thread ``run_test`` starts for its event
    listener, never started: the listener has nothing to do here
    (``_no_event_listener``), and a thread a rank starts is the rank's helper,
    registered with the scheduler and joined as a wait in simdist, for every
    rank of every test."""

    daemon = True

    def __init__(self, rank: int = -1, exitcode: int | None = None) -> None:
        self.pid = rank  # a key of pid_to_pipe, unique per rank
        self.exitcode = exitcode
        self.name = f"simdist rank {rank}"

    def start(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass

    def terminate(self) -> None:
        pass

    def is_alive(self) -> bool:
        return False


class _Pipe:
    """The harness's pipe between a rank and the main process, in memory: the
    rank sends its traceback, ``_check_return_codes`` receives it. It keeps the
    exception being reported too, so simdist's own verdicts can be raised as
    they are."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.error: BaseException | None = None
        self.closed = False

    def send(self, obj: Any) -> None:
        self.error = sys.exc_info()[1] or self.error
        self.messages.append(obj)

    def recv(self) -> Any:
        return self.messages.pop(0) if self.messages else ""

    def poll(self, timeout: float | None = None) -> bool:
        return bool(self.messages)

    def close(self) -> None:
        self.closed = True


def _no_event_listener(parent_pipe: Any, signal_pipe: Any, rank: int) -> None:
    """The harness's per-process listener answers the parent's request for a
    timed-out process's traceback, blocked in ``select`` meanwhile (a helper
    thread simdist cannot tell is idle). simdist reports stuck ranks itself."""


class _HarnessThreading(types.ModuleType):
    """``threading`` as ``common_distributed`` sees it while the adapter is
    installed: the real module, but a thread whose target is the replaced
    event listener is an ``_Ended`` one. Every other thread is a real one."""

    def __init__(self) -> None:
        super().__init__(threading.__name__, threading.__doc__)

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)

    @staticmethod
    def Thread(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("target") is _no_event_listener:
            return _Ended()
        return threading.Thread(*args, **kwargs)


# Device modules whose ``manual_seed_all`` (called by ``torch.manual_seed``,
# which the harness's ``set_rng_seed`` calls in every rank) queues the seed for
# the device's lazy initialisation when none is initialised yet.
_LAZILY_SEEDED = ("torch.cuda", "torch.xpu", "torch.mtia")


def _seeded_in_ranks_without_stacks(module: types.ModuleType) -> Callable[[int], None]:
    """``module.manual_seed_all`` that, in a simdist rank, queues nothing for a
    device type the process has none of.

    torch queues such a seed with the caller's formatted stack
    (``traceback.format_stack``), kept for the error message should the
    device's lazy initialisation fail later. Without a device that
    initialisation fails before it reads the queue, so the seed and its stack
    are never used; formatting three such stacks (cuda, xpu, mtia) per
    ``torch.manual_seed`` was most of the Python work of a harness test's
    ranks. Outside ranks, and where the device exists, torch's own runs."""
    original = module.manual_seed_all

    @functools.wraps(original)
    def manual_seed_all(seed: int) -> None:
        seed = int(seed)  # what torch's would refuse, refused here too
        if identity.me.world is not None and not module.is_available():
            return
        original(seed)

    return manual_seed_all


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _spawn_processes(self: Any) -> None:
    # The world starts when the test method runs (_join_processes): the
    # harness spawns in setUp, but simdist's ranks live inside one call.
    self.processes = []
    self._simdist_spawned = True


def _timeout_of(self: Any) -> float:
    common = importlib.import_module(_COMMON)
    try:
        return float(common.get_timeout(self.id()))
    except Exception:
        return float(common.TIMEOUT_DEFAULT)


def _join_processes(self: Any, fn: Any) -> None:
    if not getattr(self, "_simdist_spawned", False):
        return
    _patch_distributed_test()
    cls = type(self)
    test_name = self._current_test_name()
    file_name = self.file_name
    fake_pg = getattr(self, "fake_pg", False)
    world_size = int(self.world_size)
    pipes = [_Pipe() for _ in range(world_size)]

    def rank_body(ctx: Any) -> int:
        # The test initialises its own default group, as each spawned process would.
        dist.destroy_process_group()
        try:
            cls._run(ctx.rank, test_name, file_name, pipes[ctx.rank], fake_pg=fake_pg)
        except SystemExit as exc:
            return _exit_code(exc)
        except SimulationError:
            raise
        except Exception:
            # Uncaught in a spawned process (outside the test method, which
            # run_test reports as exit code 10): printed, exit code 1.
            traceback.print_exc()
            return 1
        finally:
            _forget_default_group()
        return 0

    start = time.monotonic()
    with _as_in_a_child_process():
        codes = simdist_run(rank_body, world_size=world_size, timeout=_timeout_of(self), reduction=REDUCTION)
    # The first of simdist's own verdicts a rank caught and reported as a test error.
    verdict = next((p.error for p in pipes if isinstance(p.error, SimulationError)), None)
    if verdict is not None:
        raise verdict
    self.processes = [_Ended(rank, code) for rank, code in enumerate(codes)]
    self.pid_to_pipe = dict(enumerate(pipes))
    self._check_return_codes(fn, time.monotonic() - start)


@contextlib.contextmanager
def _as_in_a_child_process() -> Iterator[None]:
    """What a spawned process changes dies with it: the environment and c10d's
    debug level (``with_dist_debug_levels`` leaves its last level set, and a
    later test in DETAIL mode expects a monitored barrier before each call)."""
    environ = dict(os.environ._data)  # type: ignore[attr-defined]  # the encoded entries (_restore_environ)
    level = dist.get_debug_level()
    try:
        yield
    finally:
        _restore_environ(environ)
        dist.set_debug_level(level)
        _forget_compiled_code()


def _forget_compiled_code() -> None:
    """torch.compile's caches die with a spawned process too. Kept, each
    test's ranks add their own entries for the same code (a rank's guards
    hold its own groups), and a later test hits dynamo's recompile limit
    (8 entries a code object: test_dtensor_compile's third TP test)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


def _restore_environ(saved: dict[bytes, bytes]) -> None:
    """Put ``os.environ`` (and the process's environment) back as ``saved``,
    touching only the entries that changed. Compared encoded, as ``os.environ``
    keeps them in ``_data`` (decoding every entry twice cost more per test than
    the rest of the adapter together)."""
    environ: Any = os.environ
    now = environ._data
    if now == saved:
        return
    for key in [k for k in now if k not in saved]:
        del environ[environ.decodekey(key)]
    for key, value in saved.items():
        if now.get(key) != value:
            environ[environ.decodekey(key)] = environ.decodevalue(value)


def _forget_default_group() -> None:
    """A test that left its group up (``destroy_pg_upon_exit`` False) is torn
    down here, as its process's exit would."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass


# -- MultiThreadedTestCase and spawn_threads_and_init_comms ---------------------


def _spawn_threads(self: Any) -> None:
    assert _state is not None
    self.threads = []
    _state.threaded_tests[threading.get_ident()] = self


def _run_threaded(world_size: int, per_rank: Callable[[int], None], fn: Any, cls: Any) -> None:
    """Run ``per_rank(rank)`` on every rank; collect failures as the threaded
    harness does and let its ``_check_return_codes`` judge them."""
    failures: dict[int, tuple[Any, BaseException, Any]] = {}

    def rank_body(ctx: Any) -> None:
        try:
            per_rank(ctx.rank)
        except Exception:
            # A failure of the rank's own: simdist releases the peers that
            # wait on it (as the threaded PG's exception_handle wakes them)
            # instead of reporting them as deadlocked on a finished rank.
            raise
        except BaseException as exc:  # SystemExit: the harness's skip codes
            failures[ctx.rank] = (type(exc), exc, exc.__traceback__)

    common = importlib.import_module(_COMMON)
    try:
        simdist_run(
            rank_body, world_size=world_size, timeout=float(common.TIMEOUT_DEFAULT), reduction=REDUCTION
        )
    except RankError as error:
        if any(isinstance(exc, SimulationError) for exc in error.failures.values()):
            raise  # simdist's own verdict (a mismatch, a deadlock inside a rank)
        for rank, exc in error.failures.items():
            failures[rank] = (type(exc), exc, exc.__traceback__)
    cls._check_return_codes(sorted(failures.items()), common.TIMEOUT_DEFAULT, fn)


def _join_threads(cls: Any, threads: list[Any], fn: Any) -> None:
    assert _state is not None
    test = _state.threaded_tests.pop(threading.get_ident(), None)
    if test is None or threads:
        raise TorchCompatError(
            "simdist.torch_compat: MultiThreadedTestCase._join_threads called without "
            "_spawn_threads in this thread's setUp"
        )
    test_name = test._current_test_name
    tcls = type(test)
    common = importlib.import_module(_COMMON)

    def per_rank(rank: int) -> None:
        inst = tcls(test_name)
        inst.rank = rank
        if hasattr(inst, "_tls"):
            inst._tls = threading.local()
            inst._tls.precision = common.TestCase._precision
            inst._tls.rel_tol = common.TestCase._rel_tol
        inst.perThreadSetUp()
        try:
            getattr(inst, test_name)()
        finally:
            inst.perThreadTearDown()

    _run_threaded(int(test.world_size), per_rank, fn, tcls)


def spawn_threads_and_init_comms(
    func: Callable[..., Any] | None = None, timeout: float | None = None, world_size: int | None = None
) -> Any:
    """``common_distributed.spawn_threads_and_init_comms`` on simdist ranks."""
    common = importlib.import_module(_COMMON)
    size = common.DEFAULT_WORLD_SIZE if world_size is None else world_size
    if func is None:
        return functools.partial(spawn_threads_and_init_comms, timeout=timeout, world_size=size)

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        _run_threaded(size, lambda _rank: func(self, *args, **kwargs), func, common.MultiThreadedTestCase)

    return wrapper


# -- pytest: ``pytest -p simdist.torch_compat`` ---------------------------------


def pytest_configure(config: Any) -> None:
    install()


def pytest_unconfigure(config: Any) -> None:
    uninstall()


# -- distributed_test's file barrier --------------------------------------------

# ``distributed_test.Barrier`` syncs processes through files named by pid,
# polling with ``time.sleep``: in one process every rank writes the same file
# and the sleeping rank keeps the run token. The harness's barrier (not the
# test's collectives) is a wait in simdist's scheduler instead, one count per
# rank as each spawned process would keep. Its own timeout is modelled as
# simdist models timeouts: when a rank can never arrive (it failed and
# exited), the others get the harness's "barrier timeout" at once, and the
# harness then reports the failed rank's error, as it does natively.


class _HarnessBarrier(Waitable):
    """One round of the harness's barrier, shared by the world's ranks."""

    def __init__(self, round_: int, world_size: int, wait_for: int) -> None:
        self.round = round_
        self.world_size = world_size
        self.wait_for = wait_for
        self.arrived: set[int] = set()
        self.done = False
        self.error = None

    def needed_ranks(self) -> list[int]:
        if self.done or self.wait_for < self.world_size:
            return []  # any of the absent ranks may complete it: no one rank is needed
        return [r for r in range(self.world_size) if r not in self.arrived]

    def describe(self) -> str:
        return f"distributed_test's Barrier.sync (round {self.round})"


@dataclass
class _Barriers:
    """A world's harness barrier: each rank's count, and the rounds by number."""

    counts: dict[int, int] = field(default_factory=dict)
    rounds: dict[int, _HarnessBarrier] = field(default_factory=dict)


_barriers: weakref.WeakKeyDictionary[Any, _Barriers] = weakref.WeakKeyDictionary()
_barriers_lock = threading.Lock()


def _store_barrier(cls: Any, wait_for: int | None = None, timeout: float = 10) -> None:
    world, rank = identity.me.world, identity.me.rank
    if world is None:
        raise TorchCompatError("distributed_test's Barrier.sync called outside a simdist rank")
    scheduler = world.scheduler
    size = scheduler.world_size
    with _barriers_lock:
        state = _barriers.setdefault(world, _Barriers())
        n = state.counts[rank] = state.counts.get(rank, 0) + 1
        barrier = state.rounds.setdefault(n, _HarnessBarrier(n, size, size if wait_for is None else wait_for))
        barrier.arrived.add(rank)
        complete = len(barrier.arrived) >= barrier.wait_for and not barrier.done
    if complete:
        for r in sorted(barrier.arrived):
            scheduler.complete(r, barrier)
        return
    scheduler.wait_timed(rank, barrier, float(timeout), lambda: RuntimeError("barrier timeout"))


def _patch_distributed_test() -> None:
    """Patch ``Barrier.sync`` once ``distributed_test`` is imported (it reads
    its environment at import, so ``install`` cannot import it itself)."""
    module = sys.modules.get(_DIST_TEST)
    if module is None or _state is None or _state.barrier_patched:
        return
    _replace(_state, module.Barrier, "sync", classmethod(_store_barrier))
    _state.barrier_patched = True
