"""Log–log slope fit and the Student-t quantile it uses (no scipy)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from attnsens.errors import InputError
from attnsens.influence import fit_loglog_slope
from attnsens.influence.slope import _student_t_quantile as student_t_quantile


@pytest.mark.parametrize(
    ("dof", "expected"),
    [(1, 12.706204736), (2, 4.302652730), (3, 3.182446305), (7, 2.364624252), (29, 2.045229642), (500, 1.964720)],
)
def test_t_quantile_matches_tables(dof: int, expected: float) -> None:
    assert student_t_quantile(0.975, dof) == pytest.approx(expected, rel=1e-6)


def test_t_quantile_is_symmetric_and_closed_form_at_two_dof() -> None:
    """For ν = 2, t_p = (2p − 1)·√(2 / (4p(1 − p)))."""
    for p in (0.6, 0.9, 0.99):
        closed = (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p)))
        assert student_t_quantile(p, 2) == pytest.approx(closed, rel=1e-9)
        assert student_t_quantile(1 - p, 2) == pytest.approx(-closed, rel=1e-9)


def _table(pairs: list[tuple[int, float]]) -> pd.DataFrame:
    return pd.DataFrame({"n": [n for n, _ in pairs], "influence_max": [v for _, v in pairs]})


def test_exact_power_law_gives_exact_slope_and_a_degenerate_interval() -> None:
    fit = fit_loglog_slope(_table([(n, 3.0 / n**1.5) for n in (4, 16, 64, 256)]))
    assert fit.slope == pytest.approx(-1.5, abs=1e-12)
    assert math.exp(fit.intercept) == pytest.approx(3.0, rel=1e-12)
    assert fit.slope_ci[1] - fit.slope_ci[0] == pytest.approx(0.0, abs=1e-9)


def test_interval_matches_a_hand_computation() -> None:
    """Three points (x = log n): residual variance s², se = s/√Sxx, half-width t_{0.975,1}·se."""
    ns, values = [1, math.e, math.e**2], [1.0, math.exp(-1.2), math.exp(-1.6)]
    fit = fit_loglog_slope(_table(list(zip(ns, values, strict=True))))
    # y = 0, −1.2, −1.6 at x = 0, 1, 2: slope −0.8, intercept −0.133…, residuals 0.133, −0.267, 0.133
    assert fit.slope == pytest.approx(-0.8, abs=1e-12)
    residual = (2 / 15) ** 2 * 2 + (4 / 15) ** 2
    half = 12.706204736 * math.sqrt(residual / 1 / 2)
    assert fit.slope_ci == pytest.approx((-0.8 - half, -0.8 + half), rel=1e-7)


def test_the_worst_position_kind_per_length_is_fitted() -> None:
    frame = pd.DataFrame({"n": [8, 8, 16, 16, 32, 32], "influence_max": [1 / 8, 9.0, 1 / 16, 0.001, 1 / 32, 0.001]})
    assert fit_loglog_slope(frame).slope != pytest.approx(-1.0)
    assert fit_loglog_slope(frame[frame.influence_max < 1]).slope == pytest.approx(-1.0)


def test_bad_tables_are_refused() -> None:
    with pytest.raises(InputError, match=">= 3 distinct lengths"):
        fit_loglog_slope(_table([(4, 0.1), (8, 0.05)]))
    with pytest.raises(InputError, match="positive"):
        fit_loglog_slope(_table([(4, 0.1), (8, 0.0), (16, 0.01)]))
