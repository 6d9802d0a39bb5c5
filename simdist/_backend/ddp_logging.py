"""DDP's logging data names the backend the program asked for.

c10d's C++ logger fills ``_get_ddp_logging_data()`` from ``getBackendName()``,
which stays "simdist" (``group``); for a group asked for as gloo or NCCL the
data is completed as that backend's logger fills it (measured on torch 2.13;
docs/backend-compat.md).
"""

from __future__ import annotations

import os
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from .._isolation import patches

SIMULATED = "simdist"
# What c10d's logger reads from the environment for a group of that backend.
BACKEND_ENV = {
    "gloo": (
        ("gloo_socket_ifname", "GLOO_SOCKET_IFNAME"),
        ("gloo_device_transport", "GLOO_DEVICE_TRANSPORT"),
    ),
    "nccl": (
        ("nccl_socket_ifname", "NCCL_SOCKET_IFNAME"),
        ("nccl_blocking_wait", "NCCL_BLOCKING_WAIT"),
        ("nccl_async_error_handling", "NCCL_ASYNC_ERROR_HANDLING"),
        ("nccl_debug", "NCCL_DEBUG"),
        ("nccl_nthreads", "NCCL_NTHREADS"),
        ("nccl_ib_timeout", "NCCL_IB_TIMEOUT"),
    ),
}
# ProcessGroupGloo's default worker threads, which its logger reports.
BACKEND_INTS = {"gloo": {"gloo_num_threads": 2}}

_original: dict[str, Any] = {}


def _get_ddp_logging_data(self: DistributedDataParallel) -> dict[str, Any]:
    data: dict[str, Any] = _original["_get_ddp_logging_data"](self)
    asked = getattr(getattr(self, "process_group", None), "_get_backend_name", None)
    if data.get("backend_name") != SIMULATED or asked is None:
        return data
    name = str(asked())
    if name == SIMULATED or ":" in name or "," in name:
        return data  # simdist's own world, or a device map: no one backend to imitate
    data["backend_name"] = name
    for key, variable in BACKEND_ENV.get(name, ()):
        data[key] = os.environ.get(variable, "N/A")
    data.update(BACKEND_INTS.get(name, {}))
    return data


patches.register_swap(
    "ddp logging", _original, [(DistributedDataParallel, "_get_ddp_logging_data", _get_ddp_logging_data)]
)
