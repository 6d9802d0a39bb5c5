"""Each planted race of the corpus fails at its racing line; with the wait put back it runs clean."""

from __future__ import annotations

import inspect
import os
import re

import pytest
import race_corpus
import torch
from race_corpus import CASES, WORLD

import simdist


def racing_line(name: str) -> str:
    """``race_corpus.py:N`` of the line marked ``# RACE`` in the case."""
    lines, first = inspect.getsourcelines(CASES[name])
    marked = [first + i for i, line in enumerate(lines) if line.rstrip().endswith("# RACE")]
    assert len(marked) == 1, f"{name} must mark exactly one racing line"
    return f"{os.path.basename(race_corpus.__file__)}:{marked[0]}"


def test_the_corpus_has_at_least_twelve_races_each_with_its_reference() -> None:
    assert len(CASES) >= 12
    assert set(race_corpus.EXPECTED) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_race_fails_at_its_line(name: str) -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(CASES[name], world_size=WORLD, args=(False,), timeout=60.0)
    races = {r: e for r, e in info.value.failures.items() if isinstance(e, simdist.AsyncRaceError)}
    assert races, f"no AsyncRaceError: {info.value.failures}"
    for rank, error in races.items():
        message = str(error)
        assert message.startswith(f"rank {rank}: "), message
        # The racing op is named at its own line (a path relative to the working directory).
        assert re.search(rf" at (\S*/)?{re.escape(racing_line(name))} ", message.split(", while ")[0]), (
            message
        )
        assert "still in flight" in message and (" seq " in message or "(tag " in message), message
        assert "NCCL" in message and "gloo" in message, message


@pytest.mark.parametrize("name", sorted(CASES))
def test_with_the_wait_put_back_it_runs_clean(name: str) -> None:
    got = simdist.run(CASES[name], world_size=WORLD, args=(True,), timeout=60.0)
    want = race_corpus.EXPECTED[name]()
    for rank in range(WORLD):
        assert _close(got[rank], want[rank]), (name, rank, got[rank], want[rank])


def _close(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return bool(torch.allclose(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-12, atol=1e-12))
