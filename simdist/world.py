"""``simdist.run``: one thread per rank, joined before returning, errors gathered.

Structured like a nursery: every thread started here is joined (or, for a rank
stuck in plain compute past the watchdog, interrupted and then joined) before
``run`` returns or raises, and the first failure is never swallowed.
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from . import c10d_state, stacks
from .backend import BACKEND_NAME, bind_current, register_backend
from .context import RankContext, build_groups
from .errors import (
    CollectiveMismatchError,
    DeadlockError,
    PeerFailedError,
    RankError,
    SimulationError,
    SimulationTimeout,
)
from .layout import Layout
from .reduction import ReductionModel, make_model
from .rendezvous import Call, GroupInfo, P2POp, Scheduler

DEFAULT_TIMEOUT_S = 300.0
# After the watchdog interrupts stuck ranks, how long to wait for them to unwind.
_GRACE_S = 5.0


class World:
    """The shared state of one simulation (implements ``backend.WorldHooks``)."""

    def __init__(self, layout: Layout | None, world_size: int, reduction: ReductionModel,
                 timeout: float) -> None:
        self.layout = layout
        self.world_size = world_size
        self.reduction = reduction
        self.timeout = timeout
        self.scheduler = Scheduler(world_size, self.describe_rank)
        self.store = dist.HashStore()
        self.store.set_timeout(timedelta(seconds=timeout))
        self._groups: dict[str, GroupInfo] = {}
        self._groups_lock = threading.Lock()

    def describe_rank(self, rank: int) -> str:
        if self.layout is None:
            return f"rank {rank} of {self.world_size}"
        c = self.layout.coords(rank)
        return f"tp={c.tp} cp={c.cp} dp={c.dp} pp={c.pp}"

    # -- groups -------------------------------------------------------------

    def register_group(self, name: str, ranks: tuple[int, ...], rank: int) -> GroupInfo:
        with self._groups_lock:
            info = self._groups.get(name)
            if info is None:
                label = "world" if ranks == tuple(range(self.world_size)) and name == "0" else f"group {name}"
                info = GroupInfo(name, ranks, label)
                self._groups[name] = info
            elif info.ranks != ranks:
                raise CollectiveMismatchError(
                    f"rank {rank} created group {name!r} with ranks {list(ranks)}, but a peer "
                    f"created it with ranks {list(info.ranks)}: every member must call "
                    f"new_group with the same ranks, in the same order"
                )
            return info

    def group_info(self, name: str) -> GroupInfo:
        return self._groups[name]

    def label_group(self, name: str, label: str) -> None:
        with self._groups_lock:
            info = self._groups[name]
            if info.label != label:
                self._groups[name] = GroupInfo(info.name, info.ranks, label)

    # -- per-call hooks -----------------------------------------------------

    def before_call(self, call: Call, group: GroupInfo, seq: int) -> None:
        pass

    def before_p2p(self, op: P2POp) -> None:
        pass

    def verify(self, group: GroupInfo, seq: int, calls: list[Call]) -> None:
        first = calls[0].fingerprint
        if all(c.fingerprint == first for c in calls[1:]):
            return
        rows = []
        for c in calls:
            fp = dict(c.fingerprint)
            details = ", ".join(f"{k}={v}" for k, v in fp.items() if k != "op")
            rows.append(
                f"  rank {c.rank:<3} {self.describe_rank(c.rank):<24} {fp['op']:<24} "
                f"{details:<60} at {c.site}"
            )
        raise CollectiveMismatchError(
            f"collective mismatch on {group.describe()} at sequence number {seq}: "
            f"members called different collectives\n" + "\n".join(rows)
        )


def _resolve_world(layout: Layout | None, world_size: int | None) -> tuple[Layout | None, int]:
    if layout is not None and not isinstance(layout, Layout):
        raise TypeError(f"layout must be a simdist.Layout, got {type(layout).__name__}")
    if layout is None:
        if world_size is None:
            raise ValueError("run() needs layout=Layout(...) or world_size=N")
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        return None, world_size
    if world_size is not None and world_size != layout.world_size:
        raise ValueError(f"world_size={world_size!r} disagrees with {layout} (world size {layout.world_size})")
    return layout, int(layout.world_size)  # type: ignore[arg-type]


def _resolve_device(device: str | torch.device, rank: int) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for, but torch.cuda.is_available() is False")
        if dev.index is None:
            return torch.device("cuda", rank % torch.cuda.device_count())
    return dev


def run(
    fn: Callable[..., Any],
    *,
    layout: Layout | None = None,
    world_size: int | None = None,
    device: str | torch.device = "cpu",
    timeout: float = DEFAULT_TIMEOUT_S,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    reduction: str | ReductionModel = "rank",
    seed: int = 0,
) -> list[Any]:
    """Run ``fn(ctx, *args, **kwargs)`` once per rank, each rank in its own thread.

    Returns the per-rank results, indexed by global rank. Raises ``RankError``
    when a rank raised (``__cause__`` is the first failure), ``DeadlockError``
    when no pending call could ever complete, ``CollectiveMismatchError`` when
    members of a group called different collectives, ``SimulationTimeout`` when
    ranks were still running after ``timeout`` seconds.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    layout, n = _resolve_world(layout, world_size)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    kwargs = dict(kwargs or {})
    devices = [_resolve_device(device, r) for r in range(n)]
    world = World(layout, n, make_model(reduction, seed), float(timeout))

    register_backend()
    results: list[Any] = [None] * n
    failures: dict[int, BaseException] = {}

    def rank_main(rank: int) -> None:
        bind_current(world, rank)
        world.scheduler.bind_thread(rank)
        c10d_state.enter_rank_thread()
        try:
            # Autograd would run CUDA backward on its device threads, which have
            # no rank; keep backward on the rank's own thread.
            with torch.autograd.set_multithreading_enabled(False):
                dist.init_process_group(
                    BACKEND_NAME, rank=rank, world_size=n, store=world.store,
                    timeout=timedelta(seconds=timeout),
                )
                ctx = RankContext(
                    rank=rank, world_size=n, layout=layout, device=devices[rank],
                    groups=build_groups(layout),
                )
                results[rank] = fn(ctx, *args, **kwargs)
            world.scheduler.rank_finished(rank)
        except BaseException as exc:  # noqa: BLE001 - reported by run()
            failures[rank] = exc
            world.scheduler.rank_failed(rank, exc)
        finally:
            c10d_state.leave_rank_thread()
            bind_current(None)

    c10d_state.install()
    try:
        threads = [
            threading.Thread(target=rank_main, args=(r,), name=f"simdist-rank-{r}", daemon=True)
            for r in range(n)
        ]
        for t in threads:
            t.start()
        timed_out = _join_all(threads, world, float(timeout))
    finally:
        c10d_state.uninstall()
    return _outcome(world, results, failures, timed_out)


