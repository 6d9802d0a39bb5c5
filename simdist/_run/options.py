"""``RunOptions``: every option of one run, validated once, frozen.

``simdist.run`` builds one from its keywords, the pytest marker from its
arguments (plus the world of each parametrised test), and ``simdist.launch``
checks its world and timeout with the same functions: one wording for one
mistake, wherever it is made. Checks run in ``__post_init__``, so a
``dataclasses.replace`` is validated as well.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._checks import check_bool, check_int, check_positive_seconds
from ..debug._options import check_debug_options
from ..faults import FaultPlan
from ..layout import Layout
from ..policy import make_policy
from ..reduction import ReductionModel, make_model
from ..trace import DEFAULT_RECORDS

DEFAULT_TIMEOUT_S = 300.0

# How many rank threads this process can start: a world larger than that is
# refused before anything is built for it (building per-rank state for 10**8
# ranks would run for minutes before the watchdog could start).
# Each thread's stack is one mapping and its guard page another.
_MAPS_PER_THREAD = 2


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def thread_limits() -> dict[str, int]:
    """The limits on threads this process can start that the OS tells, by name
    (empty where it tells none: then no world is refused for its size)."""
    limits: dict[str, int] = {}
    threads_max = _read_int("/proc/sys/kernel/threads-max")
    if threads_max is not None:
        limits["kernel.threads-max"] = threads_max
    map_count = _read_int("/proc/sys/vm/max_map_count")
    if map_count is not None:
        limits[f"vm.max_map_count / {_MAPS_PER_THREAD}"] = map_count // _MAPS_PER_THREAD
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY and soft > 0:
            limits["RLIMIT_NPROC (ulimit -u)"] = soft
    except (ImportError, OSError, ValueError):  # not on this platform
        pass
    return limits


def check_world_fits(world_size: int) -> None:
    """Refuse, naming the limit, a world this process cannot start a thread for each rank of."""
    limits = thread_limits()
    if not limits:
        return
    name, limit = min(limits.items(), key=lambda item: item[1])
    room = limit - threading.active_count()
    if world_size > room:
        raise ValueError(
            f"world_size {world_size} cannot run here: each rank is a thread, and this process can start "
            f"at most about {max(room, 0)} more ({name} = {limit}, {threading.active_count()} running). "
            "Use a smaller layout, or raise that limit"
        )


def resolve_world(
    layout: Layout | None, world_size: int | None, caller: str = "run()"
) -> tuple[Layout | None, int]:
    """The layout (or None) and the world size, from ``layout=`` or ``world_size=``."""
    if layout is not None and not isinstance(layout, Layout):
        raise TypeError(f"layout must be a simdist.Layout, got {type(layout).__name__}")
    if layout is None:
        if world_size is None:
            raise ValueError(f"{caller} needs layout=Layout(...) or world_size=N")
        size = check_int("world_size", world_size, minimum=1)
    else:
        if world_size is not None and world_size != layout.world_size:
            raise ValueError(
                f"world_size={world_size!r} disagrees with {layout} (world size {layout.world_size})"
            )
        size = int(layout.world_size)  # type: ignore[arg-type]  # set by Layout's checks
    check_world_fits(size)
    return layout, size


def resolve_device(device: str | torch.device, rank: int) -> torch.device:
    """The device of ``rank``: ``"cuda"`` without an index gives each rank its own GPU, round robin."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for, but torch.cuda.is_available() is False")
        if dev.index is None:
            return torch.device("cuda", rank % torch.cuda.device_count())
    return dev


CUDA_MODES = (None, "emulate")
MAX_EMULATED_DEVICES = 8


def check_cuda(cuda: object, cuda_devices: object) -> None:
    if cuda not in CUDA_MODES:
        raise ValueError(f"cuda must be None (off) or 'emulate', got {cuda!r}")
    if cuda_devices is not None:
        if cuda is None:
            raise ValueError("cuda_devices= is the emulated node's GPU count: it needs cuda='emulate'")
        check_int("cuda_devices", cuda_devices, minimum=1)


def check_trace_path(trace: str | os.PathLike[str]) -> None:
    """Refuse a trace path that cannot be written before any rank starts."""
    if not isinstance(trace, (str, os.PathLike)):
        raise TypeError(f"trace must be a file path, got {type(trace).__name__}")
    path = os.fspath(trace)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"trace={path!r} is a directory; pass a file path such as 'step.json'")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"trace={path!r}: its directory does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise PermissionError(f"trace={path!r}: its directory is not writable")


