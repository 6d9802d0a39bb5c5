"""Running a marked test's body on every rank, and reporting a failed rank as pytest would.

Three ways to run a body: the simulator (``simdist.run``, in this process),
a real world of spawned processes (``simdist.run_processes``, each finding the
test by its file: ``load_test``), or this process's rank of a world started by
torchrun (``run_torchrun_rank``).
Whatever the way, a failure becomes one ``RankFailed`` whose message names the
first failing rank, its coordinates and its error, chained to that error (so
pytest prints the rank's own traceback and assertion introspection first), and
ranks released by the failure are listed in one line, not as tracebacks.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import logging
import os
import pickle
import re
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ..errors import RankError, SimulationError
from .marker import SpmdOptions, WorldSpec

SECTIONS = pytest.StashKey[list[tuple[str, str]]]()
TRACE_DIR = pytest.StashKey[Path]()
_TAIL_MARK = "last calls per rank (flight recorder):"


# pytest.skip() and pytest.xfail() called by a rank decide the test's outcome.
_OUTCOMES = (pytest.skip.Exception, pytest.xfail.Exception)


class RankFailed(Exception):
    """A rank of a simdist-marked test failed; ``__cause__`` is that rank's exception."""


def test_kwargs(item: pytest.Function) -> dict[str, Any]:
    """The fixture values the test function asked for, ``ctx`` excepted."""
    params = inspect.signature(item.obj).parameters
    return {name: item.funcargs[name] for name in params if name != "ctx" and name in item.funcargs}


def add_section(item: pytest.Item, title: str, text: str) -> None:
    item.stash.setdefault(SECTIONS, []).append((title, text))


def trace_path(item: pytest.Function, options: SpmdOptions) -> str | None:
    trace = options.given.get("trace", False)
    if trace is False:
        return None
    if trace is True:
        name = re.sub(r"[^\w.-]+", "_", item.name)[:60]
        return str(item.stash[TRACE_DIR] / f"{name}.json")
    return os.fspath(trace)


@contextlib.contextmanager
def quiet_c10d_logs() -> Iterator[None]:
    """Keeps c10d's debug records of failed calls out of the report.

    torch logs every collective that raises at DEBUG level; when a rank fails
    every released peer adds one, repeating the failure a dozen times in
    pytest's "Captured log" section. The failure itself is reported above.
    """
    # pytest attaches its capture handlers even to loggers that do not
    # propagate (c10d's), so the logger itself is switched off for the run.
    loggers = [
        logging.getLogger(name)
        for name in list(logging.Logger.manager.loggerDict)
        if name.startswith("c10d-")
    ]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, value in zip(loggers, before):
            lg.disabled = value


# --------------------------------------------------------------------- sim


def run_sim(item: pytest.Function, world: WorldSpec, options: SpmdOptions, timeout: float) -> None:
    __tracebackhide__ = True
    from .._run import run_with_options

    fn, kwargs = item.obj, test_kwargs(item)
    trace = trace_path(item, options)

    def body(ctx: Any, **fixtures: Any) -> None:
        fn(ctx=ctx, **fixtures)  # a return value is ignored: the test checks by asserting

    try:
        run_options = options.run_options(world, timeout, trace)
        with quiet_c10d_logs():
            run_with_options(body, run_options, kwargs=kwargs)
    except RankError as err:
        if isinstance(err.__cause__, _OUTCOMES):
            raise err.__cause__ from None  # pytest.skip()/xfail() in the body: that is the outcome
        _tail_to_section(item, str(err))
        raise _rank_failed(err, world) from err.__cause__
    except SimulationError as err:
        # Deadlock, mismatch or timeout: the report is the message itself;
        # simdist's own frames would only hide it.
        raise type(err)(_tail_to_section(item, str(err))) from None
    finally:
        if trace is not None:
            add_section(item, "simdist trace", f"Chrome/Perfetto trace of every call: {trace}")


def _tail_to_section(item: pytest.Item, message: str) -> str:
    """The message without its flight-recorder tail, which goes to a report section."""
    head, mark, tail = message.partition(_TAIL_MARK)
    if not mark:
        return message
    add_section(item, "simdist flight recorder", mark + tail)
    return head.rstrip()


def _rank_failed(err: RankError, world: WorldSpec, *, here: int | None = None) -> RankFailed:
    first = err.__cause__
    order = sorted(err.failures, key=lambda r: (err.failures[r] is not first, r))
    lines = [f"{world.describe_rank(r)} failed: {_one_error(err.failures[r])}" for r in order]
    if err.released:
        lines.append(
            "released by that failure (not failures of their own): rank(s) "
            + ", ".join(str(r) for r in sorted(err.released))
        )
    if here is not None and here not in err.failures:
        lines.append(f"this process is rank {here}, which passed")
    return RankFailed("\n".join(lines))


class _PeerFailure(Exception):
    """Another torchrun rank's failure, as that rank summed it up."""


def _one_error(exc: BaseException) -> str:
    if isinstance(exc, _PeerFailure):
        return str(exc)
    # The first line only: the whole message and its introspection are printed
    # with the rank's traceback just above.
    lines = str(exc).strip().splitlines()
    more = " [...]" if len(lines) > 1 else ""
    return f"{type(exc).__name__}: {lines[0]}{more}" if lines else type(exc).__name__


