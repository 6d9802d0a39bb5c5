"""The process's random generators as state slots: torch's (CPU, and CUDA when
the caller has initialised it), ``random``'s and numpy's global ones.

Reading a Mersenne Twister through ``getstate`` costs microseconds a switch;
the fingerprints read its words in place so a switch skips generators a rank
never drew from.
"""

from __future__ import annotations

import ctypes
import random
import struct
from collections.abc import Callable
from typing import Any

import torch

from .slots import _same, _Slot

_np: Any
try:
    import numpy as _np
except ImportError:  # numpy is optional for simdist
    _np = None


_MT_BYTES = 4 + 624 * 4  # CPython's RandomObject: int index; uint32_t state[624]


def _python_random_fingerprint() -> Callable[[], Any] | None:
    """The Mersenne Twister words of ``random``'s global instance, read in
    place (reading them through getstate costs ~9 us a switch). Checked
    against getstate once, so another interpreter's layout disables it."""
    inst: Any = random._inst  # Any: gauss_next is not in the stubs
    address = id(inst) + object.__basicsize__
    try:
        raw = ctypes.string_at(address, _MT_BYTES)
        words = struct.unpack("624I", raw[4:])
        state = inst.getstate()[1]
        if words != state[:624] or struct.unpack("i", raw[:4])[0] != state[624]:
            return None
    except Exception:
        return None
    return lambda: (ctypes.string_at(address, _MT_BYTES), inst.gauss_next)


def _numpy_fingerprint() -> Callable[[], Any] | None:
    """numpy's legacy generator words (get/set_state cost ~35 us each). A
    cached Gaussian is spent without touching them, so the fingerprint only
    vouches for a state without one (see ``_NUMPY_GAUSS``)."""
    try:
        address = _np.random.mtrand._rand._bit_generator.ctypes.state_address
    except Exception:
        return None
    return lambda: ctypes.string_at(address, _MT_BYTES)


def _numpy_has_gauss(state: Any) -> bool:
    return bool(state[3])


def _builtin_slots() -> list[_Slot]:
    slots = [
        _Slot("torch default generator", torch.get_rng_state, torch.set_rng_state, _same),
        _Slot("random", random.getstate, random.setstate, _same, _python_random_fingerprint()),
    ]
    if _np is not None:
        slots.append(
            _Slot("numpy.random", _np.random.get_state, _np.random.set_state, _same, _numpy_fingerprint())
        )
    # Only touch CUDA when the caller already has: initialising it here would
    # cost seconds and may fail on a machine without a driver.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        slots.append(
            _Slot("torch.cuda generators", torch.cuda.get_rng_state_all, torch.cuda.set_rng_state_all, _same)
        )
    return slots
