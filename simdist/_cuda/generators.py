"""CUDA's random generators on emulated devices: one per rank and device (docs/cuda.md).

Emulated draws run on the CPU, so a random op on an emulated device runs with
the CPU generator's state swapped for that device's emulated generator (a CPU
generator started at CUDA's default seed): CPU and CUDA draws do not disturb
each other. The values are the CPU generator's algorithm, not a GPU's (Philox).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import device_api

DEFAULT_SEED = 67280421310721  # CUDA's default generator seed, as torch sets it


def _generator(emulated: Any, rank: int, index: int) -> torch.Generator:
    """``rank``'s generator of ``cuda:index``, made on first use."""
    generator = emulated.generators.get((rank, index))
    if generator is None:
        generator = emulated.generators[rank, index] = torch.Generator()
        generator.manual_seed(DEFAULT_SEED)
    return generator


def _mine(device: Any = None) -> torch.Generator:
    """The calling rank's generator of ``device`` (its current device: None, "cuda")."""
    emulated, rank = device_api.emulating_rank()
    return _generator(emulated, rank, device_api.device_index(None if device == "cuda" else device))


def _all() -> list[torch.Generator]:
    emulated, rank = device_api.emulating_rank()
    return [_generator(emulated, rank, index) for index in range(emulated.device_count)]


def drawing_on(index: int, op: Callable[[], Any]) -> Any:
    """``op()`` (a random op on ``cuda:index``) drawing from that device's generator."""
    found = device_api.emulation()
    if found is None:
        return op()
    generator = _generator(*found, index)
    cpu = torch.default_generator
    saved = cpu.get_state()
    cpu.set_state(generator.get_state())
    try:
        return op()
    finally:
        generator.set_state(cpu.get_state())
        cpu.set_state(saved)


def manual_seed(seed: int) -> None:
    _mine().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for generator in _all():
        generator.manual_seed(int(seed))


def seed() -> None:
    _mine().seed()


def seed_all() -> None:
    value = _mine().seed()
    for generator in _all():
        generator.manual_seed(value)


def initial_seed() -> int:
    return int(_mine().initial_seed())


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return _mine(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    _mine(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [generator.get_state() for generator in _all()]


def set_rng_state_all(new_states: Sequence[torch.Tensor]) -> None:
    for generator, state in zip(_all(), new_states):
        generator.set_state(state)


REPLACEMENTS: dict[str, Callable[..., Any]] = {
    "manual_seed": manual_seed,
    "manual_seed_all": manual_seed_all,
    "seed": seed,
    "seed_all": seed_all,
    "initial_seed": initial_seed,
    "get_rng_state": get_rng_state,
    "set_rng_state": set_rng_state,
    "get_rng_state_all": get_rng_state_all,
    "set_rng_state_all": set_rng_state_all,
}
