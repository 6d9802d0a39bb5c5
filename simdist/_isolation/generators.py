"""The process's random generators as state slots: torch's (CPU, and CUDA when
the caller has initialised it), ``random``'s and numpy's global ones.

Reading a generator's state through its API costs microseconds a switch
(torch's CPU ``get_state`` copies 5 KB into a new tensor, ``random.getstate``
builds a 625-tuple); the fingerprints read the generators' words in place, so
a switch skips generators the ranks never drew from. Each in-place layout is
checked against the API once, on objects of its own, and a layout that does
not match turns the fingerprint off (the state is then read at every switch).
"""

from __future__ import annotations

import ctypes
import random
import struct
from collections.abc import Callable
from typing import Any, cast

import torch

from .slots import _same, _Slot

_np: Any
try:
    import numpy as _np
except ImportError:  # numpy is optional for simdist
    _np = None


_MT_WORDS = 624
_MT_BYTES = 4 + _MT_WORDS * 4  # CPython's RandomObject: int index; uint32_t state[624]


def _in_place(address: int, size: int) -> Callable[[], bytes]:
    """A reader of ``size`` bytes at ``address``: a view made once, copied out
    per call (a third of ``ctypes.string_at``'s cost; the view keeps its
    buffer object alive)."""
    return memoryview((ctypes.c_char * size).from_address(address)).tobytes


# random's global instance -> its fingerprint (checked once per instance:
# the check reads the whole state through getstate, ~35 us).
_random_fingerprints: dict[int, tuple[Any, Callable[[], Any] | None]] = {}


def _python_random_fingerprint() -> Callable[[], Any] | None:
    """The Mersenne Twister words of ``random``'s global instance, read in
    place (reading them through getstate costs ~9 us a switch). Checked
    against getstate once per instance, so another interpreter's layout
    disables it."""
    inst: Any = random._inst  # Any: gauss_next is not in the stubs
    known = _random_fingerprints.get(id(inst))
    if known is not None and known[0] is inst:
        return known[1]
    fingerprint = _checked_random_fingerprint(inst)
    _random_fingerprints.clear()  # (one instance is global at a time; the entry keeps it alive)
    _random_fingerprints[id(inst)] = (inst, fingerprint)
    return fingerprint


def _checked_random_fingerprint(inst: Any) -> Callable[[], Any] | None:
    address = id(inst) + object.__basicsize__
    try:
        raw = ctypes.string_at(address, _MT_BYTES)
        words = struct.unpack("624I", raw[4:])
        state = inst.getstate()[1]
        if words != state[:624] or struct.unpack("i", raw[:4])[0] != state[624]:
            return None
    except Exception:
        return None
    read = _in_place(address, _MT_BYTES)
    return lambda: (read(), inst.gauss_next)


# numpy's legacy RandomState keeps its cached Gaussian beside its bit
# generator pointer (aug_bitgen_t): an int flag, padding, the double.
_GAUSS = struct.Struct("<i4xd")
_GAUSS_SEARCH = 512  # how far into the object it is looked for
_GAUSS_PROBE = 0.3748291015625


def _numpy_gauss_offset() -> int | None:
    """Where a RandomState keeps its cached Gaussian (the flag, then the
    value), as an offset into the object; found and checked on a RandomState
    of its own: a planted sample found in place, its flag set and cleared
    through ``set_state``, and a draw that caches one read the same in place
    as through ``get_state``. None where any of it does not hold."""
    try:
        probe = _np.random.RandomState(0x5EED)
        size = min(type(probe).__basicsize__, _GAUSS_SEARCH)
        state = list(probe.get_state())
        state[3], state[4] = 1, _GAUSS_PROBE
        probe.set_state(tuple(state))
        at = ctypes.string_at(id(probe), size).find(struct.pack("<d", _GAUSS_PROBE)) - 8
        if at < 0 or _GAUSS.unpack_from(ctypes.string_at(id(probe) + at, _GAUSS.size)) != (1, _GAUSS_PROBE):
            return None
        state[3], state[4] = 0, 0.0
        probe.set_state(tuple(state))
        if _GAUSS.unpack_from(ctypes.string_at(id(probe) + at, _GAUSS.size))[0] != 0:
            return None
        probe.standard_normal()  # the polar method caches the pair's second sample
        cached = probe.get_state()
        if cached[3] != 1 or _GAUSS.unpack_from(ctypes.string_at(id(probe) + at, _GAUSS.size)) != (
            1,
            cached[4],
        ):
            return None
    except Exception:
        return None
    return at


