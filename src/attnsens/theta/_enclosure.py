"""Outward-rounded float64 interval [θ_lo, θ_hi] from the per-row numbers the kernels produce.

Inputs per row: ŝ (computed sum), d̂ (distance of the best subset found), d̂_lb (proved lower bound on d*) and the
error radius E (absolute error bound of every computed distance and of ŝ; 0 when sums are error-free). Then

    s ∈ [ŝ − E, ŝ + E],   d* ∈ [max(0, d̂_lb − E), d̂ + E],   θ = s − 4·d*²   (THETA_ALGORITHMS.md §1),

and each endpoint s' − 4·d'² is evaluated in float64 with error ≤ u·(4d'² + |result|) (one rounding in the
square, none in ×4, one in the subtraction; u = 2^-53), which we cover by 2u·(4d'² + |result|) plus one
``nextafter`` step outward. With E = 0 and d̂ = d̂_lb the width is at most 2^-50·max(1, s) + 2 ulp ≤ 2^-49·max(1, s).
"""

from __future__ import annotations

import numpy as np
import torch

from attnsens.theta._constants import UNIT_ROUNDOFF


def theta_enclosure(
    s_hat: torch.Tensor, d_found: torch.Tensor, d_lb: torch.Tensor, err: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """[θ_lo, θ_hi] ∋ θ = s − 4·d*² for every row; all arguments float64 of one shape.

    CPU tensors are evaluated through their NumPy views (the same IEEE float64 operations, with a fraction of the
    per-call cost on small batches); other devices in torch.

    Returns:
        (lower, upper), float64, with lower ≤ θ ≤ upper ≤ s_hi (THETA_ALGORITHMS.md §1). lower is not clamped
        at 0: θ < 0 is possible when s > 1 (a single atom of mass s has θ = s − s²).
    """
    if s_hat.device.type == "cpu":
        arrays = (t.detach().contiguous().numpy() for t in (s_hat, d_found, d_lb, err))
        lower, upper = _enclosure(np, *arrays)
        return torch.from_numpy(np.asarray(lower)), torch.from_numpy(np.asarray(upper))
    return _enclosure(torch, s_hat, d_found, d_lb, err)


def _enclosure(xp, s_hat, d_found, d_lb, err):
    """The enclosure with array namespace ``xp`` (numpy or torch); see ``theta_enclosure``."""

    def step_down(x):
        return xp.nextafter(x, xp.full_like(x, -xp.inf))

    def step_up(x):
        return xp.nextafter(x, xp.full_like(x, xp.inf))

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
    raw_upper = s_hi - four_d_lo_sq
    upper = step_up(raw_upper + 2.0 * UNIT_ROUNDOFF * (four_d_lo_sq + xp.abs(raw_upper)))
    return lower, xp.minimum(upper, s_hi)
