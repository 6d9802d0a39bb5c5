"""CUDA emulation: CUDA-first code run on the CPU, each rank on its own emulated GPU.

``simdist.run(..., cuda="emulate")``: docs/cuda.md; the modules: docs/internals.md.
"""

from __future__ import annotations

from . import device_api, patch, streams
from .mode import EmulatedCudaMode
from .tensor import EmulatedCudaParameter, EmulatedCudaTensor

__all__ = [
    "EmulatedCudaMode",
    "EmulatedCudaParameter",
    "EmulatedCudaTensor",
    "device_api",
    "patch",
    "streams",
]
