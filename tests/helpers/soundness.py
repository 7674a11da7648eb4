"""Soundness checks of θ certificates against an exact rational θ, and the documented width of exact rows."""

from __future__ import annotations

from fractions import Fraction

import torch

from tests.unit.theta.rows import error_radius, sums_error_free

BACKENDS = ("numba", "torch")


def assert_certificate_sound(lower: float, upper: float, theta: Fraction, label: str) -> None:
    """lower ≤ θ ≤ upper with θ an exact rational: no tolerance at all."""
    assert Fraction(lower) <= theta <= Fraction(upper), f"{label}: θ={float(theta)!r} ∉ [{lower!r}, {upper!r}]"


def assert_exact_width(row: torch.Tensor, lower: float, upper: float, label: str) -> None:
    """Documented width of an exact row: 2^-49·max(1, s), plus (16·d* + 4)·E ≤ (8s + 4)·E when sums carry rounding."""
    s = float(row.to(torch.float64).sum())
    allowed = 2.0**-49 * max(1.0, s)
    if not sums_error_free(row):
        allowed += (8.0 * s + 4.0) * error_radius(row) + 8 * error_radius(row) ** 2
    assert upper - lower <= allowed, f"{label}: exact row width {upper - lower:.3g} > {allowed:.3g}"
