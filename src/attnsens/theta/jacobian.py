"""‖J_softmax(u/τ)‖_{∞→1} = θ(softmax(u/τ))/τ as a certified interval (docs/math.md T1)."""

from __future__ import annotations

import math

import torch

from attnsens._float64 import UNIT_ROUNDOFF
from attnsens.errors import ConfigError
from attnsens.theta.certificate import Backend, Precision, ThetaCertificate, certify


def softmax_jacobian_inf_to_one_norm(
    u: torch.Tensor,
    tau: float = 1.0,
    dim: int = -1,
    *,
    precision: Precision = "float32",
    backend: Backend = "auto",
) -> ThetaCertificate:
    """Certified ‖J‖_{∞→1} for J = (diag p − p pᵀ)/τ, p = softmax(u/τ) along ``dim`` (docs/math.md T1: = θ(p)/τ).

    The softmax is evaluated in float64 as p̂; the interval covers the real-number p too: ‖p − p̂‖₁ ≤ η with
    η = u·(max|x̂| + max|x̂ − max x̂|)·(1 + 2^-20) + (L + 8)·u·ŝ (argument rounding propagated through
    ‖J‖_{∞→1} ≤ 1, exp/sum/division rounding relative per entry), and |θ(p) − θ(p̂)| ≤ (1 + Σp + Σp̂)·η
    (docs/math.md T2(d), unnormalised form). Bounds are then divided by τ with outward rounding.

    Args:
        u: [..., key, ...] real scores (any float dtype), key axis ``dim``; finite.
        tau: temperature τ > 0.

    Returns:
        ThetaCertificate of ‖J‖_{∞→1} (lower/upper scaled by 1/τ; row_sum and p_max of p̂; ``exact``: the
        optimal bisection of p̂ is proved).

    >>> cert = softmax_jacobian_inf_to_one_norm(torch.zeros(2), tau=2.0)
    >>> bool(cert.lower <= 0.5 <= cert.upper)
    True
    """
    tau = float(tau)
    if not (math.isfinite(tau) and tau > 0):
        raise ConfigError(f"tau={tau} must be a finite temperature > 0")
    x = u.detach().to(torch.float64) / tau
    p = torch.softmax(x, dim)
    cert = certify(p, dim, precision=precision, tolerance=1e-6, backend=backend)

    # Masked keys (u = −inf) get p = 0 exactly and do not enter the rounding analysis.
    n_keys = x.shape[dim]
    finite = torch.isfinite(x)
    x_max = x.amax(dim, keepdim=True)
    spread = torch.where(finite, x - x_max, 0.0).abs().amax(dim)
    magnitude = torch.where(finite, x, 0.0).abs().amax(dim)
    eta = UNIT_ROUNDOFF * (magnitude + spread) * (1.0 + 2.0**-20) + (n_keys + 8) * UNIT_ROUNDOFF * cert.row_sum
    slack = torch.nextafter((2.0 + cert.row_sum + eta) * eta * (1.0 + 2.0**-20), torch.tensor(torch.inf))
    lower = torch.nextafter((cert.lower - slack).clamp(min=0.0) / tau, torch.tensor(-torch.inf)).clamp(min=0.0)
    upper = torch.nextafter((cert.upper + slack) / tau, torch.tensor(torch.inf))
    return ThetaCertificate(
        lower=lower, upper=upper, exact=cert.exact, method=cert.method, row_sum=cert.row_sum, p_max=cert.p_max
    )
