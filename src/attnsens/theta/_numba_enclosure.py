"""The θ enclosure of ``_enclosure`` for one row, as a numba function, for kernels that enclose θ where they
compute the row's numbers instead of in a separate array pass.

Every operation is the one ``_enclosure`` applies element-wise, in the same order and in float64 (compiled without
fastmath, so nothing is reassociated or contracted into a fused multiply-add), so the two give the same bits:
``tests/unit/theta/test_enclosure.py`` compares them on real rows and on the edge ranges (errors, tiny sums,
overflow).
"""

from __future__ import annotations

import numpy as np

from attnsens._float64 import UNIT_ROUNDOFF
from attnsens._numba_cache import cached_njit

TINY_ROW_SUM = 2.0**-900
"""Below this ŝ the interval is [2 steps below ŝ(1 − 2^-20) − 2^-1074, 1 step above ŝ(1 + 2^-20) + 2^-1074]
(``_enclosure``'s tiny rows)."""
_LARGEST = np.finfo(np.float64).max
_SUBNORMAL = float(np.finfo(np.float64).smallest_subnormal)


@cached_njit(inline="always")
def _down(x):
    return np.nextafter(x, -np.inf)


@cached_njit(inline="always")
def _up(x):
    return np.nextafter(x, np.inf)


@cached_njit(inline="always")
def theta_interval(s_hat, d_found, d_lb, err):
    """(θ_lo, θ_hi) ∋ s − 4·d*² for one row from ŝ, d̂, d̂_lb and the error radius E (``_enclosure``)."""
    if s_hat < TINY_ROW_SUM:
        return _down(_down(s_hat * (1.0 - 2.0**-20) - _SUBNORMAL)), _up(s_hat * (1.0 + 2.0**-20) + _SUBNORMAL)
    has_err = err > 0
    s_lo = _down(s_hat - err) if has_err else s_hat
    s_hi = _up(s_hat + err) if has_err else s_hat
    d_hi = _up(d_found + err) if has_err else d_found
    d_lo = _down(d_lb - err) if has_err else d_lb
    d_lo = d_lo if d_lo > 0.0 else 0.0

    four_d_hi_sq = 4.0 * (d_hi * d_hi)
    raw_lower = s_lo - four_d_hi_sq
    lower = _down(raw_lower - 2.0 * UNIT_ROUNDOFF * (four_d_hi_sq + np.abs(raw_lower)))
    if d_hi == 0.0:  # a perfect bisection: θ = s exactly
        lower = s_lo

    four_d_lo_sq = 4.0 * (d_lo * d_lo)
    overflow = np.isinf(four_d_lo_sq)
    finite_sq = 0.0 if overflow else four_d_lo_sq
    raw_upper = s_hi - finite_sq
    upper = _up(raw_upper + 2.0 * UNIT_ROUNDOFF * (finite_sq + np.abs(raw_upper)))
    if overflow:
        upper = _up(s_hi - _LARGEST)
    if np.isnan(lower):
        lower = -np.inf
    return lower, np.minimum(upper, s_hi)
