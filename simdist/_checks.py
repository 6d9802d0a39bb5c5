"""Argument validators shared by every layer (imports nothing of simdist).

Each check raises with the wording simdist has always used: the argument's
name, what was expected, what came. ``bool`` is refused wherever an int is
expected (``True`` is an ``int`` to Python, never a rank or a size to a user).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = [
    "MAX_SECONDS",
    "check_bool",
    "check_choice",
    "check_int",
    "check_positive_seconds",
    "is_int",
    "is_number",
]


def is_int(value: Any, minimum: int | None = None, below: int | None = None) -> bool:
    """An ``int`` (never a ``bool``) with ``minimum <= value < below`` where given."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return (minimum is None or value >= minimum) and (below is None or value < below)


def is_number(value: Any) -> bool:
    """An ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int_wording(minimum: int | None, below: int | None) -> str:
    if below is not None:
        return f"an int in [{0 if minimum is None else minimum}, {below})"
    if minimum == 1:
        return "a positive int"
    if minimum == 0:
        return "a non-negative int"
    if minimum is not None:
        return f"an int >= {minimum}"
    return "an int"


def check_int(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    below: int | None = None,
    prefix: str = "",
    show_type: bool = False,
) -> int:
    """``value`` when it is an int in range, else an error naming ``name``.

    Without bounds the error is a ``TypeError`` ("seed must be an int, got
    'x'"); with bounds a ``ValueError`` ("world_size must be a positive int,
    got 0"), as simdist has always worded them. ``show_type`` names the type
    that came instead of its repr.
    """
    if is_int(value, minimum, below):
        return int(value)
    got = type(value).__name__ if show_type else repr(value)
    error = TypeError if minimum is None and below is None else ValueError
    raise error(f"{prefix}{name} must be {_int_wording(minimum, below)}, got {got}")


# The longest wait simdist makes (about 31 years): a finite timeout past it
# is a valid timeout that waits this long, as threading's waits refuse more
# than TIMEOUT_MAX (OverflowError: timestamp out of range) and deadlines
# are sums and differences of it.
MAX_SECONDS = 1e9


def check_positive_seconds(name: str, value: Any, *, prefix: str = "") -> float:
    """A positive, finite number of seconds (a watchdog that never fires is no
    watchdog), at most ``MAX_SECONDS``: a larger one reads as that."""
    if not is_number(value) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{prefix}{name} must be a positive number of seconds, got {value!r}")
    return min(float(value), MAX_SECONDS)


def check_bool(name: str, value: Any, *, prefix: str = "", wording: str = "True or False") -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{prefix}{name} must be {wording}, got {value!r}")
    return value


def _or_list(choices: tuple[Any, ...]) -> str:
    if len(choices) == 2:
        return f"{choices[0]!r} or {choices[1]!r}"
    return "one of " + ", ".join(map(repr, choices))


def check_choice(name: str, value: Any, choices: Iterable[Any], *, prefix: str = "") -> Any:
    """``value`` when it is one of ``choices``: "backend must be 'gloo' or 'nccl', got 'mpi'"."""
    options = tuple(choices)
    try:
        if any(value == c and type(value) is type(c) for c in options):
            return value
    except Exception:  # a value that cannot be compared (a tensor) is no choice either
        pass
    raise ValueError(f"{prefix}{name} must be {_or_list(options)}, got {value!r}")