# ------------------------------------------------------ spawned processes


def run_spawned(
    item: pytest.Function, world: WorldSpec, options: SpmdOptions, timeout: float, backend: str
) -> None:
    __tracebackhide__ = True
    from ..launch import run_processes

    kwargs = test_kwargs(item)
    for name, value in kwargs.items():
        try:
            pickle.dumps(value)
        except Exception as exc:
            raise TypeError(
                f"fixture {name!r} ({type(value).__name__}) cannot be sent to the {backend} ranks, "
                f"which are separate processes: it does not pickle ({exc}); run this test with "
                f"--simdist-backend=sim or mark it sim_only=True"
            ) from None
    target = _target_of(item)
    try:
        run_processes(
            _remote_call,
            layout=world.layout,
            world_size=None if world.layout else world.world_size,
            backend=backend,
            device=str(options.given.get("device", "cuda" if backend == "nccl" else "cpu")),
            timeout=timeout,
            args=(target, kwargs, options.given.get("seed", 0)),
        )
    except RankError as err:
        raise _rank_failed(err, world) from err.__cause__
    except SimulationError as err:
        raise type(err)(str(err)) from None


def _target_of(item: pytest.Function) -> tuple[str, str, str, str]:
    """Where a child process finds the test: module name, file, import root, qualified name."""
    module = item.module
    name, path = module.__name__, os.path.abspath(module.__file__)
    root = path
    for _ in range(name.count(".") + 1):
        root = os.path.dirname(root)
    return name, path, root, item.obj.__qualname__


def _remote_call(ctx: Any, target: tuple[str, str, str, str], kwargs: dict[str, Any], seed: int) -> None:
    load_test(*target)(ctx=replace(ctx, seed=seed), **kwargs)


# The test module is loaded from its file, with pytest's assertion rewriting
# when it is available, so a failed ``assert`` in a gloo or NCCL rank explains
# itself as it would in the simulator. Loading by file (not by pickled
# reference) works whatever ``sys.path`` the process pool was started with.
_loaded: dict[str, types.ModuleType] = {}


def load_test(module_name: str, path: str, root: str, qualname: str) -> Callable[..., Any]:
    """The test function ``qualname`` of the module at ``path``, in a rank process of a real world."""
    module = _loaded.get(path)
    if module is None:
        module = _loaded[path] = _load_module(module_name, path, root)
    obj: Any = module
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        obj = getattr(obj, part)
        if isinstance(obj, type) and i < len(parts) - 1:
            obj = obj()  # a test class: pytest makes a fresh instance per test too
    return obj


def _load_module(name: str, path: str, root: str) -> types.ModuleType:
    # The test module's own imports (helpers beside it) resolve as under pytest's
    # default "prepend" import mode.
    if root not in sys.path:
        sys.path.insert(0, root)
    with open(path, "rb") as fh:
        source = fh.read()
    tree = ast.parse(source, filename=path)
    try:
        from _pytest.assertion.rewrite import rewrite_asserts

        rewrite_asserts(tree, source, path, None)
    except Exception:
        pass
    module = types.ModuleType(name)
    module.__file__ = path
    module.__package__ = name.rpartition(".")[0]
    sys.modules[name] = module
    exec(compile(tree, path, "exec", dont_inherit=True), module.__dict__)
    return module


# ---------------------------------------------------------------- torchrun


def run_torchrun(
    item: pytest.Function, world: WorldSpec, options: SpmdOptions, backend: str, outcome_group: Any
) -> None:
    """Run this process's rank, then agree with every rank on who failed."""
    __tracebackhide__ = True
    import torch.distributed as dist

    from ..launch import run_torchrun_rank

    fn, kwargs = item.obj, test_kwargs(item)
    rank = dist.get_rank()
    mine: BaseException | None = None
    try:
        run_torchrun_rank(
            lambda ctx: fn(ctx=replace(ctx, seed=options.given.get("seed", 0)), **kwargs),
            layout=world.layout,
            backend=backend,
        )
    except (Exception, *_OUTCOMES) as exc:  # a failure, skip() or xfail(): the peers ask for it below
        mine = exc
    # Every rank learns every rank's outcome, so all report the same failure
    # (and -x stops them all at the same test).
    outcomes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, _outcome_of(mine), group=outcome_group)
    failed: dict[int, BaseException] = {
        r: _PeerFailure(text)
        for r, (kind, text) in enumerate(o or ("", "") for o in outcomes)
        if kind == "failed"
    }
    if not failed:
        if isinstance(mine, _OUTCOMES):
            raise mine
        for r, outcome in enumerate(outcomes):
            if outcome is not None:  # another rank skipped or xfailed: so does this one
                (pytest.skip if outcome[0] == "skipped" else pytest.xfail)(f"rank {r}: {outcome[1]}")
        return
    if mine is not None:
        failed[rank] = mine
    err = RankError("", failed, ())
    err.__cause__ = mine if mine is not None else failed[min(failed)]
    raise _rank_failed(err, world, here=rank) from mine


def _outcome_of(exc: BaseException | None) -> tuple[str, str] | None:
    if exc is None:
        return None
    if isinstance(exc, pytest.skip.Exception):
        return "skipped", str(exc.msg)
    if isinstance(exc, pytest.xfail.Exception):
        return "xfailed", str(exc.msg)
    return "failed", _one_error(exc)
