"""θ certificates at the edges of float64: subnormal rows, overflowing squares and the tolerance cap, against the
exact rational θ = s − 4·d*² of the stored row."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from attnsens.errors import ConfigError
from attnsens.theta import certify
from attnsens.theta._enclosure import theta_enclosure

F64 = torch.float64


def _theta_exact(row: list[float]) -> Fraction:
    values = [Fraction(v) for v in row]
    s = sum(values)
    d = min(abs(sum(c) - s / 2) for k in range(len(values) + 1) for c in itertools.combinations(values, k))
    return s - 4 * d * d


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize(
    "row",
    [[2.0**-1074] * 3, [2.0**-1074] * 5, [3 * 2.0**-1074, 2.0**-1073], [2.0**-1000, 2.0**-1001, 2.0**-1074]],
)
def test_subnormal_rows_are_enclosed(backend: str, row: list[float]) -> None:
    """Halving a subnormal sum is inexact: three entries 2^-1074 once certified lower = 3·2^-1074 > θ."""
    cert = certify(torch.tensor(row, dtype=F64), tolerance=1, backend=backend)
    theta = _theta_exact(row)
    assert Fraction(float(cert.lower)) <= theta <= Fraction(float(cert.upper))


def test_overflowing_squares_give_a_sound_interval_without_nan() -> None:
    def t(v: float) -> torch.Tensor:
        return torch.tensor([v], dtype=F64)

    for s, d, err in [(3e200, 1e200, 0.0), (3e200, 0.5e200, 1e190), (1e300, 1e300, 0.0)]:
        lower, upper = theta_enclosure(t(s), t(d), t(d), t(err))
        assert not (math.isnan(float(lower)) or math.isnan(float(upper)))
        highest = Fraction(s) + Fraction(err) - 4 * (Fraction(d) - Fraction(err)) ** 2  # s ≤ ŝ + E, d* ≥ d̂_lb − E
        assert float(lower) == -math.inf and Fraction(float(upper)) >= highest


@pytest.mark.parametrize("tolerance", [math.inf, 1.5, -0.1, math.nan])
def test_tolerance_beyond_one_is_refused(tolerance: float) -> None:
    with pytest.raises(ConfigError, match="tolerance"):
        certify(torch.tensor([1e200] * 3, dtype=F64), tolerance=tolerance)


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize(
    "row, dtype",
    [
        ([0.5, 0.5 - 2.0**-24, 2.0**-30], torch.float32),  # ulp(p_min) = 2^-53 leaves ŝ > 2^52·q; the lowest bit 2^-30
        ([0.5, 0.5 - 2.0**-9, 2.0**-40], torch.bfloat16),
        ([0.25, 0.25, 0.5 - 2.0**-20, 2.0**-20], torch.float16),
    ],
)
def test_float32_family_rows_with_few_low_bits_keep_the_width_promise(row, dtype, backend: str) -> None:
    """Error-free at the lowest set bit over the row, so exact with width ≤ 2^-49·max(1, s), on every backend;
    the interval holds the exact rational θ."""
    stored = torch.tensor(row, dtype=dtype)
    cert = certify(stored, tolerance=1e-2, backend=backend)
    values = [float(v) for v in stored.to(F64)]
    theta = _theta_exact(values)
    assert bool(cert.exact)
    assert float(cert.upper - cert.lower) <= 2.0**-49 * max(1.0, float(cert.row_sum))
    assert Fraction(float(cert.lower)) <= theta <= Fraction(float(cert.upper))
