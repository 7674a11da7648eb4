"""Proved error radii of the float64 per-row terms of the local attention bounds (``attention_terms``).

The local bound is about the real-arithmetic attention at X; its per-row terms (distances of values, spreads of
keys, functional norms, the key-sum matrices) are evaluated in float64. Three kinds of error separate them from
the real quantities, and each gets a radius here, so that every term the bound uses is an upper bound of its
real counterpart (docs/architecture.md, "Rounding"):

1. **Inputs.** The float64 forward's query, key and value of a position differ from the real ones:
   ‖v_t − v̂_t‖ ≤ γ_{d+1}‖A^V_t‖ with A^V = |W_V||x_t| + |b_V| (``attention_terms.value_errors``), and the rotated
   query and key errors of ``attention_terms.projection_errors``. A term that is a norm of Φ w, Φ a linear map
   with ‖Φ‖ ≤ lip, moves by at most lip·‖w − ŵ‖.
2. **Factors.** Norms of maps out of W_Q, W_K go through a small factor F̂_t instead of the map Φ_t itself
   (``attention_terms``, "Position maps"). ``FactorAccuracy`` states, for every vector w,

       ‖Φ_t w‖ ≤ scale·fl‖fl(F̂_t w)‖ + slack_t·‖w‖ + floor,

   fl(·) the float64 evaluation (any summation order), and the same with ‖a‖ + ‖c‖ in place of ‖w‖ when w = a − c
   is formed after the products (the two products are then rounded separately). Maps into a head's output go
   through the QR factor of W_O^(h) with the same statement (``output_accuracy``).
3. **Evaluation.** A float64 norm or distance of float vectors of length k (differences first, then squares, a
   sum in any order, a square root) is within a relative 2γ_{k+4} of the real one, and gradual underflow costs at
   most √k·2^-537 < ``UNDERFLOW_FLOOR`` absolutely (``norm_upper``). Every further sum and product is rounded up
   (``attnsens._rounding``).

Factor statements, from Higham's entrywise bound |fl(AB) − AB| ≤ γ_k |A||B| (inner size k), whose spectral norm is
at most ‖A‖_F‖B‖_F:

* Plain side (no RoPE, no QK-norm): W = U S Vᵀ (computed SVD), Ĝ = S Uᵀ, so Wᵀ = V̂ Ĝ + E_W with the residual E_W
  evaluated and enlarged by γ_{r+1}(‖W‖_F + ‖V̂‖_F‖Ĝ‖_F). ‖Wᵀ w‖ ≤ ‖V̂‖‖Ĝ w‖ + ‖E_W‖‖w‖ and
  ‖V̂‖² ≤ 1 + ‖V̂ᵀV̂ − I‖_F (itself enlarged by γ_{m+1}(‖V̂‖_F² + √r)).
* A position map M̂_t (RoPE's rotation R_t, exactly the cos/sin table the forward uses, or a per-head QK-norm's
  R_t J_N(a_t), or J_N(ρ_t) R_t when the norm follows RoPE):
  F̂_t = fl(Ĝ M̂_tᵀ), slack_t = ‖V̂‖γ_d(‖Ĝ‖_F‖M̂_t‖_F + ‖F̂_t‖_F) + ‖E_W‖‖M̂_t‖_F + ‖W‖ε_t with
  ε_t ≥ ‖M_t − M̂_t‖ (``qk_norm_map_error``).
* A QK-norm over all heads: the factor [[R, c], [0, ρ]], with its accuracy derived in
  ``attention_terms.joint_norm_factors``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attnsens._rounding import (
    UNIT_ROUNDOFF,
    add_up,
    cached_on,
    div_up,
    frobenius_norm_upper_bound,
    gamma,
    mul_down,
    mul_up,
    sqrt_up,
    sum_upper_bound,
)

UNDERFLOW_FLOOR = 2.0**-500
"""Absolute radius of a float64 norm for gradual underflow of its squares (√k·2^-537 for k < 2^20 coordinates)."""


def inflate(computed: Tensor, roundings: int) -> Tensor:
    """≥ the real value of a nonnegative float64 result whose every term went through at most ``roundings``
    roundings of sums and products of nonnegative numbers (x ≤ fl(x)/(1 − γ) ≤ fl(x)(1 + 2γ))."""
    return mul_up(computed, math.nextafter(1.0 + 2.0 * gamma(roundings), math.inf))


def norm_upper(computed: Tensor, length: int) -> Tensor:
    """≥ the real norm ‖x‖₂ (or distance ‖a − b‖₂) of float vectors with ``length`` coordinates, from its float64
    evaluation ``computed`` (rule 3 of the module docstring)."""
    return add_up(inflate(computed, length + 4), UNDERFLOW_FLOOR)


def schur_norm_upper_bound(M: Tensor) -> Tensor:
    """≥ ‖M‖₂ over the last two axes from √(‖M‖₁‖M‖_∞) (Schur's test), min the Frobenius norm: cheap and
    certified, 1 up to rounding for a rotation that acts on coordinate pairs, such as RoPE's."""
    abs_m = M.to(torch.float64).abs()
    rows = sum_upper_bound(abs_m, -1).amax(dim=-1)
    cols = sum_upper_bound(abs_m, -2).amax(dim=-1)
    return torch.minimum(sqrt_up(mul_up(rows, cols)), frobenius_norm_upper_bound(M))


def gram_deviation_bound(Q: Tensor) -> Tensor:
    """≥ ‖QᵀQ − I‖_F for a float basis Q ``[..., m, k]`` (the computed Gram enlarged by γ_{m+1}(‖Q‖_F² + √k)):
    then ‖Q‖₂² ≤ 1 + that."""
    k = Q.shape[-1]
    eye = torch.eye(k, dtype=torch.float64, device=Q.device)
    fro = frobenius_norm_upper_bound(Q)
    computed = mul_up(frobenius_norm_upper_bound(Q.transpose(-1, -2) @ Q - eye), 1.0 + 4 * UNIT_ROUNDOFF)
    return add_up(computed, mul_up(add_up(mul_up(fro, fro), math.sqrt(k) * (1 + 2.0**-50)), gamma(Q.shape[-2] + 1)))


def residual_bound(M: Tensor, Q: Tensor, R: Tensor) -> Tensor:
    """≥ ‖M − Q R‖_F for float matrices (the computed residual enlarged by γ_{k+1}(‖M‖_F + ‖Q‖_F‖R‖_F))."""
    computed = mul_up(frobenius_norm_upper_bound(M - Q @ R), 1.0 + 4 * UNIT_ROUNDOFF)
    magnitude = add_up(
        frobenius_norm_upper_bound(M), mul_up(frobenius_norm_upper_bound(Q), frobenius_norm_upper_bound(R))
    )
    return add_up(computed, mul_up(magnitude, gamma(Q.shape[-1] + 1)))


def scaled_floor(scale: Tensor) -> float:
    """The underflow radius of a computed norm multiplied by the largest ``scale`` it is read through."""
    return mul_up(scale.amax(), UNDERFLOW_FLOOR).item() if scale.numel() else UNDERFLOW_FLOOR


@dataclass(frozen=True, kw_only=True)
class FactorAccuracy:
    """‖Φ_t w‖ ≤ scale·fl‖fl(F̂_t w)‖ + slack_t·‖w‖ + floor for every w, and ‖Φ_t‖ ≤ lip_t (module docstring).

    scale, slack, lip ``[b, h, position]``, position 1 when every position shares the value; floor: a float (the
    underflow radius of the computed norm, already multiplied by the scale)."""

    scale: Tensor
    slack: Tensor
    lip: Tensor
    floor: float


@dataclass(frozen=True, kw_only=True)
class GainAccuracy:
    """Wᵀ = V̂ Ĝ + E_W per head: ``gain`` Ĝ ``[..., rank, d_head]``, ``basis_norm`` ≥ ‖V̂‖₂, ``residual`` ≥ ‖E_W‖₂,
    ``frobenius`` ≥ ‖Ĝ‖_F, all ``[...]`` (float64)."""

    gain: Tensor
    basis_norm: Tensor
    residual: Tensor
    frobenius: Tensor


def gain_accuracy(W: Tensor) -> GainAccuracy:
    """Ĝ with ‖Wᵀ v‖ ≤ ‖V̂‖‖Ĝ v‖ + ‖E_W‖‖v‖ (module docstring) for W ``[..., d_head, d_model]``, remembered per
    weight tensor."""

    def compute() -> GainAccuracy:
        W64 = W.to(torch.float64)
        U, S, Vh = torch.linalg.svd(W64, full_matrices=False)
        gain = S[..., :, None] * U.transpose(-1, -2)  # [..., rank, d_head]
        basis = Vh.transpose(-1, -2)  # V̂: [..., d_model, rank]
        basis_norm = sqrt_up(add_up(gram_deviation_bound(basis), 1.0))
        residual = residual_bound(W64.transpose(-1, -2), basis, gain)
        gain_fro = frobenius_norm_upper_bound(gain)
        return GainAccuracy(gain=gain, basis_norm=basis_norm, residual=residual, frobenius=gain_fro)

    return cached_on((W,), "gain_accuracy", compute)


def plain_factor_accuracy(gain: GainAccuracy, lip: Tensor) -> FactorAccuracy:
    """``FactorAccuracy`` of F̂ = Ĝ (no position map): ``gain`` per query head with a batch axis ``[b, h, ...]``,
    lip ≥ ‖W‖ ``[b, h]``."""
    rank, d_head = gain.gain.shape[-2:]
    scale = inflate(gain.basis_norm, rank + 4)
    slack = add_up(mul_up(mul_up(gain.basis_norm, gain.frobenius), gamma(d_head)), gain.residual)
    return FactorAccuracy(
        scale=scale[..., None], slack=slack[..., None], lip=lip[..., None],
        floor=scaled_floor(scale),
    )  # fmt: skip


def mapped_factor_accuracy(
    gain: GainAccuracy, factors: Tensor, maps: Tensor, map_error: Tensor | None, w_norm: Tensor, map_norm: Tensor
) -> FactorAccuracy:
    """``FactorAccuracy`` of F̂_t = fl(Ĝ M̂_tᵀ) (module docstring).

    Args:
        gain: per query head ``[b, h, rank, d]``; factors: F̂_t ``[b, h, position, rank, d]``; maps: M̂_t
            ``[position, d, d]`` (RoPE) or ``[b, h, position, d, d]``; map_error: ε_t ≥ ‖M_t − M̂_t‖
            ``[b, h, position]`` (None: M̂_t is the map, as for RoPE's table); w_norm: ‖W‖ ``[b, h]``; map_norm: ≥ ‖M_t‖
            of the real map ``[b, h, position]`` or ``[position]``.
    """
    rank, d_head = gain.gain.shape[-2:]
    scale = inflate(gain.basis_norm, rank + 4)  # [b, h]
    map_fro = frobenius_norm_upper_bound(maps)
    if map_fro.ndim == 1:
        map_fro = map_fro.expand(*factors.shape[:2], -1)
    factor_fro = frobenius_norm_upper_bound(factors)  # [b, h, position]
    products = add_up(mul_up(gain.frobenius[..., None], map_fro), factor_fro)
    slack = add_up(mul_up(mul_up(scale[..., None], products), gamma(d_head)), mul_up(gain.residual[..., None], map_fro))
    if map_error is not None:
        slack = add_up(slack, mul_up(w_norm[..., None], map_error))
    lip = mul_up(w_norm[..., None], map_norm)
    return FactorAccuracy(
        scale=scale[..., None], slack=slack, lip=lip.expand_as(slack),
        floor=scaled_floor(scale),
    )  # fmt: skip


def qk_norm_map_error(
    jacobians: Tensor, rotations: Tensor | None, gamma_max: Tensor, floor: Tensor, input_error: Tensor
) -> Tensor:
    """ε_t ≥ ‖R_t J_N(a_t) − fl(R_t Ĵ_t)‖ per position ``[b, h, position]`` for a per-head QK-norm (d = d_head);
    equally ε_t ≥ ‖J_N(ρ_t) R_t − fl(Ĵ_t R_t)‖ for a norm after RoPE, whose input is ρ_t = R_t a_t (every step
    below is symmetric in the side R_t multiplies from).

    Args:
        jacobians: Ĵ_t = the float64 ``norm_jacobians`` at the float input of the norm, â_t or ρ̂_t
            ``[b, h, position, d, d]``; rotations: R_t ``[position, d, d]`` or None; gamma_max: max |γ|; floor:
            r_lo ≤ r on the segment [a_t, â_t] (or [ρ_t, ρ̂_t]) ``[b, h, position]``
            (``attention_terms.qk_norm_floors``); input_error: ‖a_t − â_t‖ (or ‖ρ_t − ρ̂_t‖).

    The proof, with u = a/(√d r) (‖u‖ ≤ 1) and J = diag(γ)(I − u uᵀ)/r:

    * |dr| ≤ ‖da‖/√d and ‖du‖ ≤ 2‖da‖/(√d r), so ‖dJ‖ ≤ γ_max(‖da‖/(√d r²) + 4‖da‖/(√d r²)) and
      ‖J(a) − J(â)‖ ≤ 5 γ_max ‖a − â‖/(√d r_lo²);
    * Ĵ's entries carry at most 3d + 21 roundings relative to γ_j(δ_jk + |û_j û_k|)/r, so
      ‖J(â) − Ĵ‖_F ≤ γ_{3d+21} γ_max (√d + ‖û‖²)/r ≤ γ_{4d+32} γ_max (√d + 1)/r_lo;
    * the product with R_t adds γ_d ‖R_t‖_F ‖Ĵ‖_F, and ‖R_t‖ ≤ ``schur_norm_upper_bound``.
    """
    d = jacobians.shape[-1]
    sqrt_d = math.nextafter(math.sqrt(d), 0.0)
    moved = div_up(mul_up(mul_up(input_error, gamma_max), 5.0), mul_down(mul_down(floor, floor), sqrt_d))
    evaluated = div_up(mul_up(gamma_max, (math.sqrt(d) + 1.0) * (1 + 2.0**-50) * gamma(4 * d + 32)), floor)
    error = add_up(moved, evaluated)
    if rotations is None:
        return error
    rotation_norm = schur_norm_upper_bound(rotations)  # [position]
    product = mul_up(mul_up(frobenius_norm_upper_bound(rotations), frobenius_norm_upper_bound(jacobians)), gamma(d))
    return add_up(mul_up(error, rotation_norm), product)


@dataclass(frozen=True, kw_only=True)
class OutputAccuracy:
    """W_O^(h) = Q̂ R̂_O + E_O per head: ‖W_O^(h) z‖ ≤ scale·fl‖fl(R̂_O z)‖ + slack‖z‖ + floor; ``factor`` R̂_O
    ``[..., head, d_head, d_head]``, scale and slack ``[..., head]``, ``residual`` ≥ ‖E_O‖, ``basis_norm`` ≥ ‖Q̂‖,
    ``frobenius`` ≥ ‖R̂_O‖_F."""

    factor: Tensor
    scale: Tensor
    slack: Tensor
    residual: Tensor
    basis_norm: Tensor
    frobenius: Tensor
    floor: float


def output_accuracy(Wo: Tensor, n_head: int) -> OutputAccuracy:
    """R̂_O, the triangular factor of each head's W_O block W_O^(h) = Q̂ R̂_O (‖W_O^(h) z‖ = ‖R̂_O z‖ up to the
    accuracy stated), for W_O ``[..., d_model, head·d_head]``; remembered per weight."""

    def compute() -> OutputAccuracy:
        d_head = Wo.shape[-1] // n_head
        heads = Wo.to(torch.float64).reshape(*Wo.shape[:-1], n_head, d_head).movedim(-2, -3)
        Q, R = torch.linalg.qr(heads, mode="reduced")  # [..., head, d_model, d_head], [..., head, d_head, d_head]
        basis_norm = sqrt_up(add_up(gram_deviation_bound(Q), 1.0))
        residual = residual_bound(heads, Q, R)
        r_fro = frobenius_norm_upper_bound(R)
        scale = inflate(basis_norm, d_head + 4)
        slack = add_up(mul_up(mul_up(basis_norm, r_fro), gamma(d_head)), residual)
        floor = scaled_floor(scale)
        return OutputAccuracy(
            factor=R, scale=scale, slack=slack, residual=residual, basis_norm=basis_norm, frobenius=r_fro,
            floor=floor,
        )  # fmt: skip

    return cached_on((Wo,), f"output_accuracy:{n_head}", compute)


def masked_max(t: Tensor, allowed: Tensor) -> Tensor:
    """max over the allowed keys of a nonnegative ``[b, h, query, key]`` tensor (0 on a row without keys)."""
    return t.masked_fill(~allowed, 0.0).amax(dim=-1)


def row_max_of_keys(per_key: Tensor, allowed: Tensor) -> Tensor:
    """max over each row's allowed keys of a nonnegative per-key quantity ``[b, h, key]`` → ``[b, h, query]``."""
    shape = (*per_key.shape[:2], allowed.shape[-2], per_key.shape[-1])
    return masked_max(per_key[..., None, :].expand(shape), allowed)
