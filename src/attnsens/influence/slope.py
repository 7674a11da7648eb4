"""Least-squares log–log slope of measured influence versus n, with a Student-t confidence interval.

The t quantile is computed here (no scipy): the t CDF is 1 − ½ I_{ν/(ν+t²)}(ν/2, ½) with the regularized
incomplete beta function I evaluated by its continued fraction (modified Lentz), and the quantile by bisection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from attnsens.errors import ConfigError, InputError


@dataclass(frozen=True, kw_only=True)
class SlopeFit:
    """log influence = intercept + slope · log n, fitted by least squares over ``n_points`` lengths."""

    slope: float
    intercept: float
    slope_ci: tuple[float, float]
    confidence: float
    r_squared: float
    n_points: int


def _incomplete_beta_fraction(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < eps:
            break
    return result


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) = B(x; a, b)/B(a, b) for a, b > 0 and 0 ≤ x ≤ 1 (continued fraction; relative error ~1e-14)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _incomplete_beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _incomplete_beta_fraction(b, a, 1.0 - x) / b


def student_t_cdf(t: float, dof: float) -> float:
    """P(T ≤ t) for Student's t with ``dof`` degrees of freedom."""
    tail = 0.5 * regularized_incomplete_beta(dof / 2.0, 0.5, dof / (dof + t * t))
    return 1.0 - tail if t >= 0 else tail


def _student_t_quantile(probability: float, dof: float) -> float:
    """t with P(T ≤ t) = probability (bisection on the CDF to 1e-12). ``_student_t_quantile(0.975, 1)`` ≈ 12.706."""
    if not 0.0 < probability < 1.0:
        raise ConfigError(f"probability must be in (0, 1), got {probability}")
    if not dof > 0:
        raise ConfigError(f"degrees of freedom must be > 0, got {dof}")
    if probability < 0.5:
        return -_student_t_quantile(1.0 - probability, dof)
    low, high = 0.0, 1.0
    while student_t_cdf(high, dof) < probability:
        high *= 2.0
    while high - low > 1e-12 * max(1.0, high):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if student_t_cdf(middle, dof) < probability else (low, middle)
    return 0.5 * (low + high)


def fit_loglog_slope(df: pd.DataFrame, *, column: str = "influence_max", confidence: float = 0.95) -> SlopeFit:
    """Least-squares fit of log(column) on log n, worst position kind per n, with a t confidence interval.

    Args:
        df: the output of :func:`attnsens.influence.measure` (columns ``n`` and ``column``).
        column: which measured quantity to fit.
        confidence: two-sided level of the slope interval (needs ≥ 3 distinct lengths).

    Returns:
        SlopeFit; the theorem predicts slope ≤ −1 for unmasked LN-free models (docs/math.md §10.5).
    """
    if column not in df.columns or "n" not in df.columns:
        raise InputError(f"the table needs columns 'n' and {column!r}; got {list(df.columns)}")
    per_length = df.groupby("n")[column].max()
    if (per_length <= 0).any() or per_length.isna().any():
        raise InputError(f"{column} must be positive to take logarithms; got {per_length.to_dict()}")
    if len(per_length) < 3:
        raise InputError(f"a slope with a confidence interval needs >= 3 distinct lengths, got {len(per_length)}")
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence must be in (0, 1), got {confidence}")
    x = [math.log(float(n)) for n in per_length.index]
    y = [math.log(float(v)) for v in per_length.to_numpy()]
    m = len(x)
    x_mean, y_mean = sum(x) / m, sum(y) / m
    sxx = sum((xi - x_mean) ** 2 for xi in x)
    slope = sum((xi - x_mean) * (yi - y_mean) for xi, yi in zip(x, y, strict=True)) / sxx
    intercept = y_mean - slope * x_mean
    residual = sum((yi - intercept - slope * xi) ** 2 for xi, yi in zip(x, y, strict=True))
    total = sum((yi - y_mean) ** 2 for yi in y)
    half_width = _student_t_quantile(0.5 + confidence / 2, m - 2) * math.sqrt(residual / (m - 2) / sxx)
    return SlopeFit(
        slope=slope,
        intercept=intercept,
        slope_ci=(slope - half_width, slope + half_width),
        confidence=confidence,
        r_squared=1.0 - residual / total if total > 0 else 1.0,
        n_points=m,
    )
