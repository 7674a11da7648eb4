"""Jacobians of the softmax, LayerNorm and RMSNorm, and their norms (docs/math.md T1, T6; RMSNorm is an extension).

Softmax. p = softmax(u/τ) has J_τ = (diag p − p pᵀ)/τ (docs/math.md §2.1). For a row with total s = Σ p_i
(s = 1 for an exact softmax; zero entries are masked keys):

* ‖J_τ‖_{∞→1} = θ(p)/τ (docs/math.md T1): certified by ``attnsens.theta.softmax_jacobian_inf_to_one_norm``, the
  one API for it (from the scores, so the softmax's own rounding is inside the interval);
* ‖J_τ‖_{∞→∞} = ‖J_τ‖_{1→1} = max_i [p_i |1 − p_i| + p_i (s − p_i)]/τ, the largest absolute row sum
  (row i has diagonal p_i − p_i² and off-diagonal entries −p_i p_j); = max_i 2 p_i (1 − p_i)/τ when s = 1;
* ‖J_τ‖₂ = λ_max/τ (symmetric matrix; eigvalsh).

LayerNorm (docs/math.md T6). LN(x) = γ ⊙ ẑ + β with ẑ = (x − μ1)/σ, σ = √(var(x) + ε):
J_LN(x) = diag(γ) (P₁ − ẑẑᵀ/d)/σ, P₁ = I − 11ᵀ/d. P₁ − ẑẑᵀ/d has eigenvalues 1 (d − 2 times), 0 (direction 1)
and ε/σ² (direction ẑ), so ‖J_LN(x)‖₂ ≤ ‖γ‖_∞/σ(x) ≤ ‖γ‖_∞/√ε.

RMSNorm (extension beyond the paper, derived here). y = γ ⊙ x/r with r = √(mean(x²) + ε) and x̂ = x/r.
dr = xᵀdx/(d r), so d(x/r) = dx/r − x xᵀdx/(d r³) and

    J_RMS(x) = diag(γ) (I − x̂x̂ᵀ/d)/r.

‖x̂‖² = d (r² − ε)/r², so I − x̂x̂ᵀ/d has eigenvalues 1 (d − 1 times, the complement of x̂) and ε/r² ∈ (0, 1]
(direction x̂): it is a contraction, and ‖J_RMS(x)‖₂ ≤ ‖γ‖_∞/r(x) ≤ ‖γ‖_∞/√ε. The bound is an equality when
|γ| is constant and a unit-eigenvalue direction exists: d ≥ 3 for LayerNorm (at d = 2 the only nonzero eigenvalue
is ε/σ², so ‖J_LN‖₂ = |γ| ε/σ³), d ≥ 2 for RMSNorm.

Certified numbers are rounded with ``attnsens._rounding``: σ and r are bounded below in real arithmetic, and every
quotient is rounded up.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnsens._rounding import (
    div_up,
    layernorm_scale_lower_bound,
    rmsnorm_scale_lower_bound,
    scale_lower_bound_on_ball,
)
from attnsens.errors import ConfigError, ShapeError


def _check_tau(tau: float) -> None:
    if not tau > 0:
        raise ConfigError(f"temperature tau must be > 0, got {tau}")


def softmax_jacobian(p: Tensor, tau: float = 1.0) -> Tensor:
    """J_τ = (diag(p) − p pᵀ)/τ, the Jacobian of u ↦ softmax(u/τ) at p.

    Args:
        p: ``[..., key]`` probabilities (zeros = masked keys).
        tau: temperature τ > 0.

    Returns:
        ``[..., key, key]`` exact Jacobian (docs/math.md §2.1), in p's dtype.
    """
    _check_tau(tau)
    return (torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)) / tau


def softmax_jacobian_inf_to_inf_norm(p: Tensor, tau: float = 1.0) -> Tensor:
    """‖J_τ‖_{∞→∞} = ‖J_τ‖_{1→1} = max_i [p_i |1 − p_i| + p_i (s − p_i)]/τ, s = Σ_i p_i.

    Args:
        p: ``[..., key]`` probabilities.
        tau: temperature τ > 0.

    Returns:
        ``[...]`` exact float64 norm (largest absolute row sum; J_τ is symmetric so 1→1 is the same);
        max_i 2 p_i (1 − p_i)/τ ≤ 1/(2τ) for a normalized row (docs/math.md T1 consequences).

    >>> float(softmax_jacobian_inf_to_inf_norm(torch.tensor([0.5, 0.5])))
    0.5
    """
    _check_tau(tau)
    p64 = p.to(torch.float64)
    total = p64.sum(dim=-1, keepdim=True)
    row_sums = p64 * (1.0 - p64).abs() + p64 * (total - p64)
    return row_sums.amax(dim=-1) / tau


def softmax_jacobian_spectral_norm(p: Tensor, tau: float = 1.0) -> Tensor:
    """‖J_τ‖₂ = max |eigenvalue| of (diag p − p pᵀ)/τ, computed in float64 with eigvalsh.

    Args:
        p: ``[..., key]`` probabilities.
        tau: temperature τ > 0.

    Returns:
        ``[...]`` exact float64 spectral norm; ≤ 1/(2τ) for a normalized row.
    """
    eigenvalues = torch.linalg.eigvalsh(softmax_jacobian(p.to(torch.float64), tau))
    return eigenvalues.abs().amax(dim=-1)


def _check_gamma(x: Tensor, gamma: Tensor) -> None:
    if gamma.ndim != 1 or x.shape[-1] != gamma.shape[0]:
        raise ShapeError(f"gamma must be [d_model] = [{x.shape[-1]}], got {tuple(gamma.shape)} for x {tuple(x.shape)}")


def layernorm_scale(x: Tensor, eps: float) -> Tensor:
    """σ(x) = √(mean((x − μ)²) + ε) per token. ``x``: ``[..., d_model]`` → ``[...]``."""
    centered = x - x.mean(dim=-1, keepdim=True)
    return torch.sqrt(centered.square().mean(dim=-1) + eps)


def rmsnorm_scale(x: Tensor, eps: float) -> Tensor:
    """r(x) = √(mean(x²) + ε) per token. ``x``: ``[..., d_model]`` → ``[...]``."""
    return torch.sqrt(x.square().mean(dim=-1) + eps)


def layernorm_jacobian(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    """J_LN(x) = diag(γ)(P₁ − ẑẑᵀ/d)/σ(x) with ẑ = (x − μ1)/σ (β does not enter).

    Args:
        x: ``[..., d_model]`` norm inputs (one token each).
        gamma: ``[d_model]``.
        eps: the ε inside σ.

    Returns:
        ``[..., d_model, d_model]`` exact Jacobian (docs/math.md T6), rows = outputs.
    """
    _check_gamma(x, gamma)
    d = x.shape[-1]
    sigma = layernorm_scale(x, eps)[..., None, None]
    z_hat = (x - x.mean(dim=-1, keepdim=True)) / sigma[..., 0]
    eye = torch.eye(d, dtype=x.dtype, device=x.device)
    projector = eye - 1.0 / d - z_hat.unsqueeze(-1) * z_hat.unsqueeze(-2) / d
    return gamma[:, None] * projector / sigma


def rmsnorm_jacobian(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    """J_RMS(x) = diag(γ)(I − x̂x̂ᵀ/d)/r(x) with x̂ = x/r, r = √(mean x² + ε) (module docstring derivation).

    Args:
        x: ``[..., d_model]``.
        gamma: ``[d_model]``.
        eps: the ε inside r.

    Returns:
        ``[..., d_model, d_model]`` exact Jacobian; an extension beyond the paper (docs/math.md T6 covers LayerNorm).
    """
    _check_gamma(x, gamma)
    d = x.shape[-1]
    r = rmsnorm_scale(x, eps)[..., None, None]
    x_hat = x / r[..., 0]
    eye = torch.eye(d, dtype=x.dtype, device=x.device)
    return gamma[:, None] * (eye - x_hat.unsqueeze(-1) * x_hat.unsqueeze(-2) / d) / r


def norm_jacobian_spectral_norm_upper_bound(
    x: Tensor, gamma: Tensor, eps: float, kind: str, *, input_radius: Tensor | None = None
) -> Tensor:
    """‖J_N(x)‖₂ ≤ ‖γ‖_∞/σ(x) (LayerNorm) or ‖γ‖_∞/r(x) (RMSNorm), per token.

    Args:
        x: ``[..., d_model]``.
        gamma: ``[d_model]``.
        eps: the norm's ε.
        kind: ``"layernorm"`` or ``"rmsnorm"``.
        input_radius: ``[...]`` ℓ2 radii δ ≥ 0, or None. With radii the bound holds at every point within δ of
            x, token by token: σ and r are (1/√d)-Lipschitz in ℓ2 (σ(x) = (‖Px‖²/d + ε)^{1/2}, P the centring), so
            σ ≥ σ(x) − δ/√d there, and σ ≥ √ε everywhere (``enclosures``: a real intermediate near a float one).

    Returns:
        ``[...]`` float64 certified upper bound in real arithmetic (docs/math.md T6 and the RMSNorm extension above;
        σ, r bounded below and the quotient rounded up); over a token matrix its max over tokens bounds the
        block-∞ operator norm of the tokenwise norm's Jacobian.
    """
    _check_gamma(x, gamma)
    if kind == "layernorm":
        scale = layernorm_scale_lower_bound(x, eps)
    elif kind == "rmsnorm":
        scale = rmsnorm_scale_lower_bound(x, eps)
    else:
        raise ConfigError(f"norm kind must be 'layernorm' or 'rmsnorm', got {kind!r}")
    if input_radius is not None:
        scale = scale_lower_bound_on_ball(scale, input_radius, x.shape[-1], eps)
    return div_up(gamma.to(torch.float64).abs().amax(), scale)
