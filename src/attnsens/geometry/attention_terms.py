"""Per-row terms of the certified local attention bounds (``attention_bounds``), all float64, batched over
``[batch, head, query]``.

Two forms bound the sensitivity part W_O^(h) Σ_l v_l (dp_i)_l of one head's output at row i:

θ form (``score_spread``, ``output_spread``): ‖dp_i‖₁ ≤ (θ(p_i)/τ) s_i, and the part is at most
‖dp_i‖₁ min_c max_l ‖W_O^(h)(v_l − c)‖ (docs/math.md T4 at one row).

Key-sum form (``key_sum_sensitivity``). With A = diag(p_i) − p_i p_iᵀ, Σ_l v_l A_lm = p_m (v_m − y_i), so
Σ_l v_l (dp_i)_l = (1/τ) Σ_m p_m (v_m − y_i) du_im with du_im = k̃_mᵀ R_i W_Q dx_i + q̃_iᵀ R_m W_K dx_m, i.e.

    (1/τ) Σ_m p_m (v_m − y_i) (W_Kᵀ R_mᵀ q̃_i)ᵀ dx_m  +  (1/τ) C_i R_i W_Q dx_i,
    C_i = Σ_m p_m (v_m − y_i)(k̃_m − κ)ᵀ  (any κ: Σ_m p_m (v_m − y_i) = 0).

A map Σ_m B_m dx_m with ‖dx_m‖ ≤ 1 has norm at most Σ_m ‖B_m‖, so the part is at most
(1/τ)[Σ_m p_m ‖W_O^(h)(v_m − y_i)‖ a_im + ‖W_O^(h) C_i R_i W_Q‖] with a_im = ‖W_Kᵀ R_mᵀ q̃_i‖. It weighs each
key by its probability where the θ form takes the worst key twice, and is never looser on a two-atom row.

Value part, all heads together (``joint_value_path``): Σ_h W_O^(h) Σ_m p^h_im W_V^h dx_m = Σ_m M_m dx_m with
M_m = Σ_h p^h_im A_h, A_h = W_O^(h) W_V^h. For every w ≥ 0, ‖M_m‖ ≤ w ‖Σ_h A_h‖ + Σ_h |p^h_im − w| ‖A_h‖; the
best w is 0 or one of the p^h_im (the bound is piecewise linear in w), and w = 0 gives the per-head sum Σ_h ‖A_h‖.

Position maps. Every formula above uses the rotation R_t only as the linear map from a head's projection W dx_t
to the change of its rotated query or key. Under QK-norm that map is M_t = R_t J_N(a_t), the norm's Jacobian at
the biased projection a_t followed by RoPE (``norm_jacobians``), and the formulas hold with M_t in place of R_t:
the functionals become dx_i ↦ (M^q_i W_Q dx_i)·w with norm ‖G_Q M^qᵀ_i w‖, and C_i R_i W_Q becomes C_i M^q_i W_Q.

Norms of maps into a head's output go through R_O^(h), the triangular factor of W_O^(h) = Q R_O^(h)
(‖W_O^(h) z‖ = ‖R_O^(h) z‖); norms of maps out of W_Q, W_K through the gain factors G with ‖Wᵀv‖ = ‖G v‖
(‖B W‖ = ‖B Gᵀ‖). Large intermediate tensors are built in query chunks of at most ``CHUNK_ELEMENTS`` entries.

Rounding. Each function returns an upper bound of its term in real arithmetic: the float64 forward's values,
keys and queries, the factors G and R_O and every evaluated norm carry the proved radii of
``attention_accuracy``, and every further operation is rounded up (``attnsens._rounding``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import einops
import torch
from torch import Tensor

from attnsens._rounding import (
    UNIT_ROUNDOFF,
    add_down,
    add_up,
    cached_on,
    div_up,
    frobenius_norm_upper_bound,
    gamma,
    mul_down,
    mul_up,
    norm2_upper_bound,
    product_spectral_norm_upper_bound,
    rmsnorm_scale_lower_bound,
    round_up,
    scale_lower_bound_on_ball,
    spectral_norm_upper_bound,
    sqrt_up,
    sub_down,
    sub_up,
    sum_lower_bound,
    sum_upper_bound,
)
from attnsens.errors import ConfigError, InputError
from attnsens.geometry import attention_accuracy as A
from attnsens.geometry.attention import AttentionForward, apply_rotary, expand_kv_heads
from attnsens.weights import NormWeights, RotaryConfig, qk_norm_is_joint

CHUNK_ELEMENTS = 1 << 22


def query_chunks(n_query: int, elements_per_query: int) -> list[slice]:
    """Consecutive query slices whose intermediates stay under ``CHUNK_ELEMENTS`` entries."""
    size = max(1, CHUNK_ELEMENTS // max(1, elements_per_query))
    return [slice(start, min(n_query, start + size)) for start in range(0, n_query, size)]


def rotation_matrices(n_pos: int, d_head: int, rotary: RotaryConfig, device: torch.device) -> Tensor:
    """R_t ``[position, d_head, d_head]`` with apply_rotary(x)_t = R_t x_t."""
    basis = torch.eye(d_head, dtype=torch.float64, device=device)[:, None, :].expand(d_head, n_pos, d_head)
    return apply_rotary(basis, rotary).permute(1, 2, 0)


def norm_jacobians(inputs: Tensor, norm: NormWeights) -> Tensor:
    """J_N(a_t) = (1/r) diag(γ) (I − a aᵀ/(d r²)), r = (‖a‖²/d + ε)^{1/2}, the Jacobian of the RMSNorm N at each
    a_t: ``[..., position, d]`` → ``[..., position, d, d]`` (float64)."""
    a = inputs.to(torch.float64)
    d = a.shape[-1]
    r = torch.sqrt(a.square().mean(dim=-1, keepdim=True) + norm.eps)  # [..., position, 1]
    unit = a / (r * math.sqrt(d))  # a/(√d r): the projection removes this direction's share
    eye = torch.eye(d, dtype=torch.float64, device=a.device)
    projector = eye - unit[..., :, None] * unit[..., None, :]
    return norm.gamma.to(torch.float64)[:, None] * projector / r[..., None]


def functional_factors(gain: Tensor, maps: Tensor) -> Tensor:
    """F_t = G M_tᵀ ``[b, h, position, rank, d]`` with ‖F_t w‖ the norm of dx_t ↦ (M_t W dx_t)·w, for gain
    ``[b, h, rank, d]`` (``attention_accuracy.gain_accuracy``) and maps shared ``[position, d, d]`` (RoPE) or per
    head ``[b, h, position, d, d]`` (R_t J_N(a_t) under a per-head QK-norm); without maps F_t = G."""
    if maps.ndim == 3:
        return torch.einsum("bhrd,ped->bhpre", gain, maps)
    return torch.einsum("bhrd,bhped->bhpre", gain, maps)


def float_value_distance(values: Tensor, centres: Tensor, allowed: Tensor) -> Tensor:
    """≥ max_{m∈K(i)} ‖v̂_m − c_i‖ for the float ``values`` ``[b, h, key, e]`` and float centres c_i
    ``[b, h, query, e]``: ``[b, h, query]`` (differences formed coordinate by coordinate, rule 3)."""
    distances = torch.cdist(centres, values, compute_mode="donot_use_mm_for_euclid_dist")
    return A.norm_upper(A.masked_max(distances, allowed), values.shape[-1])


def max_value_distance(values: Tensor, centres: Tensor, value_errors: Tensor, allowed: Tensor) -> Tensor:
    """≥ max_{m∈K(i)} ‖v_m − c_i‖ for the real values v_m (within ``value_errors`` ``[b, h, key]`` of the float
    ``values`` ``[b, h, key, e]``) and float centres c_i ``[b, h, query, e]``: ``[b, h, query]``."""
    return add_up(float_value_distance(values, centres, allowed), A.row_max_of_keys(value_errors, allowed))


def query_functional_norms(
    fwd: AttentionForward, gain_k: Tensor, key_factors: Tensor | None, accuracy: A.FactorAccuracy,
    query_errors: Tensor,
) -> Tensor:  # fmt: skip
    """a_im ≥ ‖Φ^K_m q̃_i‖, the norm of dx_m ↦ q̃_i·(M_m W_K dx_m) (``functional_factors``) at the real query q̃_i
    (within ``query_errors`` ``[b, h, query]`` of the float one): ``[b, h, query, key]``, or ``[b, h, query, 1]``
    when every M_m is the identity (F^K_m = G_K, independent of m). ``accuracy``: the key side's
    ``attention_accuracy.FactorAccuracy``."""
    if key_factors is None:
        computed = torch.linalg.vector_norm(torch.einsum("bhre,bhqe->bhqr", gain_k, fwd.queries), dim=-1)[..., None]
    else:
        back_k = key_factors  # G_K M_mᵀ
        n_head, n_query, n_key = fwd.queries.shape[1], fwd.queries.shape[2], fwd.keys.shape[2]
        parts = [
            torch.linalg.vector_norm(torch.einsum("bhmre,bhqe->bhqmr", back_k, fwd.queries[:, :, rows]), dim=-1)
            for rows in query_chunks(n_query, n_head * n_key * back_k.shape[-2])
        ]
        computed = torch.cat(parts, dim=2)
    query_norms = norm2_upper_bound(fwd.queries)[..., None]  # [b, h, query, 1]
    bounded = add_up(
        add_up(mul_up(computed, accuracy.scale[..., None]), mul_up(accuracy.slack[..., None, :], query_norms)),
        accuracy.floor,
    )
    return add_up(bounded, mul_up(accuracy.lip[..., None, :], query_errors[..., None]))


def score_spread(
    fwd: AttentionForward, centre: Tensor, gain_q: Tensor, query_norms: Tensor, allowed: Tensor,
    query_factors: Tensor | None, accuracy: A.FactorAccuracy, key_radius: KeyRadius, slopes: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """s_i ≥ max_{m∈K(i)} (‖Φ^Q_i (k̃_m − c_i)‖ + a_im): the norms of the two linear functionals
    dx_i ↦ (M_i W_Q dx_i)·(k̃_m − c_i) and dx_m ↦ q̃_i·(M_m W_K dx_m) (``attention_bounds`` step 3; M = R with RoPE
    alone) at the real keys, for float centres c_i and certified ``query_norms`` a_im (``query_functional_norms``).
    ``[b, h, query]``. With ``slopes`` D ≤ 1 ``[b, h, query, key]`` (softcap), each key's term is weighted by
    D_im before the maximum (``softcap_slopes``).

    The float64 distance d̂_im of the products F̂_i k̂_m and F̂_i c_i bounds the real norm through the query side's
    ``accuracy``: ≤ scale·d̂_im + slack_i (‖k̂_m‖ + ‖c_i‖) + lip_i ‖k̃_m − k̂_m‖ + floor; the key-dependent part is
    taken at its row maximum (``key_radius``) after the maximum over keys."""
    scale = accuracy.scale[..., None]  # [b, h, 1, 1]
    if query_factors is None:
        keys = torch.einsum("bhre,bhke->bhkr", gain_q, fwd.keys)
        centres = torch.einsum("bhre,bhqe->bhqr", gain_q, centre)
        inner = torch.cdist(centres, keys, compute_mode="donot_use_mm_for_euclid_dist") * scale + query_norms
        if slopes is not None:
            inner = inner * slopes
        computed = A.masked_max(inner, allowed)
    else:
        back_q = query_factors  # G_Q M_iᵀ
        n_head, n_query, n_key = fwd.queries.shape[1], fwd.queries.shape[2], fwd.keys.shape[2]
        parts = []
        for rows in query_chunks(n_query, n_head * n_key * back_q.shape[-2]):
            key_norms = torch.linalg.vector_norm(
                torch.einsum("bhqre,bhme->bhqmr", back_q[:, :, rows], fwd.keys)
                - torch.einsum("bhqre,bhqe->bhqr", back_q[:, :, rows], centre[:, :, rows])[..., None, :],
                dim=-1,
            )
            inner = key_norms * scale + query_norms[:, :, rows]
            if slopes is not None:
                inner = inner * slopes[:, :, rows]
            parts.append(A.masked_max(inner, allowed[..., rows, :]))
        computed = torch.cat(parts, dim=2)
    computed = A.inflate(computed, 3)  # the float products and the sum inside the maximum, all nonnegative
    radius = add_up(
        add_up(
            mul_up(accuracy.slack, add_up(key_radius.norm, norm2_upper_bound(centre))),
            mul_up(accuracy.lip, key_radius.error),
        ),
        accuracy.floor,
    )
    return add_up(computed, radius)


def centre_functional_norms(
    gain_q: Tensor, query_factors: Tensor | None, centre: Tensor, accuracy: A.FactorAccuracy
) -> Tensor:
    """≥ ‖Φ^Q_i c_i‖, the norm of dx_i ↦ (M_i W_Q dx_i)·c_i for float centres c_i, ``[b, h, query]``."""
    if query_factors is None:
        computed = torch.linalg.vector_norm(torch.einsum("bhre,bhqe->bhqr", gain_q, centre), dim=-1)
    else:
        computed = torch.linalg.vector_norm(torch.einsum("bhqre,bhqe->bhqr", query_factors, centre), dim=-1)
    return add_up(
        add_up(mul_up(computed, accuracy.scale), mul_up(accuracy.slack, norm2_upper_bound(centre))), accuracy.floor
    )


@dataclass(frozen=True, kw_only=True)
class KeyRadius:
    """Row maxima over each row's allowed keys ``[b, h, query]`` of ‖k̂_m‖ (``norm``) and of the keys' input
    errors ‖k̃_m − k̂_m‖ (``error``)."""

    norm: Tensor
    error: Tensor


SOFTCAP_SLOPE_LIPSCHITZ = 0.7698004  # max_x 2 tanh(x) sech²(x) = 4/(3√3) = 0.76980035..., rounded up


def softcap_slopes(
    slopes: Tensor, score_errors: Tensor, softcap: float, allowed: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(D⁺ ``[b, h, query, key]``, ½(max_m D⁺ − min_m D⁻), slack ``[b, h, query]``): bounds of the real slopes
    D = sech²(u/c) of the softcapped scores from the float ones (|D − D̂| ≤ slack), and half their range over
    each row's keys.

    D is (4/(3√3))/c-Lipschitz in u and |û − u| ≤ δ_i (``score_error`` without the cap); its float evaluation
    1 − tanh² adds at most 16u. Under a softcap the shift c of step 3 (``attention_bounds``) cannot be a multiple
    of 1 any more: with du_j = δ + e_j, δ = (M_i W_Q dx_i)·μ/τ common to all keys, ds_j = D_j du_j and the shift
    D* δ, D* = ½(max D⁺ + min D⁻), |ds_j − D*δ| ≤ D_j|e_j| + ½(max D⁺ − min D⁻)|δ|.
    """
    slack = add_up(div_up(mul_up(score_errors, SOFTCAP_SLOPE_LIPSCHITZ), softcap), 16 * UNIT_ROUNDOFF)
    upper = add_up(slopes, slack[..., None]).clamp(max=1.0)
    lower = sub_down(slopes, slack[..., None]).clamp(min=0.0)
    top = upper.masked_fill(~allowed, 0.0).amax(dim=-1)
    bottom = lower.masked_fill(~allowed, 1.0).amin(dim=-1)
    return upper, mul_up(sub_up(top, bottom).clamp(min=0.0), 0.5), slack