@dataclass(frozen=True, eq=False)
class RunOptions:
    """What one ``simdist.run`` was asked for (see ``simdist.run`` for each option)."""

    layout: Layout | None = None
    world_size: int | None = None  # filled in from the layout when None
    device: str | torch.device = "cpu"
    timeout: float = DEFAULT_TIMEOUT_S
    reduction: str | ReductionModel = "rank"
    seed: int = 0
    faults: FaultPlan | None = None
    trace: str | os.PathLike[str] | None = None
    flight_records: int = DEFAULT_RECORDS
    attempt: int = 0
    schedule: str = "rank"
    schedule_seed: int | None = None
    rank_local: Sequence[Any] = ()
    share_args: bool = False
    strict_call_sites: bool = False
    check_async: bool = True  # the collective sanitizer (simdist._sanitizer)
    strict_async: bool = False
    check_group_order: bool = False
    cuda: str | None = None  # CUDA emulation (simdist._cuda)
    cuda_devices: int | None = None
    # debug hook: simdist.debug's options (checked when the run starts, and by the marker)
    post_mortem: bool | None = None
    break_at: Any = None
    caller: str = field(default="run()", repr=False)  # who to name in "needs layout= or world_size="

    def __post_init__(self) -> None:
        # The order is run's of old: the world, then each option as listed.
        _, n = resolve_world(self.layout, self.world_size, self.caller)
        object.__setattr__(self, "world_size", n)
        object.__setattr__(self, "timeout", check_positive_seconds("timeout", self.timeout))
        # Parsed here; whether CUDA is there is asked when the run starts (a
        # marked gpu test is collected, then skipped, on a machine without).
        torch.device(self.device)
        if self.faults is not None and not isinstance(self.faults, FaultPlan):
            raise TypeError(f"faults must be a simdist.FaultPlan, got {type(self.faults).__name__}")
        check_int("flight_records", self.flight_records, minimum=1)
        if self.trace is not None:
            check_trace_path(self.trace)
        check_bool("share_args", self.share_args)
        check_bool("strict_call_sites", self.strict_call_sites)
        check_bool("check_async", self.check_async)
        check_bool("strict_async", self.strict_async)
        check_bool("check_group_order", self.check_group_order)
        check_cuda(self.cuda, self.cuda_devices)
        check_debug_options(self.post_mortem, self.break_at, n)  # debug hook: refused before any rank starts
        check_int("seed", self.seed)
        check_int("attempt", self.attempt, minimum=0)
        make_model(self.reduction, self.seed)
        scheduled = make_policy(self.schedule, self.policy_seed) is not None
        if not scheduled and self.rank_local:
            raise ValueError(
                "rank_local needs a scheduled run (schedule='rank' or 'random'): "
                "with schedule='concurrent' every rank runs at once, so "
                "process-wide values cannot belong to one rank at a time"
            )

    @property
    def size(self) -> int:
        """The world size (always set once built)."""
        assert self.world_size is not None
        return self.world_size

    @property
    def policy_seed(self) -> int:
        """The schedule's seed: ``schedule_seed``, else the run's ``seed``."""
        return self.seed if self.schedule_seed is None else self.schedule_seed

    @property
    def emulated_devices(self) -> int:
        """The emulated node's GPU count (``cuda="emulate"``)."""
        if self.cuda_devices is not None:
            return self.cuda_devices
        return min(self.size, MAX_EMULATED_DEVICES)

    def devices(self) -> list[torch.device]:
        if self.cuda == "emulate" and torch.device(self.device).type == "cuda":
            # The emulated node's devices, round robin as on a real one.
            dev = torch.device(self.device)
            count = self.emulated_devices
            return [
                torch.device("cuda", r % count if dev.index is None else dev.index) for r in range(self.size)
            ]
        return [resolve_device(self.device, r) for r in range(self.size)]

    def replace(self, **changes: Any) -> RunOptions:
        """A copy with ``changes``, validated again."""
        return dataclasses.replace(self, **changes)


# Every option a caller may give (the world aside), in RunOptions' order: the
# pytest marker accepts exactly these.
OPTION_NAMES: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(RunOptions) if f.name not in ("layout", "world_size", "caller")
)
