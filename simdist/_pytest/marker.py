"""``@pytest.mark.simdist(...)``: what a marked test asks for, checked at collection.

A marked test is an SPMD body: pytest parametrises its ``ctx`` argument with
one ``WorldSpec`` per world (ids like ``tp2-dp2-pp1``), and the runner replaces
that placeholder with each rank's real ``RankContext``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._checks import check_bool, check_int, is_int
from .._run.options import DEFAULT_TIMEOUT_S, OPTION_NAMES, RunOptions
from ..layout import Layout
from ..reduction import make_model

MARKER = "simdist"
MARKER_HELP = (
    "simdist(layout=Layout(...) | layouts=[...] | world_size=N, and any simdist.run option: "
    f"{', '.join(name + '=' for name in OPTION_NAMES)}; sim_only=): "
    "run the test on every rank of each world; it receives ctx"
)
_WORLD_ARGS = ("layout", "layouts", "world_size")
_OPTION_ARGS = (*OPTION_NAMES, "sim_only")
# Fixture values reach the ranks as run's kwargs: shared by the rank threads
# unless the marker says share_args=False (then each rank gets its own copy).
_MARKER_DEFAULTS: dict[str, Any] = {"share_args": True}


@dataclass(frozen=True)
class WorldSpec:
    """One world of a marked test: a layout, or a flat world of ``world_size`` ranks."""

    layout: Layout | None
    world_size: int

    @property
    def id(self) -> str:
        if self.layout is None:
            return f"world{self.world_size}"
        cp = f"-cp{self.layout.cp}" if self.layout.cp > 1 else ""
        return f"tp{self.layout.tp}{cp}-dp{self.layout.dp}-pp{self.layout.pp}"

    def describe_rank(self, rank: int) -> str:
        if self.layout is None:
            return f"rank {rank} of {self.world_size}"
        c = self.layout.coords(rank)
        return f"rank {rank} (tp={c.tp} cp={c.cp} dp={c.dp} pp={c.pp})"

    def __repr__(self) -> str:  # shown where pytest prints parameters
        return f"<simdist world {self.id}>"


@dataclass(frozen=True)
class SpmdOptions:
    """The marker's options other than the worlds: ``simdist.run``'s keywords as given, and ``sim_only``.

    Three mean what run's do not: ``trace=True`` (a file in the test's tmp
    dir), ``timeout=None`` (the session's) and ``reduction=None`` (rank
    order); the real backends read ``seed``, ``device`` and ``timeout`` too.
    """

    given: Mapping[str, Any]
    sim_only: bool = False

    def sim_only_reason(self) -> str | None:
        """Why this test cannot run on a real backend, or None."""
        if self.sim_only:
            return "sim_only=True: the test needs the simulator (e.g. it asserts a deadlock)"
        if self.given.get("faults") is not None:
            return "faults=: fault injection exists only in the simulator"
        reduction = self.given.get("reduction")
        if reduction is not None:
            return f"reduction={reduction!r}: reduction-order models exist only in the simulator"
        return None

    def run_options(self, world: WorldSpec, timeout: float, trace: str | None) -> RunOptions:
        """The ``RunOptions`` of one world of this test (validated again, with the trace path)."""
        given = {**_MARKER_DEFAULTS, **self.given}
        given["reduction"] = given.get("reduction") or "rank"
        if given.get("timeout") is None:
            given["timeout"] = timeout
        given["trace"] = trace
        return RunOptions(layout=world.layout, world_size=None if world.layout else world.world_size, **given)


def parse(marker: Any, fn: Callable[..., Any], name: str) -> tuple[list[WorldSpec], SpmdOptions]:
    """The worlds and options of ``@pytest.mark.simdist(...)`` on test ``name``.

    Raises ``TypeError``/``ValueError`` naming the test and the argument, so a
    typo fails collection instead of silently running something else.
    """
    where = f"@pytest.mark.simdist on {name}"
    if marker.args:
        raise TypeError(
            f"{where}: takes keyword arguments only (layout=, layouts= or world_size=), "
            f"got positional {marker.args!r}"
        )
    kwargs = dict(marker.kwargs)
    unknown = sorted(set(kwargs) - set(_WORLD_ARGS) - set(_OPTION_ARGS))
    if unknown:
        raise TypeError(
            f"{where}: unknown argument(s) {', '.join(unknown)}; expected "
            f"{', '.join(_WORLD_ARGS + _OPTION_ARGS)}"
        )
    given = [a for a in _WORLD_ARGS if a in kwargs]
    if len(given) != 1:
        raise TypeError(
            f"{where}: give exactly one of layout=, layouts=, world_size=; got "
            f"{', '.join(given) if given else 'none'}"
        )
    if "ctx" not in inspect.signature(fn).parameters:
        raise TypeError(f"{where}: the test must take a `ctx` argument (each rank's simdist.RankContext)")
    worlds = _worlds(where, given[0], kwargs.pop(given[0]))
    sim_only = kwargs.pop("sim_only", False)
    options = SpmdOptions(kwargs, sim_only)  # every other argument is one of run's (checked above)
    _check_options(where, options, worlds)
    return worlds, options


def _worlds(where: str, arg: str, value: Any) -> list[WorldSpec]:
    if arg == "world_size":
        sizes = value if isinstance(value, (list, tuple)) else [value]
        for n in sizes:
            if not is_int(n, 1):
                raise ValueError(f"{where}: world_size must be a positive int (or a list of them), got {n!r}")
        return [WorldSpec(None, n) for n in sizes]
    layouts = [value] if arg == "layout" else value
    if arg == "layouts" and (not isinstance(layouts, (list, tuple)) or not layouts):
        raise TypeError(f"{where}: layouts= must be a non-empty list of simdist.Layout, got {value!r}")
    for lay in layouts:
        if not isinstance(lay, Layout):
            raise TypeError(f"{where}: {arg}= takes simdist.Layout objects, got {type(lay).__name__} {lay!r}")
    specs = [WorldSpec(lay, int(lay.world_size)) for lay in layouts]
    ids = [s.id for s in specs]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise ValueError(f"{where}: layouts= lists the same layout twice ({', '.join(duplicated)})")
    return specs


def _check_options(where: str, o: SpmdOptions, worlds: list[WorldSpec]) -> None:
    """The marker's own checks, then ``RunOptions``' (the wording of ``simdist.run``)."""
    trace = o.given.get("trace", False)
    if not isinstance(trace, (bool, str, os.PathLike)):
        raise TypeError(
            f"{where}: trace must be True (a file in the test's tmp dir) or a path, got {trace!r}"
        )
    check_bool("sim_only", o.sim_only, prefix=f"{where}: ", wording="a bool")
    seed = check_int("seed", o.given.get("seed", 0), prefix=f"{where}: ")
    reduction = o.given.get("reduction")
    if reduction is not None:
        try:
            make_model(reduction, seed)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{where}: reduction={reduction!r}: {exc}") from None
    for world in worlds:
        try:
            # The trace path is checked when the test runs (a fixture may
            # create its folder); the timeout stands in for the session's.
            o.run_options(world, DEFAULT_TIMEOUT_S, None)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise type(exc)(f"{where}: {exc}") from None
