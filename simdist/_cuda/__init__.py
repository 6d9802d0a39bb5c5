"""CUDA emulation: CUDA-first code run on the CPU, each rank on its own emulated GPU.

``simdist.run(..., cuda="emulate")`` (docs/cuda.md): ``device_api`` answers
``torch.cuda``'s device questions per rank, ``streams`` its streams and
events, ``generators`` its random generators, ``patch`` rebinds
``torch.cuda``'s names (and autocast's, NCCL's) while emulating runs are in
progress, ``mode`` makes ``device="cuda"`` mean the emulated device and gives
torch's own results the device, ``tensor`` is the emulated tensor itself,
``ordering`` and ``collectives`` apply CUDA's stream rules.
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