def projected_values(
    fwd: AttentionForward, output: A.OutputAccuracy, value_errors: Tensor, w_o_head: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(R_O v̂_m ``[b, h, key, d]``, D_im ≥ ‖W_O^(h)(v_m − ŷ_i)‖ ``[b, h, query, key]``, the per-key radius
    ``[b, h, key]``): each head's values seen through W_O^(h), certified distances of the real values to the float
    outputs ŷ_i (shared by both forms of the sensitivity part), and what a distance from v̂_m gains for the
    value's side (slack·‖v̂_m‖ + ‖W_O^(h)‖‖v_m − v̂_m‖, reused by ``output_spread``). ``output``: the heads'
    ``attention_accuracy.output_accuracy`` (batched); ``value_errors`` ``[b, h, key]``; w_o_head ≥ ‖W_O^(h)‖
    ``[b, h]``."""
    R = output.factor
    outputs = torch.einsum("bhde,bhke->bhkd", R, fwd.values)
    centres = torch.einsum("bhde,bhqe->bhqd", R, fwd.head_outputs)
    computed = torch.cdist(centres, outputs, compute_mode="donot_use_mm_for_euclid_dist")
    value_radius = add_up(
        mul_up(output.slack[..., None], norm2_upper_bound(fwd.values)), mul_up(w_o_head[..., None], value_errors)
    )
    query_part = add_up(mul_up(output.slack[..., None], norm2_upper_bound(fwd.head_outputs)), output.floor)
    distances = add_up(
        add_up(mul_up(computed, output.scale[..., None, None]), value_radius[..., None, :]), query_part[..., None]
    )
    return outputs, distances, value_radius


def output_spread(
    outputs: Tensor, distances: Tensor, value_radius: Tensor, output: A.OutputAccuracy, b_v: Tensor | None,
    allowed: Tensor,
) -> Tensor:  # fmt: skip
    """≥ min_c max_{m∈K(i)} ‖W_O^(h)(v_m − c)‖ over c ∈ {ŷ_i, b_V} at the real values, from ``projected_values``:
    ``[b, h, query]``."""
    spread = A.masked_max(distances, allowed)
    R = output.factor
    bias_centre = outputs.new_zeros(*outputs.shape[:2], 1, outputs.shape[-1])
    bias_norm = torch.zeros_like(output.slack)
    if b_v is not None:
        bias = expand_kv_heads(b_v.to(torch.float64), R.shape[1], -2).expand(R.shape[0], -1, -1)
        bias_centre = torch.einsum("bhde,bhe->bhd", R, bias)[..., None, :]
        bias_norm = norm2_upper_bound(bias)
    computed = torch.cdist(bias_centre, outputs, compute_mode="donot_use_mm_for_euclid_dist")  # [b, h, 1, key]
    key_part = add_up(value_radius, add_up(mul_up(output.slack, bias_norm), output.floor)[..., None])
    to_bias = add_up(mul_up(computed[..., 0, :], output.scale[..., None]), key_part)  # [b, h, key]
    return torch.minimum(spread, A.row_max_of_keys(to_bias, allowed))


@dataclass(frozen=True, kw_only=True)
class KeySumInputs:
    """What the key-sum form's certificate needs beside the forward (``key_sum_sensitivity``): the query side's
    ``accuracy`` (``attention_accuracy.FactorAccuracy``), the heads' ``output`` accuracy, the row maxima of the
    keys' norms and input errors (``keys``) and of the values' input errors (``value_error_max`` ``[b, h, query]``),
    the centres c_i the score spread uses (to bound ‖μ_k − c_i‖) and w_o_head ≥ ‖W_O^(h)‖ ``[b, h]``."""

    accuracy: A.FactorAccuracy
    output: A.OutputAccuracy
    keys: KeyRadius
    value_error_max: Tensor
    centres: tuple[Tensor, ...]
    w_o_head: Tensor


def key_sum_sensitivity(
    fwd: AttentionForward, distances: Tensor, gain_q: Tensor, query_norms: Tensor, query_factors: Tensor | None,
    inputs: KeySumInputs, slopes: Tensor | None = None, cutoff: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """τ × the key-sum bound of the sensitivity part (module docstring) at the real values and keys and the float
    weights: ≥ Σ_m p_im D_im a_im + ‖W_O^(h) C_i M_i W_Q‖, with certified ``distances`` D (``projected_values``)
    and ``query_norms`` a (``query_functional_norms``). ``[b, h, query]``.

    Under a softcap the score changes are ds_m = D_m du_m, so every key weighs w_m = p_im D_im (``slopes`` D):
    Σ_m w_m ‖W_O^(h)(v_m − y_i)‖ a_im + ‖W_O^(h) C'_i M_i W_Q‖ with C'_i = Σ_m w_m (v_m − y_i) k̃_mᵀ, where no key
    shift κ is free any more (Σ_m w_m (v_m − y_i) ≠ 0).

    C_i is evaluated as Σ_m w_m (v̂_m − μ_v)(k̂_m − μ_k)ᵀ − ȳ_i k̄_iᵀ (centred on the means μ for accuracy), whose
    real value is Σ_m w_m (v_m − ỹ_i)(k̃_m − μ_k)ᵀ with ỹ_i = μ_v + Σ_m p̂_m (v_m − μ_v). Its certificate
    (``_key_matrix_radius``) adds: the input errors of v and k (the bilinear form B(a, b) = Σ w a bᵀ − (Σ p̂ a)(Σ w b)ᵀ
    has ‖B‖_F ≤ (ŝ + ŝ²) max‖a‖ max‖b‖); its float64 evaluation (γ_{n+8} times the same bound of the magnitudes);
    the change of ỹ_i to ŷ_i and of the centre μ_k to the row's c_i; and the factors R̂_O and F̂_i
    (‖W_O^(h) X M_i W_Q‖ ≤ ‖Q̂‖(scale ‖fl(R̂_O X F̂_iᵀ)‖ + 2 slack_i ‖R̂_O‖_F‖X‖_F) + ‖E_O‖‖X‖_F lip_i), with a
    certified spectral norm of the evaluated d_head × rank matrix.

    ``cutoff`` ``[b, h, query]``: rows whose result is certainly at least the cutoff (the key term plus
    ‖fl M‖_F/√rank, a lower bound of the whole) get the Frobenius norm instead of the spectral norm, still an
    upper bound; the caller takes the minimum with a form at most the cutoff, so only the other rows need the
    (costlier) certified spectral norm.
    """
    P = fwd.probabilities
    weights = P if slopes is None else mul_up(P, slopes)
    key_term = sum_upper_bound(mul_up(mul_up(weights, query_norms), distances))
    key_centre = fwd.keys.mean(dim=-2, keepdim=True)
    value_centre = fwd.values.mean(dim=-2, keepdim=True)
    values = fwd.values - value_centre
    keys = fwd.keys - key_centre
    outputs_c = P @ values
    keys_mean = weights @ keys
    shift = None if slopes is None else weights @ values - weights.sum(dim=-1, keepdim=True) * outputs_c
    output, accuracy = inputs.output, inputs.accuracy
    n_head, n_query, d_head = P.shape[1], P.shape[2], values.shape[-1]
    spectral, frobenius = [], []
    for rows in query_chunks(n_query, n_head * d_head * d_head * 4):
        C = torch.einsum("bhqm,bhmd,bhme->bhqde", weights[:, :, rows], values, keys)
        C = C - outputs_c[:, :, rows, :, None] * keys_mean[:, :, rows, None, :]
        if shift is not None:
            C = C + shift[:, :, rows, :, None] * key_centre[:, :, :, None, :]
        M = torch.einsum("bhfd,bhqde->bhqfe", output.factor, C)
        if query_factors is None:
            M = torch.einsum("bhqfe,bhre->bhqfr", M, gain_q)  # R_O C_i G_Qᵀ
        else:
            M = torch.einsum("bhqfe,bhqre->bhqfr", M, query_factors[:, :, rows])  # R_O C_i M_i G_Qᵀ
        norm = frobenius_norm_upper_bound(M)
        need = torch.ones_like(norm, dtype=torch.bool)
        if cutoff is not None:
            rank = min(M.shape[-2:])
            lower = mul_down(
                norm, (1.0 - 2.0 * gamma(M.shape[-1] * M.shape[-2] + 4)) / math.sqrt(rank) * (1 - 2.0**-50)
            )
            need = add_down(key_term[:, :, rows], sub_down(lower, A.UNDERFLOW_FLOOR)) < cutoff[:, :, rows]
        if bool(need.any()):
            norm = norm.masked_scatter(need, spectral_norm_upper_bound(M[need], remember=False))
        spectral.append(norm)
        frobenius.append(frobenius_norm_upper_bound(C))
    computed, c_norm = torch.cat(spectral, dim=2), torch.cat(frobenius, dim=2)
    x_norm = mul_up(mul_up(c_norm, output.frobenius[..., None]), 1.0 + 2.0 * gamma(d_head))  # ≥ ‖R̂_O C‖_F
    factors = add_up(
        mul_up(
            output.basis_norm[..., None],
            add_up(mul_up(computed, accuracy.scale), mul_up(accuracy.slack, mul_up(x_norm, 2.0))),
        ),
        mul_up(mul_up(output.residual[..., None], c_norm), accuracy.lip),
    )
    radius = _key_matrix_radius(fwd, weights, values, keys, key_centre, value_centre, inputs, slopes is not None)
    return add_up(add_up(key_term, factors), mul_up(mul_up(inputs.w_o_head[..., None], accuracy.lip), radius))


def _key_matrix_radius(
    fwd: AttentionForward, weights: Tensor, values: Tensor, keys: Tensor, key_centre: Tensor, value_centre: Tensor,
    inputs: KeySumInputs, softcap: bool,
) -> Tensor:  # fmt: skip
    """≥ ‖C_i − Ĉ_i‖ measured through W_O^(h) and Φ^Q_i, divided by ‖W_O^(h)‖ lip_i (``key_sum_sensitivity``):
    input errors, evaluation and the change of centres, ``[b, h, query]``."""
    P = fwd.probabilities
    n_key = P.shape[-1]
    total = sum_upper_bound(P)  # ŝ ≥ Σ p̂ (the weights w ≤ p̂ sum to at most the same)
    both = add_up(total, mul_up(total, total))
    value_spread = norm2_upper_bound(values).amax(dim=-1, keepdim=True)  # ≥ max_m ‖v̂_m − μ_v‖ (global), [b, h, 1]
    key_spread = norm2_upper_bound(keys).amax(dim=-1, keepdim=True)
    if softcap:  # C' is not centred on μ_k: its key factor is k̂_m = (k̂_m − μ_k) + μ_k
        key_spread = add_up(key_spread, norm2_upper_bound(key_centre))
    e_v, e_k = inputs.value_error_max, inputs.keys.error
    moved = mul_up(both, add_up(mul_up(e_v, add_up(key_spread, e_k)), mul_up(value_spread, e_k)))
    evaluated = mul_up(mul_up(both, mul_up(value_spread, key_spread)), gamma(n_key + 8))
    # ‖Σ p̂ v − ŝ ŷ‖ and ‖ỹ − ŷ‖ at the real values: ŷ = fl(P V) is within γ_n ŝ max‖v̂‖ of P V̂
    value_max = norm2_upper_bound(fwd.values).amax(dim=-1, keepdim=True)
    off_one = torch.maximum(sub_up(total, 1.0), sub_up(torch.ones_like(total), sum_lower_bound(P))).clamp_min(0.0)
    base = add_up(mul_up(mul_up(total, value_max), gamma(n_key)), mul_up(total, e_v))
    output_gap = add_up(base, mul_up(off_one, norm2_upper_bound(fwd.head_outputs)))
    mean_gap = add_up(base, mul_up(off_one, norm2_upper_bound(value_centre)))
    key_reach = add_up(key_spread, e_k)
    if softcap:
        centres = mul_up(mul_up(mean_gap, total), key_reach)
    else:
        gap = torch.stack([norm2_upper_bound(c - key_centre) for c in inputs.centres]).amax(dim=0)
        centres = add_up(mul_up(output_gap, gap), mul_up(mul_up(mean_gap, total), key_reach))
    return add_up(add_up(moved, evaluated), centres)


def joint_value_path(P: Tensor, head_norms: Tensor, joint_norm: Tensor) -> Tensor:
    """≥ Σ_m min_{w≥0} (w ‖Σ_h A_h‖ + Σ_h |p^h_im − w| ‖A_h‖) (module docstring): ``[b, query]``.

    Every term is a product or sum of nonnegative floats (|p − w| one rounded difference), so the float64 value is
    within a relative γ_{head + key + 4} of the real one and is enlarged by that.

    Args:
        P: ``[b, head, query, key]``; head_norms: ≥ ‖A_h‖ ``[b, head]``; joint_norm: ≥ ‖Σ_h A_h‖ ``[b]``.
    """
    n_head, n_query, n_key = P.shape[1], P.shape[2], P.shape[3]
    per_head = head_norms[:, None, None, None, :]  # [b, 1, 1, 1, head]
    parts = []
    for rows in query_chunks(n_query, n_key * (n_head + 1) * n_head):
        p = P[:, :, rows].permute(0, 2, 3, 1)  # [b, query, key, head]
        weights = torch.cat([torch.zeros_like(p[..., :1]), p], dim=-1)  # candidate w: 0 and every p^h
        cost = joint_norm[:, None, None, None] * weights + (
            (p[..., None, :] - weights[..., :, None]).abs() * per_head
        ).sum(dim=-1)
        parts.append(cost.amin(dim=-1).sum(dim=-1))
    return A.inflate(torch.cat(parts, dim=1), n_head + n_key + 4)


def value_path_norms(Wv: Tensor, Wo: Tensor, output: A.OutputAccuracy, w_v: Tensor) -> tuple[Tensor, Tensor]:
    """(≥ ‖W_O^(h) W_V^h‖ ``[b, head]``, ≥ ‖Σ_h W_O^(h) W_V^h‖ ``[b]``) for weights ``[b, kv_head, d_head, d_model]``,
    ``[b, d_model, head·d_head]``; ``output``: the heads' ``attention_accuracy.output_accuracy``; w_v ≥ ‖W_V^h‖ per
    query head ``[b, head]``.

    Per head through the QR factor: ‖W_O^(h) W_V‖ ≤ ‖Q̂‖ ‖R̂_O W_V‖ + ‖E_O‖ ‖W_V‖, the product R̂_O W_V with its own
    rounding bounded (``product_spectral_norm_upper_bound``, as for W_O·W_V, where cancellation can lose all of it).
    """

    def compute() -> tuple[Tensor, Tensor]:
        n_head = output.factor.shape[1]
        values = expand_kv_heads(Wv.to(torch.float64), n_head, -3)
        through_factor = product_spectral_norm_upper_bound(output.factor, values)
        per_head = add_up(mul_up(output.basis_norm, through_factor), mul_up(output.residual, w_v))
        joint = product_spectral_norm_upper_bound(Wo, values.flatten(-3, -2))
        return per_head, joint

    # the output accuracy is a function of Wo, so the weights alone determine the result
    return cached_on((Wv, Wo), f"value_path_norms:{output.factor.shape[1]}", compute)


SOFTMAX_ACCURACY_LIMIT = 2.0**-21
"""Largest accepted log-ratio bound ζ between the real and the float64 softmax weights (``softmax_row_accuracy``)."""


def score_error(
    X: Tensor, Wq: Tensor, Wk: Tensor, b_q: Tensor | None, b_k: Tensor | None, tau: float,
    *, q_norm: NormWeights | None = None, k_norm: NormWeights | None = None, query_inputs: Tensor | None = None,
    key_inputs: Tensor | None = None, softcap: float | None = None, position_bias: float = 0.0,
    shifts: tuple[Tensor, Tensor] | None = None, rotation_norm: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(δ, M) per row ``[b, h, query]``: |û_ij − u_ij| ≤ δ_i for the scores of row i after the softmax's shift by
    the row maximum (softcapped scores s = c tanh(u/c) when ``softcap``), and the bound M ≥ ‖q̃_i‖ max_j ‖k̃_j‖ it
    was built from (``softmax_row_accuracy`` derives both). ``position_bias`` B ≥ |b_ij| bounds an additive bias
    independent of the input (ALiBi: max_h |m_h| (n − 1)); forming it, adding it and the larger row maximum add
    4u B + 2u M/τ. ``shifts`` (query side, key side; ``input_shift``): the scores are those of a real input u
    near X, and both sides' errors are widened by them (the separate bound of the QK-norm case then applies).
    ``rotation_norm`` ≥ ‖R_t‖ per position ``[position]`` when the QK-norms act after RoPE (``_side_error``).
    """
    n_head, d_head, d_model = Wq.shape[-3:]
    size_q, size_k = projection_magnitudes(X, Wq, b_q, n_head), projection_magnitudes(X, Wk, b_k, n_head)
    shift_q, shift_k = (None, None) if shifts is None else shifts
    if q_norm is None and k_norm is None and shifts is None:
        magnitude = mul_up(size_q, size_k.amax(dim=-1, keepdim=True))
        rate = math.nextafter(16.0 * gamma(d_model + d_head + 8) / tau, math.inf)
        delta = mul_up(magnitude, rate)
    else:
        e_q, n_q = _side_error(size_q, q_norm, query_inputs, d_model, shift=shift_q, rotation_norm=rotation_norm)
        e_k, n_k = (
            t.amax(dim=-1, keepdim=True)
            for t in _side_error(size_k, k_norm, key_inputs, d_model, shift=shift_k, rotation_norm=rotation_norm)
        )
        magnitude = mul_up(add_up(n_q, e_q), add_up(n_k, e_k))
        errors = add_up(mul_up(e_q, add_up(n_k, e_k)), mul_up(n_q, e_k))
        delta = div_up(mul_up(add_up(errors, mul_up(magnitude, gamma(d_head) + 3 * UNIT_ROUNDOFF)), 2.0), tau)
    if softcap is not None:
        # tanh is 1-Lipschitz; its evaluation, the division and the product by c add 8u·c (|s| ≤ c), and the
        # shift by the row maximum 2u·c
        delta = add_up(delta, softcap * 16 * UNIT_ROUNDOFF)
    if position_bias:
        delta = add_up(
            delta, add_up(mul_up(div_up(magnitude, tau), 2 * UNIT_ROUNDOFF), 4 * UNIT_ROUNDOFF * position_bias)
        )
    return delta, magnitude


def softmax_row_accuracy(
    X: Tensor, Wq: Tensor, Wk: Tensor, b_q: Tensor | None, b_k: Tensor | None, P: Tensor, allowed: Tensor, tau: float,
    *, q_norm: NormWeights | None = None, k_norm: NormWeights | None = None, query_inputs: Tensor | None = None,
    key_inputs: Tensor | None = None, softcap: float | None = None, position_bias: float = 0.0,
    shifts: tuple[Tensor, Tensor] | None = None, rotation_norm: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(η, m) per row ``[b, h, query]``: p_j ≤ (1 + η) p̂_j for every key with p̂_j ≥ 2^-1000 and Σ p_j ≤ m over
    the other allowed keys, where p is the real-arithmetic softmax row at X and p̂ the float64 one.

    Score error (``score_error``): with A_q = |W_Q||x_i| + |b_Q| and A_k = |W_K||x_j| + |b_K| (entrywise), the
    float q, k are within γ_{d+1} A of the real ones, RoPE keeps ℓ2 norms (its own rounding ≤ γ_3 per coordinate),
    and the score and the softmax's shift by the row maximum add γ_{d_head} ‖q‖‖k‖ and 2u|û|: altogether
    |û_ij − u_ij| ≤ δ_i := 16 γ_{d+d_head+8} ‖A_q,i‖ max_j ‖A_k,j‖/τ (a factor 4 above the sum of these terms).
    Under QK-norm the errors and norms of the two sides are bounded separately (``_side_error``) and
    δ_i := 2 (E_q (N_k + E_k) + N_q E_k + (γ_{d_head} + 3u)(N_q + E_q)(N_k + E_k))/τ with E, N the error and norm
    bounds of the rotated query of row i and the worst key. A softcap s = c tanh(u/c) is 1-Lipschitz and adds
    16u·c for its own evaluation; an additive position bias |b| ≤ B (ALiBi) adds 4u B + 2u M/τ. exp, the row sum
    and the division add a relative γ_{n+8}, so p_j/p̂_j ∈ [e^-ζ, e^ζ] with ζ = 2δ_i + γ_{n+8}, η = 2ζ ≥ e^ζ − 1.
    A row with a single allowed key has η = 0. Keys whose p̂_j < 2^-1000 (underflow) hold real mass at most
    2^-990 each. Rows with ζ > ``SOFTMAX_ACCURACY_LIMIT`` (about ‖A_q‖‖A_k‖/τ > 2^28/(d + d_head)) raise
    InputError: their float64 rows are not certified. ``shifts``: as in ``score_error`` (then p is the row at a
    real input near X, and a radius that breaks the limit is refused as such); ``rotation_norm``: as in
    ``score_error`` (QK-norms after RoPE).
    """
    d_head, d_model = Wq.shape[-2:]
    delta, magnitude = score_error(
        X, Wq, Wk, b_q, b_k, tau, q_norm=q_norm, k_norm=k_norm, query_inputs=query_inputs, key_inputs=key_inputs,
        softcap=softcap, position_bias=position_bias, shifts=shifts, rotation_norm=rotation_norm,
    )  # fmt: skip
    zeta = add_up(mul_up(delta, 2.0), gamma(P.shape[-1] + 8))
    # A row with one allowed key is [1] in both arithmetics (fl(exp(0)/exp(0)) = 1), whatever its score.
    zeta = torch.where(allowed.sum(dim=-1) == 1, torch.zeros_like(zeta), zeta)
    worst = float(zeta.max()) if zeta.numel() else 0.0
    if not worst <= SOFTMAX_ACCURACY_LIMIT and shifts is not None:
        raise InputError(
            f"the attention input is only known within an input radius, being a float64 intermediate of the "
            f"block (N₁(x) of an input whose common offset dwarfs its spread, or a sum behind a huge bias), and "
            f"that radius moves the real softmax weights by up to a factor e^{worst:.3g}, beyond the certified "
            f"e^{SOFTMAX_ACCURACY_LIMIT:.3g}: float64 is too inaccurate at this input for a certified bound"
        )
    if not worst <= SOFTMAX_ACCURACY_LIMIT:
        raise InputError(
            f"attention scores too large for a certified float64 softmax: the score bound ‖A_q‖‖A_k‖/τ reaches "
            f"{float(magnitude.max()) / tau:.3g} (τ = {tau:g}), so the real and float64 weights may differ by a "
            f"factor e^{worst:.3g}, beyond the certified e^{SOFTMAX_ACCURACY_LIMIT:.3g} (about "
            f"‖A_q‖‖A_k‖/τ ≤ {2.0**28 / (d_model + d_head):.3g}); rescale the inputs or biases, or raise τ"
        )
    eta = mul_up(zeta, 2.0)
    underflowed = (allowed & (P < 2.0**-1000)).sum(dim=-1).to(torch.float64)
    return eta, underflowed * 2.0**-990


def projection_magnitudes(X: Tensor, W: Tensor, b: Tensor | None, n_head: int) -> Tensor:
    """≥ ‖A_t‖₂ with A_t = |W||x_t| + |b| entrywise, per query head and position ``[b, head, position]`` (key/value
    weights repeated, GQA): the float projection W x_t + b is within γ_{d+1} A_t of the real one. A_t is formed in
    float64 too, within γ_{d+1} of the real one, so its norm is enlarged by 1 + 2γ_{d+1}."""
    x_abs = X.to(torch.float64).abs()
    a = torch.einsum("...hed,...pd->...hpe", expand_kv_heads(W.to(torch.float64).abs(), n_head, -3), x_abs)
    if b is not None:
        a = a + expand_kv_heads(b.to(torch.float64).abs(), n_head, -2)[..., :, None, :]
    return mul_up(norm2_upper_bound(a), 1 + 2 * gamma(X.shape[-1] + 1))


def value_errors(X: Tensor, Wv: Tensor, b_v: Tensor | None, n_head: int, shift: Tensor | None = None) -> Tensor:
    """≥ ‖v_t − v̂_t‖ between the real and the float64 value of each position, per query head ``[b, head, key]``:
    γ_{d+1}‖A^V_t‖ with A^V_t = |W_V||x_t| + |b_V| (the float64 projection and its bias), plus ``shift``
    ≥ ‖W_V^h‖ ‖u_t − x_t‖ when the real input u is only known to lie near X (``input_shift``)."""
    errors = mul_up(projection_magnitudes(X, Wv, b_v, n_head), gamma(X.shape[-1] + 1))
    return errors if shift is None else add_up(errors, shift)


def input_shift(w_norm: Tensor, input_radius: Tensor | None) -> Tensor | None:
    """≥ ‖W^h (u_t − x_t)‖ per query head and position ``[b, head, position]`` from w_norm ≥ ‖W^h‖ (``[head]`` or
    ``[b, head]``) and the input radius ``[b, position]`` (the real input u_t within it of the float x_t); None
    when the input is exact."""
    if input_radius is None:
        return None
    return mul_up(w_norm[..., None], input_radius[:, None, :])


def projection_errors(
    magnitude: Tensor, norm: NormWeights | None, inputs: Tensor | None, d_model: int,
    floors: tuple[Tensor, Tensor] | None = None, shift: Tensor | None = None, rotation_norm: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """≥ ‖ṽ_t − v̂_t‖ between the real and the float64 rotated (and normalized) query or key of each position,
    per query head ``[b, head, position]``, from ‖A‖ (``projection_magnitudes``; ``_side_error``, ``floors``,
    ``shift`` and ``rotation_norm`` as there)."""
    errors, _ = _side_error(magnitude, norm, inputs, d_model, floors, shift, rotation_norm)
    return errors


def qk_norm_scale_lower_bound(inputs: Tensor, norm: NormWeights, input_error: Tensor) -> Tensor:
    """≤ r(a) = (‖a‖²/d + ε)^{1/2} at the real projection a, from the float one â ``[..., position, d]`` and
    ‖a − â‖ ≤ ``input_error`` ``[..., position]``: r is (1/√d)-Lipschitz, so r(a) ≥ r(â) − ‖a − â‖/√d, and
    r ≥ √ε always. ``[..., position]`` float64."""
    return scale_lower_bound_on_ball(
        rmsnorm_scale_lower_bound(inputs, norm.eps), input_error, inputs.shape[-1], norm.eps
    )


def own_heads(t: Tensor, norm: NormWeights, d_head: int) -> Tensor:
    """The heads a joint QK-norm acts on, from a per-query-head tensor ``[b, head, ...]``: every query head for
    queries, one query head per key head for (repeated) keys."""
    groups = norm.gamma.shape[0] // d_head
    return t[:, :: t.shape[1] // groups]


def qk_norm_floors(
    magnitude: Tensor, norm: NormWeights, inputs: Tensor, d_model: int, shift: Tensor | None = None,
    rotation_norm: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(r_lo, e_a) ``[b, head, position]``: a certified lower bound of the norm's r at the real projection and
    the projection's error bound e_a = γ_{d+1}‖A‖ (+ ``shift`` ≥ ‖W^h‖‖u_t − x_t‖ per head, ``input_shift``) over
    the coordinates the norm reads (one head's, or all heads' for a joint norm, ``weights.qk_norm_is_joint``:
    then the ℓ2 norm of the heads' errors), from ‖A‖ per head (``projection_magnitudes``).

    ``rotation_norm`` ≥ ‖R_t‖ ``[position]``: a per-head norm after RoPE (HunYuan), whose ``inputs`` are the
    float rotated projections ρ̂_t = fl(R_t â_t). The error is then that of ρ̂_t, e_ρ = ‖R_t‖ (e_a + 4γ_3‖A‖):
    ρ_t − ρ̂_t = R_t(a_t − â_t) + (R_t â_t − fl(R_t â_t)), and each rotated coordinate c x − s y is rounded
    within γ_2 (|c||x| + |s||y|) with |c|, |s| ≤ ‖R_t‖, at most 2γ_2 ‖R_t‖ ‖â_t‖ in all, ‖â_t‖ ≤ (1 + γ_{d+1})‖A‖.
    r is rotation-invariant, and r_lo bounds it on the ball of radius e_ρ around ρ̂_t."""
    d_head = inputs.shape[-1]
    if not qk_norm_is_joint(norm, d_head):
        error = mul_up(magnitude, gamma(d_model + 1))
        error = error if shift is None else add_up(error, shift)
        if rotation_norm is not None:
            error = mul_up(add_up(error, mul_up(magnitude, 4 * gamma(3))), rotation_norm)
        return qk_norm_scale_lower_bound(inputs, norm, error), error
    if rotation_norm is not None:
        raise ConfigError("a QK-norm over all heads after RoPE is not bounded (weights.check_qk_norm_order)")
    joint = einops.rearrange(own_heads(inputs.to(torch.float64), norm, d_head), "b h p e -> b p (h e)")
    if shift is None:
        error = mul_up(norm2_upper_bound(own_heads(magnitude, norm, d_head), dim=1), gamma(d_model + 1))  # [b, p]
    else:
        per_head = add_up(mul_up(magnitude, gamma(d_model + 1)), shift)
        error = norm2_upper_bound(own_heads(per_head, norm, d_head), dim=1)
    floor = qk_norm_scale_lower_bound(joint, norm, error)
    return floor[:, None].expand_as(magnitude), error[:, None].expand_as(magnitude)


def _side_error(
    magnitude: Tensor, norm: NormWeights | None, inputs: Tensor | None, d_model: int,
    floors: tuple[Tensor, Tensor] | None = None, shift: Tensor | None = None, rotation_norm: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(E, N) ``[b, h, position]``: ‖ṽ̂ − ṽ‖ ≤ E between the float and the real rotated query or key ṽ, and
    ‖ṽ‖ ≤ N, from ‖A‖ (``softmax_row_accuracy``). Without a norm: E = (γ_{d+1} + 4γ_3)‖A‖, N = ‖A‖. Under QK-norm
    ṽ = R N(a): the projection error e_a = γ_{d+1}‖A‖ moves N(a) by at most γ_max e_a / r_lo (‖J_N‖ ≤ γ_max/r
    on the segment, r ≥ ``qk_norm_floors``), evaluating N at â adds γ_{k+6} per coordinate and RoPE γ_3 per
    coordinate pair, with ‖N(â)‖ ≤ γ_max √k = N, k the number of coordinates the norm reads (d_head, or all
    heads' for a joint norm; e_a and r then also over all heads). ``floors``: ``qk_norm_floors`` of the same
    arguments, when the caller already has them. ``shift`` ≥ ‖W^h‖‖u_t − x_t‖ (``input_shift``) widens E, or e_a
    under a norm, when the real input u is only known to lie near X; N stays a bound of the float vector.
    ``rotation_norm`` ≥ ‖R_t‖ ``[position]``: a per-head norm after RoPE, ṽ = N(R a) (HunYuan); the norm's input
    error is then e_ρ of ``qk_norm_floors`` (RoPE's rounding included) and nothing is rounded after the norm.

    A norm with a beta (a per-head norm before RoPE, ``weights.check_qk_norms``: ṽ = R(N(a) + β)): the real
    vector's norm is ≤ N = γ_max √k + ‖β‖, and the float sum fl(n̂ + β) adds ≤ u(|n̂_i| + |β_i|) per coordinate,
    ≤ u(‖n̂‖ + ‖β‖) in ℓ2 with ‖n̂‖ ≤ γ_max √k (1 + γ_{k+6}); RoPE's γ_3 per coordinate pair then acts on a vector
    of norm ≤ N + (that evaluation error), bounded by 2N + the error, and its 4γ_3 is taken of that."""
    if norm is None or inputs is None:
        errors = mul_up(magnitude, gamma(d_model + 1) + 4 * gamma(3))
        return (errors if shift is None else add_up(errors, shift)), magnitude
    width = norm.gamma.shape[0]
    gamma_max = norm.gamma.to(torch.float64).abs().amax()
    radius = mul_up(gamma_max, math.nextafter(math.sqrt(width), math.inf))
    floor, projection_error = (
        floors if floors is not None else qk_norm_floors(magnitude, norm, inputs, d_model, shift, rotation_norm)
    )
    moved = div_up(mul_up(projection_error, gamma_max), floor)
    if norm.beta is not None:
        beta_norm = norm2_upper_bound(norm.beta.to(torch.float64))
        normalized = mul_up(radius, gamma(width + 6))  # ‖N(â) − fl(N(â))‖
        added = mul_up(add_up(add_up(radius, normalized), beta_norm), gamma(1))  # fl(n̂ + β)
        total = add_up(radius, beta_norm)  # ≥ ‖N(a) + β‖
        rotated = mul_up(add_up(mul_up(total, 2.0), add_up(normalized, added)), 4 * gamma(3))
        return add_up(moved, add_up(add_up(normalized, added), rotated)), total.expand_as(moved)
    evaluation = mul_up(radius, gamma(width + 6) if rotation_norm is not None else gamma(width + 6) + 4 * gamma(3))
    return add_up(moved, evaluation), radius.expand_as(moved)


def joint_norm_factors(
    W: Tensor, inputs: Tensor, norm: NormWeights, rotations: Tensor | None, floor: Tensor, input_error: Tensor,
    w_all_norm: Tensor,
) -> tuple[Tensor, A.FactorAccuracy]:  # fmt: skip
    """(F̂_t ``[b, head, position, d_head + 1, d_head]``, its ``FactorAccuracy``), ‖F_t w‖ the norm of
    dx_t ↦ (R_t dq^h_t)·w under a QK-norm over all heads at once (module docstring, "Position maps").

    With a = [a^1; …] the projections of all heads the norm reads (D coordinates), r = (‖a‖²/D + ε)^{1/2} and
    g = W_allᵀ a, head h changes by dq^h = (1/r) diag(γ_h)(W_h dx − a_h (g·dx)/(D r²)), so the functional is
    dx·(W_hᵀ z + g ζ) with z = diag(γ_h) R_tᵀ w / r and ζ = −(γ_h ⊙ a_h)·R_tᵀ w/(D r³). With W_hᵀ = Q R and
    g = Q c + g⊥ (ρ = ‖g⊥‖), ‖W_hᵀ z + g ζ‖ = ‖[[R, c], [0, ρ]] [z; ζ]‖ exactly.

    Accuracy (all at the float projection â, then moved to the real a):
    * [W_hᵀ, g̃] = [Q̂, n] T + [E₁, 0] with n = (g̃ − Q̂ĉ)/ρ, ρ = ‖g̃ − Q̂ĉ‖ and T = [[R̂, ĉ], [0, ρ]]. With
      α = R̂z + ĉζ, β = ρζ and ν = ‖Q̂ᵀ(g̃ − Q̂ĉ)‖: ‖Q̂α + nβ‖² ≤ ‖Q̂‖²α² + β² + 2(ν/ρ)αβ ≤ (max(‖Q̂‖², 1) + ν/ρ)‖Ty‖²,
      and always ≤ (‖Q̂‖² + 1)‖Ty‖² (Cauchy–Schwarz): the per-position scale.
    * T with the float ρ̂ moves by |ρ − ρ̂| |ζ|, |ζ| ≤ γ_max ‖R_t‖ ‖w‖/(√D r²); F̂_t = fl(T̂ Ẑ) is within
      γ_{d+2}‖T̂‖_F‖Ẑ‖_F of T̂Ẑ, and Ẑ = [top; bottom] within γ_{4D+24} of its real value at â entrywise
      (magnitudes γ_max‖R_t‖_F/r and γ_max‖R_t‖_F/(√D r²)).
    * ‖E₁ z‖ ≤ ‖E₁‖ γ_max ‖R_t‖ ‖w‖/r; the float g̃ is within γ_D ‖W_all‖_F ‖â‖ of W_allᵀâ, and ‖â‖‖â_h‖ ≤ D r²;
      the real a moves the Jacobian by ≤ 5 γ_max ‖a − â‖/(√D r_lo²) (``attention_accuracy.qk_norm_map_error``).

    Args:
        W: per-query-head projections ``[(b,) head, d_head, d_model]`` (key heads repeated); inputs: their biased
            outputs before the norm ``[b, head, position, d_head]``; norm: the joint QK-norm (gamma over the
            norm's own heads); rotations: R_t ``[position, d_head, d_head]`` or None; floor, input_error: r_lo and
            ‖a − â‖ per position (``qk_norm_floors``, ``[b, head, position]``); w_all_norm: ≥ ‖W_all‖₂ ``[b, head]``.
    """
    n_head, d_head = inputs.shape[1], inputs.shape[-1]
    a = inputs.to(torch.float64)
    own = own_heads(a, norm, d_head)
    width = norm.gamma.shape[0]
    r = torch.sqrt(own.square().sum(dim=(1, 3)) / width + norm.eps)  # [b, position]
    W64 = W.to(torch.float64).expand(a.shape[0], *W.shape[-3:])
    W_own = own_heads(W64, norm, d_head)
    g = torch.einsum("bhed,bhpe->bpd", W_own, own)  # W_allᵀ a: [b, position, d_model]
    Q, R = torch.linalg.qr(W64.transpose(-1, -2))  # W_hᵀ = Q R: [b, head, d_model, d_head], [b, head, d_head, d_head]
    c = torch.einsum("bhdk,bpd->bhpk", Q, g)
    residual = g[:, None] - torch.einsum("bhdk,bhpk->bhpd", Q, c)  # [b, head, position, d_model]
    rho = torch.linalg.vector_norm(residual, dim=-1)  # [b, head, position]
    gammas = torch.repeat_interleave(norm.gamma.to(torch.float64).reshape(-1, d_head), n_head // (width // d_head), 0)
    eye = torch.eye(d_head, dtype=torch.float64, device=a.device)
    back = eye.expand(a.shape[2], d_head, d_head) if rotations is None else rotations.transpose(-1, -2)  # R_tᵀ
    top = gammas[None, :, None, :, None] * back[None, None] / r[:, None, :, None, None]  # diag(γ_h) R_tᵀ / r
    bottom = -torch.einsum("bhpe,pef->bhpf", gammas[None, :, None, :] * a, back) / (width * r**3)[:, None, :, None]
    upper = R[:, :, None] @ top + c[..., :, None] * bottom[..., None, :]
    factors = torch.cat((upper, (rho[..., None] * bottom)[..., None, :]), dim=-2)

    d_model = W64.shape[-1]
    gamma_max = norm.gamma.to(torch.float64).abs().amax()
    rot_norm = torch.ones(a.shape[2], dtype=torch.float64, device=a.device)
    rot_fro = torch.full_like(rot_norm, math.nextafter(math.sqrt(d_head), math.inf))
    if rotations is not None:
        rot_norm, rot_fro = A.schur_norm_upper_bound(rotations), frobenius_norm_upper_bound(rotations)
    basis_sq = A.gram_deviation_bound(Q)  # ≥ ‖Q̂ᵀQ̂ − I‖: ‖Q̂‖² ≤ 1 + that, [b, head]
    q_fro, r_fro = frobenius_norm_upper_bound(Q), frobenius_norm_upper_bound(R)
    e1 = A.residual_bound(W64.transpose(-1, -2), Q, R)  # ≥ ‖W_hᵀ − Q̂R̂‖, [b, head]
    c_norm, g_norm = norm2_upper_bound(c), norm2_upper_bound(g)[:, None]  # [b, head, position]
    res_error = mul_up(add_up(g_norm, mul_up(q_fro[..., None], c_norm)), gamma(d_head + 1))
    rho_up = A.norm_upper(rho, d_model)
    rho_low = sub_down(mul_down(rho, 1.0 - 2.0 * gamma(d_model + 4)), res_error).clamp_min(0.0)
    rho_gap = add_up(sub_up(rho_up, rho_low), A.UNDERFLOW_FLOOR)  # ≥ |ρ − ρ̂|
    nu = add_up(
        add_up(
            A.norm_upper(torch.linalg.vector_norm(torch.einsum("bhdk,bhpd->bhpk", Q, residual), dim=-1), d_head),
            mul_up(mul_up(q_fro[..., None], rho_up), gamma(d_model)),
        ),
        mul_up(sqrt_up(add_up(basis_sq, 1.0))[..., None], res_error),
    )
    q_sq = add_up(basis_sq, 1.0)[..., None]  # ≥ ‖Q̂‖², [b, head, 1]
    tight = add_up(q_sq.clamp_min(1.0), torch.where(rho_low > 0, div_up(nu, rho_low), torch.full_like(nu, math.inf)))
    scale = mul_up(sqrt_up(torch.minimum(add_up(q_sq, 1.0), tight)), 1.0 + 2.0 * gamma(d_head + 5))
    r_lo, sqrt_width = floor, math.nextafter(math.sqrt(width), 0.0)
    r_sq_lo = mul_down(mul_down(r_lo, r_lo), sqrt_width)  # ≤ √D r_lo²
    zeta = div_up(mul_up(gamma_max, rot_norm), r_sq_lo)  # ≥ |ζ| per unit ‖w‖
    top_error = div_up(mul_up(mul_up(gamma_max, rot_fro), gamma(4 * width + 24)), r_lo)
    bottom_error = div_up(mul_up(mul_up(gamma_max, rot_fro), gamma(4 * width + 24)), r_sq_lo)
    t_fro = sqrt_up(add_up(add_up(mul_up(r_fro, r_fro)[..., None], mul_up(c_norm, c_norm)), mul_up(rho_up, rho_up)))
    z_fro = norm2_upper_bound(torch.cat((top.flatten(-2), bottom), dim=-1))
    evaluation = add_up(
        add_up(mul_up(mul_up(t_fro, z_fro), gamma(d_head + 2)), mul_up(r_fro[..., None], top_error)),
        mul_up(add_up(c_norm, rho_up), bottom_error),
    )
    inner = add_up(
        add_up(mul_up(frobenius_norm_upper_bound(factors), gamma(d_head)), evaluation), mul_up(rho_gap, zeta)
    )
    w_all_fro = frobenius_norm_upper_bound(W_own.flatten(-3, -2))  # [b]
    z_bound = div_up(mul_up(gamma_max, rot_norm), r_lo)  # ≥ ‖z‖ per unit ‖w‖
    outer = add_up(
        mul_up(z_bound, add_up(e1[..., None], mul_up(w_all_fro[:, None, None], gamma(width)))),
        div_up(mul_up(mul_up(mul_up(w_all_norm[..., None], rot_norm), gamma_max), mul_up(input_error, 5.0)), r_sq_lo),
    )
    slack = add_up(mul_up(scale, inner), outer)
    lip = div_up(mul_up(mul_up(w_all_norm[..., None], rot_norm), gamma_max), r_lo)
    accuracy = A.FactorAccuracy(scale=scale, slack=slack, lip=lip, floor=A.scaled_floor(scale))
    return factors, accuracy


def real_row_theta_upper_bound(P: Tensor, theta_upper: Tensor, eta: Tensor, small_mass: Tensor) -> Tensor:
    """≥ θ(p) of the real softmax row p from the float row p̂ (``softmax_row_accuracy``), ``[b, h, query]``.

    θ(p) = 4 max_S p(S) p(Sᶜ) (Σ p = 1). Split p into the keys with p̂ ≥ 2^-1000, where p ≤ (1 + η) p̂, and the
    rest, of mass ≤ m: 4 p(S) p(Sᶜ) ≤ (1 + η)² 4 p̂(S) p̂(Sᶜ) + 8m, and 4 p̂(S) p̂(Sᶜ) = ŝ² − 4 (p̂(S) − ŝ/2)² ≤
    θ̂ + ŝ (ŝ − 1) with θ̂ ≤ ``theta_upper`` the certificate of the stored row (sum ŝ). ŝ − 1 is bounded from the
    largest weight and the sum of the others, so a one-hot row keeps its tiny θ.
    """
    p_max, top = P.max(dim=-1, keepdim=True)
    others = sum_upper_bound(P.scatter(-1, top, 0.0))
    excess = add_up(round_up(p_max[..., 0] - 1.0), others).clamp_min(0.0)
    stored = add_up(theta_upper, mul_up(add_up(excess, 1.0), excess))
    factor = mul_up(add_up(eta, 1.0), add_up(eta, 1.0))
    return add_up(mul_up(factor, stored), mul_up(small_mass, 8.0))


def _output_errors(
    fwd: AttentionForward, distances: Tensor, w_o_head: Tensor, allowed: Tensor, value_error_max: Tensor
) -> tuple[Tensor, Tensor]:
    """(D_i ≥ max_m ‖W_O^(h)(v_m − ŷ_i)‖, e_i ≥ ‖W_O^(h)(Σ_m p̂_m v_m − ŷ_i)‖ plus the values' input errors)
    ``[b, h, query]``, shared by both weight corrections of the key-sum form: e_i = 2 γ_{n+2} ‖W_O^(h)‖ max_m ‖v̂_m‖
    + ‖W_O^(h)‖ max_m ‖v_m − v̂_m‖ (Σ_m p_m (v_m − v̂_m) with Σ p = 1)."""
    d_max = A.masked_max(distances, allowed)
    value_max = A.row_max_of_keys(torch.linalg.vector_norm(fwd.values, dim=-1), allowed)
    e = mul_up(mul_up(value_max, w_o_head[..., None]), 2.0 * gamma(fwd.probabilities.shape[-1] + 2) * (1 + 2.0**-30))
    return d_max, add_up(e, mul_up(w_o_head[..., None], value_error_max))


def softcap_key_sum_correction(
    fwd: AttentionForward, distances: Tensor, plain_spread: Tensor, w_o_head: Tensor, eta: Tensor, small_mass: Tensor,
    slope_slack: Tensor, allowed: Tensor, value_error_max: Tensor,
) -> Tensor:  # fmt: skip
    """τ × the amount by which the softcapped key-sum form at the real (p, D) may exceed its value at the float
    (p̂, D̂), ``[b, h, query]``: 2 s⁰_i (E_w (D_i + e_y) + ŝ e_y), s⁰_i the spread without slopes (≥ every a_im and
    ‖W_Qᵀ M_iᵀ k̃_m‖), D_i = max_m ‖W_O^(h)(v_m − ŷ_i)‖, e_y = e_i + (η + m) D_i ≥ ‖W_O^(h)(y_i − ŷ_i)‖
    (``key_sum_weight_correction``), ŝ ≥ Σ_m p̂_m.

    |p_m D_m − p̂_m D̂_m| ≤ (1 + η) p̂_m |D_m − D̂_m| + η p̂_m for the keys with p̂_m ≥ 2^-1000 and the underflowed keys
    hold mass ≤ m, so the weights move by E_w = ((1 + η) slack + η) ŝ + m in total; the key term moves by at most
    (E_w (D_i + e_y) + ŝ e_y) max_m a_im and C'_i by at most the same times max_m ‖W_Qᵀ M_iᵀ k̃_m‖.
    """
    d_max, e = _output_errors(fwd, distances, w_o_head, allowed, value_error_max)
    e_y = add_up(e, mul_up(add_up(eta, small_mass), d_max))
    total = sum_upper_bound(fwd.probabilities)
    slope_slack = add_up(slope_slack, 2 * UNIT_ROUNDOFF)  # the key-sum weights are p̂ D̂ rounded up
    moved = add_up(mul_up(add_up(mul_up(add_up(eta, 1.0), slope_slack), eta), total), small_mass)
    change = add_up(mul_up(moved, add_up(d_max, e_y)), mul_up(total, e_y))
    return mul_up(mul_up(plain_spread, 2.0), change)


def key_sum_weight_correction(
    fwd: AttentionForward, distances: Tensor, score_spread: Tensor, w_o_head: Tensor, eta: Tensor, small_mass: Tensor,
    allowed: Tensor, value_error_max: Tensor,
) -> Tensor:  # fmt: skip
    """τ × the amount by which the key-sum form at the real row p may exceed its value at the float row p̂,
    ``[b, h, query]``: 2 s_i (3 (η + m) D_i + e_i), D_i = max_m ‖W_O^(h)(v_m − ŷ_i)‖, e_i = 2 γ_{n+2} ‖W_O^(h)‖
    max_m ‖v_m‖ ≥ ‖W_O^(h)(Σ_m p̂_m v_m − ŷ_i)‖ (``softmax_row_accuracy`` gives η, m).

    With y = Σ p_m v_m: ‖W_O^(h)(y − ŷ)‖ ≤ e_i + (η + m) D_i; the key term gains at most
    (η + m) D_i a_max + (that) a_max and C_i at most (η + m) D_i K + (that) K, with a_max, K ≤ s_i.
    """
    d_max, e = _output_errors(fwd, distances, w_o_head, allowed, value_error_max)
    weights = add_up(eta, small_mass)
    return mul_up(mul_up(score_spread, 2.0), add_up(mul_up(mul_up(weights, d_max), 3.0), e))
