"""CUDA emulation: CUDA-first code run on the CPU, each rank on its own emulated GPU.

``simdist.run(..., cuda="emulate")`` (docs/cuda.md): ``device_api`` answers
``torch.cuda``'s device questions per rank, ``mode`` makes ``device="cuda"``
mean the emulated device, ``tensor`` is the emulated tensor itself.
"""

from __future__ import annotations

from . import device_api
from .mode import EmulatedCudaMode
from .tensor import EmulatedCudaParameter, EmulatedCudaTensor

__all__ = ["EmulatedCudaMode", "EmulatedCudaParameter", "EmulatedCudaTensor", "device_api"]
