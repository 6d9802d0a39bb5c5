"""The World: the shared state of one simulation (implements ``_backend.world_hooks.WorldHooks``).

It owns the scheduler, the store, the per-rank process states, the flight
recorder, the fault state and the registry of process groups; the per-call
hooks (flight record, faults, fingerprint and call-site comparison) are the
backend's ``_backend.hooks.CallHooks``, read through the run's options.
"""

from __future__ import annotations

import functools
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from .._backend.group import SimGroup
from .._backend.hooks import CallHooks
from .._backend.world_hooks import WorldHooks
from .._core.records import GroupInfo, PendingCollective, Waitable
from .._core.scheduler import Scheduler
from .._cuda.device_api import EmulatedCuda
from .._cuda.memory import DeviceMemory
from .._isolation.rank_state import RankStates, release_process
from ..errors import CollectiveMismatchError
from ..faults import FaultState
from ..layout import Layout
from ..policy import make_policy
from ..reduction import make_model
from ..store import RankStore
from ..trace import Recorder
from .options import RunOptions


class World(CallHooks, WorldHooks):
    """One simulation's shared state, built from validated ``RunOptions``."""

    def __init__(self, options: RunOptions, keep_all_records: bool = False) -> None:
        self.options = options
        self.strict_call_sites = options.strict_call_sites  # read by the backend's fingerprint check
        self.layout = options.layout
        self.world_size = n = options.size
        self.reduction = make_model(options.reduction, options.seed)
        self.timeout = options.timeout
        self.deadline = time.monotonic() + options.timeout  # the watchdog's; the run sets it from its call
        self.recorder = Recorder(n, keep=options.flight_records, keep_all=keep_all_records)
        self.faults = FaultState(options.faults, options.layout, n) if options.faults else None
        policy = make_policy(options.schedule, options.policy_seed)
        # Unscheduled, every rank shares the process's state as it always did.
        self.states = RankStates(n, options.rank_local) if policy is not None else None
        try:
            # Callbacks that hold what they need, not the world: a run leaves
            # no cycle for the collector (the scheduler is the world's).
            self.scheduler = Scheduler(
                n,
                functools.partial(describe_rank, options.layout, n),
                _call_done,
                policy,
                self.states.switch_to if self.states is not None else lambda rank, aborted: None,
                release_process,
            )
            self.store = RankStore(self.scheduler) if policy is not None else dist.HashStore()
            self.store.set_timeout(timedelta(seconds=options.timeout))
        except BaseException:
            # The run never gets to restore them: undo what RankStates set up
            # (its import hook for modules first imported during a run).
            if self.states is not None:
                self.states.restore_caller()
            raise
        self._groups: dict[str, SimGroup] = {}
        self._named: dict[str, list[SimGroup]] = {}  # c10d name -> its groups (disjoint rank sets)
        self._groups_lock = threading.Lock()
        # The world group's global -> group rank map, the identity: one for
        # every rank instead of a copy each (O(world) memory per rank).
        self.world_rank_map = {r: r for r in range(n)}
        self.all_ranks = tuple(range(n))  # the world group's ranks, one tuple for every rank
        # CUDA emulation (simdist._cuda): each rank's current device, the node's GPU count.
        self.cuda_emulation = None
        if options.cuda == "emulate":
            self.cuda_emulation = EmulatedCuda(n, options.emulated_devices, options.check_async)
            self.cuda_emulation.memory = DeviceMemory()
        # Exceptions that escaped a rank's helper threads, per rank: the rank
        # fails with the first once its body has returned (never swallowed).
        self.helper_failures: dict[int, list[tuple[str, BaseException]]] = {}
        # Ranks whose helpers have been waited for, stopped and reported: the
        # error that report raises must not send the rank's failure path
        # through the same wait and report again.
        self.helpers_ended: set[int] = set()

    def helper_failed(self, rank: int, name: str, exc: BaseException) -> None:
        with self._groups_lock:
            self.helper_failures.setdefault(rank, []).append((name, exc))

    def describe_rank(self, rank: int) -> str:
        return describe_rank(self.layout, self.world_size, rank)

    # -- groups -------------------------------------------------------------

    def register_group(self, name: str, ranks: tuple[int, ...], rank: int) -> GroupInfo:
        with self._groups_lock:
            named = self._named.setdefault(name, [])
            for info in named:
                if info.ranks is ranks or info.ranks == ranks:
                    return info
            clash = next((info for info in named if set(info.ranks) & set(ranks)), None)
            if clash is not None:
                error = CollectiveMismatchError(
                    f"rank {rank} created group {name!r} with ranks {list(ranks)}, but a peer "
                    f"created it with ranks {list(clash.ranks)}: every member must call "
                    f"new_group with the same ranks, in the same order"
                )
                self.scheduler.record(rank, error)
                raise error
            # Disjoint rank sets under one c10d name are separate communicators:
            # torch's _find_or_create_pg_by_ranks_and_tag has each rank create
            # only its own set's group, so the sets' counters agree on the name.
            key = name if not named else f"{name}[{','.join(map(str, ranks))}]"
            label = (
                "world"
                if name == "0" and (ranks is self.all_ranks or ranks == self.all_ranks)
                else f"group {name}"
            )
            info = SimGroup(key, ranks, label)
            self._groups[key] = info
            named.append(info)
            return info

    def label_group(self, name: str, label: str) -> None:
        with self._groups_lock:
            self._groups[name].relabel(label)


def describe_rank(layout: Layout | None, world_size: int, rank: int) -> str:
    if layout is None:
        return f"rank {rank} of {world_size}"
    c = layout.coords(rank)
    return f"tp={c.tp} cp={c.cp} dp={c.dp} pp={c.pp}"


def _call_done(waitable: Waitable) -> None:
    failed = waitable.error is not None
    if isinstance(waitable, PendingCollective):
        for call in waitable.calls.values():
            Recorder.finish(call.record, failed)
    else:
        Recorder.finish(getattr(waitable, "record", None), failed)