def _join_all(threads: list[threading.Thread], world: World, timeout: float) -> str | None:
    """Join every rank thread; on the watchdog's expiry interrupt the stuck ones.

    Returns the watchdog report when it fired, else None.
    """
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t for t in threads if t.is_alive()]
    if not alive:
        return None
    frames = sys._current_frames()
    lines = [f"watchdog: {len(alive)} rank(s) still running after {timeout:g} s"]
    for t in alive:
        rank = int(t.name.rsplit("-", 1)[1])
        lines.append(f"  rank {rank} ({world.describe_rank(rank)}):")
        lines.extend("      " + s for s in stacks.user_stack(frames.get(t.ident or -1)))
    report = "\n".join(lines)
    world.scheduler.abort(SimulationTimeout(report))
    for t in alive:
        # Interrupts Python-level loops; a thread blocked inside C code stays
        # stuck, and is reported as such below.
        if t.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(t.ident), ctypes.py_object(SimulationTimeout)
            )
    grace = time.monotonic() + _GRACE_S
    for t in alive:
        t.join(max(0.0, grace - time.monotonic()))
    still = [t.name for t in alive if t.is_alive()]
    if still:
        report += f"\n  could not interrupt {still} (blocked in native code); they are daemon threads"
    return report


def _outcome(world: World, results: list[Any], failures: dict[int, BaseException],
             timed_out: str | None) -> list[Any]:
    sched = world.scheduler
    if timed_out is not None:
        raise SimulationTimeout(timed_out)
    first = sched.first_failure
    abort = sched.aborted
    if first is None and isinstance(abort, SimulationError) and not isinstance(abort, PeerFailedError):
        err = type(abort)(str(abort))
        err.failures = failures  # type: ignore[attr-defined]
        raise err
    if first is not None:
        rank, exc = first
        if isinstance(exc, (CollectiveMismatchError, DeadlockError)):
            err2 = type(exc)(f"rank {rank} ({world.describe_rank(rank)}): {exc}")
            err2.failures = failures  # type: ignore[attr-defined]
            raise err2 from exc
        independent = {r: e for r, e in failures.items() if r not in sched.released}
        lines = [
            f"rank {r} ({world.describe_rank(r)}) failed: {type(e).__name__}: {e}"
            for r, e in sorted(independent.items(), key=lambda kv: (kv[0] != rank, kv[0]))
        ]
        released = sorted(sched.released)
        if released:
            lines.append(f"released from waits by the failure: rank(s) {released}")
        raise RankError("\n".join(lines), independent, released) from exc
    leftovers = sched.leftovers()
    if leftovers is not None:
        raise DeadlockError("every rank returned, but " + leftovers)
    return results
