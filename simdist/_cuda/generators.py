"""CUDA's random generators on emulated devices: one per rank and device.

On a GPU, draws on CUDA tensors come from the device's own generator,
seeded by ``torch.cuda.manual_seed`` (and by ``torch.manual_seed``, which
seeds every device), independent of the CPU generator. Emulated draws run on
the CPU, so a random op on an emulated device runs with the CPU generator's
state swapped for that device's emulated generator (a CPU generator started
at CUDA's default seed): CPU and CUDA draws do not disturb each other, and
seeding one seeds only it. The values are the CPU generator's, not a GPU's
(Philox): equal seeds give equal draws here, not the draws a GPU gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import device_api

DEFAULT_SEED = 67280421310721  # CUDA's default generator seed, as torch sets it


class RankGenerators:
    """One rank's emulated CUDA generators, made on first use."""

    def __init__(self, device_count: int) -> None:
        self._generators: list[torch.Generator | None] = [None] * device_count

    def get(self, index: int) -> torch.Generator:
        generator = self._generators[index]
        if generator is None:
            generator = self._generators[index] = torch.Generator()
            generator.manual_seed(DEFAULT_SEED)
        return generator

    def all(self) -> list[torch.Generator]:
        return [self.get(index) for index in range(len(self._generators))]


def _of(emulated: Any, rank: int) -> RankGenerators:
    made = emulated.generators.get(rank)
    if made is None:
        made = emulated.generators[rank] = RankGenerators(emulated.device_count)
    return made


def _mine() -> tuple[RankGenerators, int] | None:
    found = device_api.emulation()
    if found is None:
        return None
    emulated, rank = found
    return _of(emulated, rank), emulated.current(rank)


def drawing_on(index: int, op: Callable[[], Any]) -> Any:
    """``op()`` (a random op on ``cuda:index``) drawing from that device's generator."""
    found = device_api.emulation()
    if found is None:
        return op()
    generator = _of(*found).get(index)
    cpu = torch.default_generator
    saved = cpu.get_state()
    cpu.set_state(generator.get_state())
    try:
        return op()
    finally:
        generator.set_state(cpu.get_state())
        cpu.set_state(saved)


def manual_seed(seed: int) -> None:
    gens, index = _mine()  # type: ignore[misc]  # only called from the emulating replacements
    gens.get(index).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    gens, _ = _mine()  # type: ignore[misc]
    for generator in gens.all():
        generator.manual_seed(int(seed))


def seed() -> None:
    gens, index = _mine()  # type: ignore[misc]
    gens.get(index).seed()


def seed_all() -> None:
    gens, index = _mine()  # type: ignore[misc]
    value = gens.get(index).seed()
    for generator in gens.all():
        generator.manual_seed(value)


def initial_seed() -> int:
    gens, index = _mine()  # type: ignore[misc]
    return int(gens.get(index).initial_seed())


def _index(device: Any) -> int:
    return device_api.device_index(None if device == "cuda" else device)


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    gens, _ = _mine()  # type: ignore[misc]
    return gens.get(_index(device)).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    gens, _ = _mine()  # type: ignore[misc]
    gens.get(_index(device)).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    gens, _ = _mine()  # type: ignore[misc]
    return [generator.get_state() for generator in gens.all()]


def set_rng_state_all(new_states: Sequence[torch.Tensor]) -> None:
    gens, _ = _mine()  # type: ignore[misc]
    for generator, state in zip(gens.all(), new_states):
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