_NUMPY_GAUSS_OFFSET = _numpy_gauss_offset() if _np is not None else None
# numpy's global RandomState -> its fingerprint (checked once per object).
_numpy_fingerprints: dict[int, tuple[Any, Callable[[], Any] | None, bool]] = {}


def _numpy_fingerprint() -> Callable[[], Any] | None:
    """numpy's legacy generator words (get/set_state cost ~35 us each) and its
    cached Gaussian, read in place. Where the Gaussian's place is not known
    (``_NUMPY_GAUSS_OFFSET``), only the words are read: a cached Gaussian is
    spent without touching them, so the fingerprint then vouches only for a
    state without one (see ``numpy_unvouched``)."""
    try:
        rand = _np.random.mtrand._rand
        known = _numpy_fingerprints.get(id(rand))
        if known is not None and known[0] is rand:
            return known[1]
        words = _in_place(rand._bit_generator.ctypes.state_address, _MT_BYTES)
    except Exception:
        return None
    fingerprint: Callable[[], Any] = words
    whole = False
    if _NUMPY_GAUSS_OFFSET is not None:
        gauss = _in_place(id(rand) + _NUMPY_GAUSS_OFFSET, _GAUSS.size)
        try:
            state = rand.get_state()
            whole = _GAUSS.unpack(gauss()) == (state[3], state[4])
        except Exception:
            whole = False
        if whole:
            fingerprint = lambda: (words(), gauss())  # noqa: E731  (a closure over both readers)
    _numpy_fingerprints.clear()  # (the entry keeps the object alive, so its id stays its own)
    _numpy_fingerprints[id(rand)] = (rand, fingerprint, whole)
    return fingerprint


def numpy_fingerprint_whole() -> bool:
    """Whether numpy's fingerprint reads its cached Gaussian too (then it
    vouches for every state)."""
    if _np is None:
        return False
    known = _numpy_fingerprints.get(id(_np.random.mtrand._rand))
    return known is not None and known[2]


def numpy_unvouched(state: Any) -> bool:
    """Whether numpy's fingerprint cannot vouch for ``state``: one with a
    cached Gaussian, where the fingerprint reads only the words."""
    if not state[3]:
        return False
    known = _numpy_fingerprints.get(id(_np.random.mtrand._rand))
    return known is None or not known[2]


# torch's CPU generator state, as ``Generator.get_state`` serialises it (the
# legacy THGeneratorState, then the cached float sample): the fields it
# holds and their offsets.
_LEGACY_HEAD = struct.Struct("<QiiQ")  # initial seed, left, seeded, next
_LEGACY_WORDS = struct.Struct(f"<{_MT_WORDS}Q")
_LEGACY_NORMAL_Y, _LEGACY_NORMAL_VALID = 24 + _MT_WORDS * 8 + 8, 24 + _MT_WORDS * 8 + 24
# In place (CPUGeneratorImpl): the engine's seed (uint64), left (int), seeded
# (bool), next (uint32) and state (uint32[624]), then the cached float and
# double normal samples (std::optional: the value, then its engaged flag).
_ENGINE_HEAD = struct.Struct("<QiB3xI")
_ENGINE_WORDS = struct.Struct(f"<{_MT_WORDS}I")
_SEARCH_BYTES = 3072  # how far into the object the engine is looked for
_PROBE_SEED = 0x5EED_51D1_57AB_1E00


def _generator_impl(gen: torch.Generator) -> int | None:
    """The address of a Generator's C++ implementation: torch's Python object
    is the object head, then the ``at::Generator`` (one intrusive pointer)."""
    head = object.__basicsize__
    if type(gen).__basicsize__ < head + ctypes.sizeof(ctypes.c_void_p):
        return None
    return ctypes.c_void_p.from_address(id(gen) + head).value or None


