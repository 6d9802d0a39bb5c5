"""How many rank threads this process can start: a world larger than that
is refused before anything is built for it (building per-rank state for
10**8 ranks would run for minutes before the watchdog could start)."""

from __future__ import annotations

import threading

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
