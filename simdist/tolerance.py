"""Tolerances sound by construction: compare a distributed result with a float64 reference.

A plain ``rtol``/``atol`` is relative to the result, but the rounding error of
a sum is relative to the magnitudes of its terms: ``p_s - p_t`` with both
probabilities near 0.5 keeps the float32 error of each (about ``2**-24 *
(p_s + p_t)``) while its value may be 1e-4, so a bound of ``rtol * |p_s -
p_t|`` fails on correct code as soon as a case has one contributing token.
Two sound bounds, usable together:

- from the magnitudes of the summed terms: a sum (dot product, reduction over
  ranks) of ``terms`` values in a dtype with unit roundoff ``u`` is within
  ``gamma(terms) * sum |term|`` of the exact one, ``gamma(n) = n u / (1 - n u)``
  (Higham, Accuracy and Stability of Numerical Algorithms, 3.1);
- from a shadow run: the same computation in the working dtype in one process;
  its error against float64 is what that dtype costs without any distribution.
  A shadow can be lucky (an error of 0), so it widens the magnitude bound
  rather than replacing it.

``check_close`` returns the worst error as a fraction of its bound, a score in
``[0, 1]`` for passing results, so ``hypothesis.target`` can compare scores of
different outputs and cases (see docs/tolerances.md).
"""

from __future__ import annotations

import torch

__all__ = ["ToleranceError", "check_close", "magnitude_bound", "unit_roundoff"]


class ToleranceError(AssertionError):
    """A result is further from its reference than its bound allows."""


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the distance from 1 to the next value of ``dtype`` (2**-24 for float32)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"unit_roundoff: dtype must be a floating torch.dtype, got {dtype!r}")
    return float(torch.finfo(dtype).eps) / 2


def magnitude_bound(magnitudes: torch.Tensor, *, dtype: torch.dtype, terms: int) -> torch.Tensor:
    """``gamma(terms) * magnitudes``: the rounding error a sum of ``terms`` values in
    ``dtype`` may carry, where ``magnitudes`` is the sum of the terms' absolute values
    (computed in float64 from the reference's own pieces)."""
    if not isinstance(terms, int) or isinstance(terms, bool) or terms < 1:
        raise ValueError(f"magnitude_bound: terms must be an int >= 1, got {terms!r}")
    nu = terms * unit_roundoff(dtype)
    if nu >= 1:
        raise ValueError(
            f"magnitude_bound: {terms} terms in {dtype} bound nothing (terms * unit roundoff = {nu:.3g} >= 1)"
        )
    return magnitudes.detach().to(torch.float64).abs() * (nu / (1 - nu))


def check_close(
    actual: torch.Tensor,
    reference: torch.Tensor,
    *,
    dtype: torch.dtype,
    magnitudes: torch.Tensor | None = None,
    terms: int = 1,
    shadow: torch.Tensor | None = None,
    factor: float = 2.0,
    stored_in: torch.dtype | None = None,
    what: str = "result",
) -> float:
    """Checks ``actual`` against the float64 ``reference``; returns the worst error as a
    fraction of its bound (at most 1 when it passes) and raises ``ToleranceError`` past it.

    The bound per element is ``factor * max(magnitude_bound(magnitudes, dtype, terms),
    |shadow - reference|)``, plus the smallest normal value of ``dtype`` (an exact zero
    stays comparable). At least one of ``magnitudes`` and ``shadow`` is needed, unless
    ``stored_in`` is given. Infinite and NaN elements must sit where the reference has
    them.

    ``stored_in``: the result was computed in ``dtype`` and then rounded once to this
    dtype (mixed precision's commonest pattern: a float32 sum stored in bfloat16). One
    rounding adds at most ``u`` (``unit_roundoff(stored_in)``) of the value it rounds,
    which is within the bound above of the reference, so the bound becomes
    ``bound * (1 + u) + u * |reference|`` (plus ``u`` times the smallest normal value of
    ``stored_in``, for values that round to a subnormal)."""
    if stored_in is not None:
        unit_roundoff(stored_in)  # a floating dtype, or the clear error
    if magnitudes is None and shadow is None and stored_in is None:
        raise ValueError(
            "check_close: give magnitudes= (the summed terms' |values|), shadow=, stored_in= or a combination"
        )
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not factor >= 1:
        raise ValueError(f"check_close: factor must be a number >= 1, got {factor!r}")
    got = actual.detach().to(torch.float64)
    want = reference.detach().to(torch.float64)
    if got.shape != want.shape:
        raise ValueError(
            f"check_close: {what}: shape {tuple(got.shape)} against reference {tuple(want.shape)}"
        )
    allowed = torch.zeros_like(want)
    if magnitudes is not None:
        allowed = torch.maximum(
            allowed, magnitude_bound(magnitudes, dtype=dtype, terms=terms).expand_as(want)
        )
    if shadow is not None:
        allowed = torch.maximum(allowed, (shadow.detach().to(torch.float64) - want).abs().nan_to_num(0.0))
    if stored_in is not None:
        u = unit_roundoff(stored_in)
        allowed = allowed * (1 + u) + u * (want.abs().nan_to_num(0.0) + float(torch.finfo(stored_in).tiny))
    allowed = factor * allowed + float(torch.finfo(dtype).tiny)
    finite = torch.isfinite(want)
    same_specials = bool(((torch.isfinite(got) == finite) & (got.isnan() == want.isnan())).all())
    both_inf = ~finite & (got == want)
    error = torch.where(finite, (got - want).abs(), torch.zeros_like(want))
    ratio = torch.where(finite | both_inf, error / allowed, torch.zeros_like(want))
    worst = float(ratio.max()) if ratio.numel() else 0.0
    if not same_specials or worst > 1.0:
        at = int(ratio.reshape(-1).argmax()) if ratio.numel() else 0
        detail = (
            "non-finite values where the reference has finite ones (or the other way round)"
            if not same_specials
            else (
                f"error {worst:.3g}x its bound at flat index {at}: got {float(got.reshape(-1)[at]):.9g}, "
                f"reference {float(want.reshape(-1)[at]):.9g}, bound {float(allowed.reshape(-1)[at]):.3e}"
            )
        )
        stored = f", stored in {stored_in}" if stored_in is not None else ""
        raise ToleranceError(f"{what}: {detail} ({dtype}{stored}, terms={terms}, factor={factor})")
    return worst