def _legacy_fields(state: bytes) -> tuple[tuple[int, int, int, int], tuple[int, ...]]:
    seed, left, seeded, next_ = _LEGACY_HEAD.unpack_from(state, 0)
    return (seed, left, seeded, next_), _LEGACY_WORDS.unpack_from(state, _LEGACY_HEAD.size)


def _torch_cpu_layout() -> tuple[int, int] | None:
    """Where a CPU generator keeps its state in place: (offset, size) of the
    span from the engine's seed to the cached double sample's engaged flag,
    which holds every field ``get_state`` serialises (the cached float sample
    lies between the engine and the double one). Found and checked on a
    generator of its own, never the default one: the engine by its words
    after a seed and some draws, the double sample by a state that has one
    (set through ``set_state``) and one that has none."""
    probe = torch.Generator("cpu")
    impl = _generator_impl(probe)
    if impl is None:
        return None
    probe.manual_seed(_PROBE_SEED)
    torch.rand(7, generator=probe, device="cpu")  # left and next away from their seeded values
    state = bytes(probe.get_state().numpy())
    head, words = _legacy_fields(state)
    raw = ctypes.string_at(impl, _SEARCH_BYTES)
    at = raw.find(_ENGINE_WORDS.pack(*words))
    start = at - _ENGINE_HEAD.size
    if at < 0 or start < 0:
        return None
    seed, left, seeded, next_ = _ENGINE_HEAD.unpack_from(raw, start)
    if (seed, left, seeded, next_) != head:
        return None
    # A cached double sample with a value found nowhere else in the object.
    sample = 0.3748291015625
    crafted = bytearray(state)
    struct.pack_into("<d", crafted, _LEGACY_NORMAL_Y, sample)
    struct.pack_into("<i", crafted, _LEGACY_NORMAL_VALID, 1)
    probe.set_state(torch.frombuffer(crafted, dtype=torch.uint8).clone())
    tail_at = at + _ENGINE_WORDS.size
    tail = ctypes.string_at(impl + tail_at, 64)
    found = tail.find(struct.pack("<d", sample))
    if found < 0 or tail[found + 8] != 1:
        return None
    engaged = tail_at + found + 8
    torch.randn(1, generator=probe, dtype=torch.float64, device="cpu")  # spends the cached sample
    if struct.unpack_from("<i", bytes(probe.get_state().numpy()), _LEGACY_NORMAL_VALID)[0] != 0:
        return None
    if ctypes.string_at(impl + engaged, 1) != b"\x00":
        return None
    return start, engaged + 1 - start


def _torch_cpu_fingerprint() -> Callable[[], Any] | None:
    """torch's CPU default generator read in place: its engine and cached
    normal samples, ~0.3 us against ~3-5 us for ``get_state`` (which has no
    cheap summary: the CPU generator keeps no offset). Every field
    ``get_state`` serialises lies in the span, so an unchanged span is an
    unchanged state; the span also holds padding, which can only make a
    state look changed (one read too many)."""
    try:
        layout = _torch_cpu_layout()
        impl = _generator_impl(torch.default_generator)
        if layout is None or impl is None:
            return None
        start, size = layout
        read = _in_place(impl + start, size)
        # The default generator, read both ways, must agree.
        head, words = _legacy_fields(bytes(torch.default_generator.get_state().numpy()))
        raw = read()
        if _ENGINE_HEAD.unpack_from(raw, 0) != head:
            return None
        if _ENGINE_WORDS.unpack_from(raw, _ENGINE_HEAD.size) != words:
            return None
    except Exception:
        return None
    return read


_TORCH_CPU_FINGERPRINT = _torch_cpu_fingerprint()


def _builtin_slots() -> list[_Slot]:
    generator = torch.default_generator
    # The generator's own methods (torch.get_rng_state and set_rng_state wrap
    # them in a Python call each); set_state returns the generator, unused.
    set_state = cast(Callable[[Any], None], generator.set_state)
    slots = [
        _Slot("torch default generator", generator.get_state, set_state, _same, _TORCH_CPU_FINGERPRINT),
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
