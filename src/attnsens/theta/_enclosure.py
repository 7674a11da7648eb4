"""Outward-rounded float64 interval [θ_lo, θ_hi] from the per-row numbers the kernels produce.

Inputs per row: ŝ (computed sum), d̂ (distance of the best subset found), d̂_lb (proved lower bound on d*) and the
error radius E (absolute error bound of every computed distance and of ŝ; 0 when sums are error-free). Then

    s ∈ [ŝ − E, ŝ + E],   d* ∈ [max(0, d̂_lb − E), d̂ + E],   θ = s − 4·d*²   (docs/theta-algorithms.md §1),

and each endpoint s' − 4·d'² is evaluated in float64 with error ≤ u·(4d'² + |result|) (one rounding in the
square, none in ×4, one in the subtraction; u = 2^-53), which we cover by 2u·(4d'² + |result|) plus one
``nextafter`` step outward. With E = 0 and d̂ = d̂_lb the width is at most 2^-50·max(1, s) + 2 ulp ≤ 2^-49·max(1, s).

Two ranges are handled apart, because the kernels' radii are relative:

* **Tiny rows** (ŝ < 2^-900): halving ŝ and relative radii lose their meaning near the subnormals (three entries
  2^-1074 have s/2 = 1.5·2^-1074, not a float). There θ ∈ [s − s², s] for every row (0 ≤ d* ≤ s/2), s² is below
  2^-1800, and s ∈ ŝ·[1 − 2^-20, 1 + 2^-20] ± 2^-1074 (any float64 summation of fewer than 2^30 terms), so
  [θ_lo, θ_hi] = [2 steps below the lowest s, one step above the highest s]: sound, and narrower than
  2^-49·max(1, s).
* **Overflow** (4·d'² > the largest float, reachable only with sums far from 1): the real 4·d'² exceeds the
  largest float, so θ_hi = s_hi − (largest float) rounded up, and θ_lo = −∞. No NaN is ever produced.
"""

from __future__ import annotations

import numpy as np
import torch

from attnsens._float64 import UNIT_ROUNDOFF

TINY_ROW_SUM = 2.0**-900


def theta_enclosure(
    s_hat: torch.Tensor, d_found: torch.Tensor, d_lb: torch.Tensor, err: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """[θ_lo, θ_hi] ∋ θ = s − 4·d*² for every row; all arguments float64 of one shape.

    CPU tensors are evaluated through their NumPy views (the same IEEE float64 operations, with a fraction of the
    per-call cost on small batches); other devices in torch.

    Returns:
        (lower, upper), float64, with lower ≤ θ ≤ upper ≤ s_hi (docs/theta-algorithms.md §1). lower is not clamped
        at 0: θ < 0 is possible when s > 1 (a single atom of mass s has θ = s − s²).
    """
    if s_hat.device.type == "cpu":
        arrays = (t.detach().contiguous().numpy() for t in (s_hat, d_found, d_lb, err))
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is handled inside, to ±∞ on the safe side
            lower, upper = _enclosure(np, *arrays)
        return torch.from_numpy(np.asarray(lower)), torch.from_numpy(np.asarray(upper))
    return _enclosure(torch, s_hat, d_found, d_lb, err)


def _enclosure(xp, s_hat, d_found, d_lb, err):
    """The enclosure with array namespace ``xp`` (numpy or torch); see ``theta_enclosure``."""

    # NumPy broadcasts the direction; torch.nextafter needs a tensor of x's shape.
    down, up = (-np.inf, np.inf) if xp is np else (None, None)

    def step_down(x):
        return xp.nextafter(x, xp.full_like(x, -xp.inf) if down is None else down)

    def step_up(x):
        return xp.nextafter(x, xp.full_like(x, xp.inf) if up is None else up)

    has_err = err > 0
    s_lo = xp.where(has_err, step_down(s_hat - err), s_hat)
    s_hi = xp.where(has_err, step_up(s_hat + err), s_hat)
    d_hi = xp.where(has_err, step_up(d_found + err), d_found)
    d_lo = xp.where(has_err, step_down(d_lb - err), d_lb)
    d_lo = xp.where(d_lo > 0.0, d_lo, xp.zeros_like(d_lo))

    four_d_hi_sq = 4.0 * (d_hi * d_hi)
    raw_lower = s_lo - four_d_hi_sq
    lower = step_down(raw_lower - 2.0 * UNIT_ROUNDOFF * (four_d_hi_sq + xp.abs(raw_lower)))
    # A perfect bisection (d̂ = 0, proved by an exact stage or found with error-free sums) leaves no arithmetic
    # to round: θ = s exactly, so p = (½, ½) certifies θ = 1 with lower == upper.
    lower = xp.where(d_hi == 0.0, s_lo, lower)

    four_d_lo_sq = 4.0 * (d_lo * d_lo)
    overflow = xp.isinf(four_d_lo_sq)
    finite_sq = xp.where(overflow, xp.zeros_like(four_d_lo_sq), four_d_lo_sq)
    raw_upper = s_hi - finite_sq
    upper = step_up(raw_upper + 2.0 * UNIT_ROUNDOFF * (finite_sq + xp.abs(raw_upper)))
    upper = xp.where(overflow, step_up(s_hi - xp.full_like(s_hi, np.finfo(np.float64).max)), upper)
    lower = xp.where(xp.isnan(lower), xp.full_like(lower, -xp.inf), lower)
    upper = xp.minimum(upper, s_hi)

    tiny = s_hat < TINY_ROW_SUM
    subnormal = float(np.finfo(np.float64).smallest_subnormal)  # 2^-1074, the absolute error floor
    tiny_lo = step_down(step_down(s_hat * (1.0 - 2.0**-20) - subnormal))
    tiny_hi = step_up(s_hat * (1.0 + 2.0**-20) + subnormal)
    return xp.where(tiny, tiny_lo, lower), xp.where(tiny, tiny_hi, upper)
