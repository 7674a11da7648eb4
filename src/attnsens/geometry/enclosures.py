"""Forward enclosures: a float64 point and a per-token radius that the real-arithmetic value is proved to lie in.

A block's chain rule evaluates each factor at an intermediate point: N₁(x), x + A(N₁(x)), N₂ of that, the MLP's
input and output. The block input x is exact (the bound is about the Jacobian at that x), but every intermediate
is computed in float64 and differs from the real one. An ``Enclosure`` (value v̂, radius δ) states
‖v_t − v̂_t‖₂ ≤ δ_t for every token t, where v is the real intermediate; each factor is then bounded over that
ball instead of at v̂ (``jacobians.norm_jacobian_spectral_norm_upper_bound``, ``mha_local_jacobian_bounds``
and ``blocks.ffn_token_jacobian_upper_bound`` take the radius).

Norm (LayerNorm γ ⊙ (x − μ)/σ + β, RMSNorm γ ⊙ x/r + β), from an input enclosure (x̂, δ):

* Centring (LayerNorm). The float ĉ = fl(x̂ − m̂) for the float mean m̂ satisfies |ĉ_i − (x̂_i − m̂)| ≤ γ₁|ĉ_i|, and
  |μ − m̂| = |Σ_i (x̂_i − m̂)|/d ≤ o := (|fl Σ ĉ| + (γ_d + 2u) Σ|ĉ|)/d, so the real centred c = P x̂ lies within
  e_c = γ₁‖ĉ‖ + √d o of ĉ. P (centring) has norm 1, so for the real input X, ‖P X − ĉ‖ ≤ E := δ + e_c
  (RMSNorm: ĉ = x̂, E = δ).
* The map f(c) = c/s(c), s(c) = (‖c‖²/d + ε)^{1/2}, has Jacobian (I − ccᵀ/(d s²))/s of norm 1/s, and on the
  ball of radius E around ĉ, s ≥ s_lo = ((‖ĉ‖ − E)₊²/d + ε)^{1/2}: ‖f(PX) − f(ĉ)‖ ≤ E/s_lo, and the output
  moves by at most ‖γ‖_∞ E/s_lo.
* Evaluation at ĉ: ŝ = fl(√(mean(ĉ²) + ε)) has relative error ≤ γ_{d+4} (nonnegative terms: squares, a sum
  in any order, the mean, + ε, the square root), so ŵ_i = fl(ĉ_i/ŝ) is within 3γ_{d+5}|ŵ_i| of f(ĉ)_i, and
  ô_i = fl(fl(ŵ_i γ_i) + β_i) within 4γ_{d+6}|fl(ŵ_i γ_i)| + γ₁|ô_i| of γ_i f(ĉ)_i + β_i. Underflow adds at most
  ``UNDERFLOW_FLOOR``; a token with ŝ² < 2^-960 (only possible for ε below that) gets an infinite radius.

Residual sums: fl(x̂ + â) is within γ₁|fl(x̂ + â)| of x̂ + â entrywise, and fl(fl(αx̂) + â) within γ₂(|αx̂| + |â|),
so the radius of the sum is |α|δ_x + δ_a plus that rounding's ℓ2 norm. The attention sublayer's enclosure is
``MHALocalJacobianBounds.output_radius`` and the MLP's is ``blocks.mlp_enclosure``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attnsens._rounding import (
    UNIT_ROUNDOFF,
    add_down,
    add_up,
    div_down,
    div_up,
    gamma,
    mean_offset_upper_bound,
    mul_up,
    norm2_lower_bound,
    norm2_upper_bound,
    sqrt_down,
    square_down,
    sub_down,
)
from attnsens.geometry.attention_accuracy import UNDERFLOW_FLOOR
from attnsens.weights import NormWeights

SMALLEST_CERTIFIED_SCALE_SQUARED = 2.0**-960
"""ŝ² below this may have lost relative accuracy to underflow; such tokens get an infinite radius."""


@dataclass(frozen=True)
class Enclosure:
    """``value`` ``[batch, query, d]`` float64 and ``radius`` ``[batch, query]``: the real point lies within
    ``radius[b, t]`` of ``value[b, t]`` in ℓ2, token by token (``exact`` radii are 0)."""

    value: Tensor
    radius: Tensor

    @property
    def is_exact(self) -> bool:
        """True when every radius is 0 (the value is the real point)."""
        return not bool((self.radius > 0).any())

    @property
    def radius_or_none(self) -> Tensor | None:
        """The radius, or None when the value is exact (the functions that take a radius then skip it)."""
        return None if self.is_exact else self.radius


def exact(x: Tensor) -> Enclosure:
    """An exact point: ``x`` (converted to float64) with radius 0."""
    x = x.detach().to(torch.float64)
    return Enclosure(x, torch.zeros(x.shape[:-1], dtype=torch.float64, device=x.device))


def norm_enclosure(x: Enclosure, norm: NormWeights) -> Enclosure:
    """The float64 N(x̂) (the same operations as ``layers.norm_forward``) and a radius ≥ ‖N(X)_t − N̂_t‖₂ for
    every real X within ``x.radius`` of ``x.value`` (module docstring)."""
    xv = x.value
    d = xv.shape[-1]
    gamma_w = norm.gamma.to(torch.float64)
    if norm.kind == "layernorm":
        centred = xv - xv.mean(dim=-1, keepdim=True)
        offset = mean_offset_upper_bound(centred)
        centring = add_up(
            mul_up(norm2_upper_bound(centred), gamma(1)), mul_up(offset, math.nextafter(math.sqrt(d), math.inf))
        )
        moved_input = add_up(x.radius, centring)
    else:
        centred, moved_input = xv, x.radius
    scale_sq = centred.square().mean(dim=-1, keepdim=True) + norm.eps
    normalized = centred / torch.sqrt(scale_sq)
    scaled = normalized * gamma_w
    value = scaled if norm.beta is None else scaled + norm.beta.to(torch.float64)

    shrunk = sub_down(norm2_lower_bound(centred), moved_input).clamp_min(0.0)
    scale_low = sqrt_down(add_down(div_down(square_down(shrunk), float(d)), float(norm.eps)))
    gamma_max = gamma_w.abs().amax()
    moved = div_up(mul_up(gamma_max, moved_input), scale_low)
    moved = torch.where(moved_input > 0, moved, torch.zeros_like(moved))  # no 0/0 at x = 0 with ε = 0
    evaluation = add_up(
        mul_up(norm2_upper_bound(scaled), gamma(d + 6) * 4.0), mul_up(norm2_upper_bound(value), gamma(1))
    )
    evaluation = torch.where(
        scale_sq[..., 0] >= SMALLEST_CERTIFIED_SCALE_SQUARED, evaluation, torch.full_like(evaluation, math.inf)
    )
    return Enclosure(value, add_up(add_up(moved, evaluation), UNDERFLOW_FLOOR))


def residual_sum(x: Enclosure, y: Enclosure, scale: float = 1.0) -> Enclosure:
    """fl(scale·x̂ + ŷ) and its radius |scale| δ_x + δ_y + the rounding of the sum (module docstring)."""
    if scale == 1.0:
        value = x.value + y.value
        rounding = mul_up(norm2_upper_bound(value), gamma(1))
        return Enclosure(value, add_up(add_up(x.radius, y.radius), rounding))
    scaled = scale * x.value
    value = scaled + y.value
    rounding = mul_up(norm2_upper_bound(add_up(scaled.abs(), y.value.abs())), gamma(2) * (1 + 4 * UNIT_ROUNDOFF))
    return Enclosure(value, add_up(add_up(mul_up(x.radius, abs(scale)), y.radius), rounding))
