"""Certified Jacobian bounds of multi-head attention in the block-∞ geometry (docs/math.md T4, T5).

Derivation (per query head h with key/value head g, row i, allowed keys K(i), perturbation dX with
‖dX‖_{b∞} = max_j ‖dx_j‖₂ ≤ 1; rotated queries q̃_i = R_i q_i, keys k̃_j = R_j k_j, R = I without RoPE):

    dy_i = Σ_j P_ij W_V dx_j + Σ_j (dp_i)_j v_j,      dp_i = J_τ(u_i) du_i,
    du_ij = (R_i W_Q dx_i)·k̃_j + q̃_i·(R_j W_K dx_j).

1. ‖Σ_j P_ij W_V dx_j‖ ≤ ‖W_V‖ (row-stochastic mixing, T3).
2. Σ_j (dp_i)_j = 0, so ‖Σ_j (dp_i)_j v_j‖ ≤ ‖dp_i‖₁ · V_i with V_i = max_{j∈K(i)} ‖v_j − c‖ for any centre c;
   c = b_V shows the value bias cancels (V_i ≤ ‖W_V‖ R).
3. J_τ 1 = 0, so du_i may be shifted by any constant: ‖dp_i‖₁ ≤ (θ(p_i)/τ) min_c ‖du_i − c1‖_∞ (T1).
   Shifting by (R_i W_Q dx_i)·m: |du_ij − c| ≤ ‖W_Qᵀ R_iᵀ(k̃_j − m)‖ + ‖W_Kᵀ R_jᵀ q̃_i‖ (the exact norms of the
   two linear functionals of dx_i and dx_j), so ‖du_i − c1‖_∞ ≤ s_i := max_{j∈K(i)} of that sum
   ≤ ‖W_Q‖ max_j ‖k̃_j − m‖ + ‖W_K‖ ‖q_i‖; m is the attention-weighted key mean or b_K (no RoPE) / 0 (RoPE),
   whichever gives the smaller s_i. Without RoPE, m = b_K removes the key bias (it is irrelevant); with RoPE the
   rotated bias R_j b_K depends on j and cannot be removed: max_j ‖k̃_j‖ ≤ ‖W_K‖R + ‖b_K‖. The query bias always
   enters: ‖q_i‖ ≤ ‖W_Q‖R + ‖b_Q‖.

Hence ‖dy_i^h‖ ≤ g_ih := ‖W_V‖ + (θ(p_i)/τ) V_i s_i ≤ ‖W_V‖ + (θ̃_h/τ) Φ_h with θ̃_h = max_i θ(p_i) and

    Φ_h = ‖W_V‖ R (‖W_Q‖(‖W_K‖R + β_K) + ‖W_K‖(‖W_Q‖R + ‖b_Q‖)),   β_K = ‖b_K‖ with RoPE, else 0,

which is docs/math.md T4's Φ_h^bias = ‖W_K‖‖W_V‖R(2‖W_Q‖R + ‖b_Q‖) without RoPE (corrected here for RoPE with a key
bias). Heads combine through W_O: ‖dz_i‖ ≤ ‖W_O‖ Σ_h g_ih (the paper's form, T5), and also
‖dz_i‖ ≤ ‖W_O‖ (Σ_h g_ih²)^{1/2}, ≤ Σ_h ‖W_O^{(h)}‖ g_ih, and, applying W_O^{(h)} before taking norms,
≤ V_i + Σ_h min(σ^θ_ih, σ^Σ_ih): V_i bounds the value part of all heads together (≤ Σ_h ‖W_O^{(h)} W_V^h‖),
σ^θ_ih = (θ(p_i)/τ) s_i min_c max_j ‖W_O^{(h)}(v_j − c)‖ is the θ form above and σ^Σ_ih the key-sum form, which
weighs every key by p_ij instead of taking the worst key (both derived in ``attention_terms``). Each is valid;
the reported ``upper_bound`` is the max over rows of the smallest.

Rounding (``attnsens._rounding``, ``attention_accuracy``). Every norm of a weight or bias is a certified upper bound
and every product, quotient and sum of the final formulas is rounded up; both bounds are rigorous in real
arithmetic. The local bound is about the real softmax rows at X, which float64 can miss by far when scores are
huge (a one-hot-looking row whose runner-up weight is off by a large factor): ``attention_terms.softmax_row_accuracy``
bounds the ratio of the real to the float weights from the scores' magnitude (p ≤ (1 + η) p̂), refuses rows
beyond a documented range with an InputError, and θ, the value part and the key-sum form are enlarged by
exactly what that ratio allows (``real_row_theta_upper_bound``, ``key_sum_weight_correction``). The remaining
per-row terms (distances of values, spreads of keys, functional norms, the key-sum matrices) are evaluated in
float64 from the float forward and carry the proved radii of ``attention_accuracy``: the input errors of the
float values, keys and queries, the accuracy of the factors G and R_O, and that of every evaluated norm.
Grouped-query attention changes nothing: each query head reads its own (shared) W_K^g, W_V^g.
The operator maps d_model → d_model tokens, so its value is the same in the RMS and ℓ2 block conventions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from attnsens._rounding import (
    add_up,
    div_up,
    gamma,
    mul_up,
    norm2_upper_bound,
    product_error_factor,
    spectral_norm_upper_bound,
    sqrt_down,
    sub_up,
    sum_lower_bound,
    sum_upper_bound,
)
from attnsens.errors import ConfigError, ShapeError
from attnsens.geometry import attention_accuracy as A
from attnsens.geometry import attention_terms as T
from attnsens.geometry.attention import (
    AttentionBiases,
    AttentionForward,
    _attention_tensors,
    _AttentionTensors,
    _mha_forward,
    check_attention_shapes,
    expand_kv_heads,
)
from attnsens.geometry.norms import Geometry, check_geometry
from attnsens.weights import AttentionWeights, NormWeights, qk_norm_is_joint


@dataclass(frozen=True, kw_only=True)
class ProjectionNormBounds:
    """Certified upper bounds (float64, ``attnsens._rounding``) of the spectral norms per query head: w_q, w_k, w_v,
    w_o_head ``[head]``; w_o scalar; of the bias norms b_q, b_k ``[head]`` (zeros when absent)."""

    w_q: Tensor
    w_k: Tensor
    w_v: Tensor
    w_o_head: Tensor
    w_o: Tensor
    b_q: Tensor
    b_k: Tensor


@dataclass(frozen=True, kw_only=True)
class MHALocalJacobianBounds:
    """Certified bounds of ‖D MHA(X)‖ in the block-∞ operator norm (docs/math.md T4/T5), float64.

    upper_bound ``[batch]``: the tightest certified bound (max over rows of the best head combination);
    paper_form_upper_bound ``[batch]``: ‖W_O‖ Σ_h (‖W_V^h‖ + θ̃_h Φ_h/τ); row_upper_bound ``[batch, query]``;
    value_term ``[head]``: ‖W_V^h‖; sensitivity_term ``[batch, head]``: θ̃_h Φ_h/τ; theta_tilde, phi
    ``[batch, head]``; radius ``[batch]``: ‖X‖ in ``geometry`` (plus the input radius when one is given);
    norms: ``ProjectionNormBounds``; geometry. output ``[batch, query, d_model]``: the float64 MHA(X) and
    output_radius ``[batch, query]``: ≥ ‖MHA(U)_i − output_i‖₂ for the real input U (X itself, or any U within
    the input radius), the forward enclosure a chain rule evaluates the next factor on.
    """

    upper_bound: Tensor
    paper_form_upper_bound: Tensor
    row_upper_bound: Tensor
    value_term: Tensor
    sensitivity_term: Tensor
    theta_tilde: Tensor
    phi: Tensor
    radius: Tensor
    norms: ProjectionNormBounds
    geometry: str
    output: Tensor
    output_radius: Tensor


@dataclass(frozen=True, kw_only=True)
class MHALipschitzBounds:
    """Certified Lipschitz bound of MHA on {‖X‖_{∞,rms} ≤ R_rms}, any length and mask (docs/math.md T5), float64.

    upper_bound: best head combination; paper_form_upper_bound: ‖W_O‖ Σ_h (‖W_V^h‖ + Φ_h/τ); value_term,
    sensitivity_term (= Φ_h/τ), phi: ``[head]``; radius_rms; norms.
    """

    upper_bound: Tensor
    paper_form_upper_bound: Tensor
    value_term: Tensor
    sensitivity_term: Tensor
    phi: Tensor
    radius_rms: Tensor
    norms: ProjectionNormBounds


def projection_norm_bounds(
    Wq: Tensor, Wk: Tensor, Wv: Tensor, Wo: Tensor, biases: AttentionBiases | None = None
) -> ProjectionNormBounds:
    """Certified upper bounds of every head's projection norms (key/value heads repeated per query head, GQA)."""
    biases = biases or AttentionBiases()
    n_head, d_head, _ = Wq.shape[-3:]
    wo_heads = Wo.reshape(*Wo.shape[:-1], n_head, d_head).movedim(-2, -3)  # [..., head, d_model, d_head]

    def bias_norm(b: Tensor | None, like: Tensor) -> Tensor:
        if b is None:
            return torch.zeros(like.shape[:-2], dtype=torch.float64, device=like.device)
        return norm2_upper_bound(b, dim=-1)

    return ProjectionNormBounds(
        w_q=spectral_norm_upper_bound(Wq),
        w_k=expand_kv_heads(spectral_norm_upper_bound(Wk), n_head, -1),
        w_v=expand_kv_heads(spectral_norm_upper_bound(Wv), n_head, -1),
        w_o_head=spectral_norm_upper_bound(wo_heads),
        w_o=spectral_norm_upper_bound(Wo),
        b_q=bias_norm(biases.q, Wq),
        b_k=expand_kv_heads(bias_norm(biases.k, Wk), n_head, -1),
    )


@dataclass(frozen=True, kw_only=True)
class _ScoreFactors:
    """Per head ``[..., head]``: derivative bounds ‖∂q̃/∂x‖ (q_lip), ‖∂k̃/∂x‖ (k_lip) and radii of the rotated
    queries and (centred) keys, on the set the bound is about."""

    q_lip: Tensor
    q_radius: Tensor
    k_lip: Tensor
    k_radius: Tensor


def _score_factors(
    norms: ProjectionNormBounds, radius_l2: Tensor, centred_keys: bool, q_norm: NormWeights | None,
    k_norm: NormWeights | None, floors: tuple[Tensor | float, Tensor | float], Wq: Tensor, Wk: Tensor,
) -> _ScoreFactors:  # fmt: skip
    """Without QK-norm ‖W_Q‖, ‖W_Q‖R + ‖b_Q‖, ‖W_K‖ and ‖W_K‖R + β_K (module docstring; β_K = 0 only when the key
    bias cancels: no RoPE and no softcap, whose slopes D_j break the shift by (dq·b_K)1). Under QK-norm the query
    is R_i N(a_i): ‖J_N(a)‖ ≤ γ_max/r(a) with r(a) ≥ the floor (√ε on every input, or the smallest certified r
    at X), and ‖N(a)‖ ≤ γ_max √k for every a (k = d_head, or all heads' D coordinates for a joint norm), which
    also bounds the key radius with the centre m = 0; a per-head norm with a beta (R_i(N(a_i) + β)) has the same
    Jacobian and ‖N(a) + β‖ ≤ γ_max √k + ‖β‖. A joint norm mixes the heads, so its derivative bound uses
    the norm ‖W_all‖ of all heads' projection at once."""
    R = radius_l2[..., None]

    def side(
        w: Tensor, bias: Tensor, norm: NormWeights | None, floor: Tensor | float, W: Tensor
    ) -> tuple[Tensor, Tensor]:
        if norm is None:
            return w, add_up(mul_up(w, R), bias)
        if qk_norm_is_joint(norm, W.shape[-2]):
            w = spectral_norm_upper_bound(W.flatten(-3, -2))[..., None].expand_as(w)
        gamma_max = norm.gamma.to(torch.float64).abs().amax()
        width_sqrt = math.nextafter(math.sqrt(norm.gamma.shape[0]), math.inf)
        size = mul_up(gamma_max, width_sqrt)
        if norm.beta is not None:  # N(a) + β: the shift leaves the Jacobian alone and widens the radius by ‖β‖
            size = add_up(size, norm2_upper_bound(norm.beta.to(torch.float64)))
        return div_up(mul_up(w, gamma_max), floor), size.expand_as(add_up(w, R))

    key_bias = torch.zeros_like(norms.b_k) if centred_keys else norms.b_k
    q_lip, q_radius = side(norms.w_q, norms.b_q, q_norm, floors[0], Wq)
    k_lip, k_radius = side(norms.w_k, key_bias, k_norm, floors[1], Wk)
    return _ScoreFactors(q_lip=q_lip, q_radius=q_radius, k_lip=k_lip, k_radius=k_radius)


def _phi(norms: ProjectionNormBounds, radius_l2: Tensor, factors: _ScoreFactors) -> Tensor:
    """Φ_h = ‖W_V‖R (q_lip·k_radius + k_lip·q_radius) for radius R (ℓ2 per token), rounded up; ``[..., head]``."""
    score = add_up(mul_up(factors.q_lip, factors.k_radius), mul_up(factors.k_lip, factors.q_radius))
    return mul_up(mul_up(norms.w_v, radius_l2[..., None]), score)


@dataclass(frozen=True, kw_only=True)
class _Side:
    """The query or key side of the local bound (``attention_accuracy``): ``gain`` Ĝ ``[batch, head, rank,
    d_head]``, the functional ``factors`` F̂_t or None, their ``accuracy``, the rotated (and normalized) vectors'
    input ``errors`` ``[batch, head, position]`` and, under a QK-norm, the certified ``floor`` r_lo
    ``[batch, head, position]`` (1.0 without one)."""

    gain: Tensor
    factors: Tensor | None
    accuracy: A.FactorAccuracy
    errors: Tensor
    floor: Tensor | float


def _side(
    X: Tensor, W: Tensor, b: Tensor | None, norm: NormWeights | None, inputs: Tensor | None,
    rotations: Tensor | None, w_norm: Tensor, n_head: int, shift: Tensor | None = None,
    rotation_norm: Tensor | None = None,
) -> _Side:  # fmt: skip
    """One ``_Side``: W as given (key heads not yet repeated), w_norm ≥ ‖W‖ per query head ``[batch, head]``,
    ``shift`` the input radius's share of the projection errors (``attention_terms.input_shift``); the projection
    magnitudes and QK-norm floors are computed once here. ``rotation_norm`` ≥ ‖R_t‖ ``[position]`` when a per-head
    QK-norm acts after RoPE (HunYuan): ``inputs`` are then the rotated projections ρ_t = R_t a_t, the norm's
    Jacobian is evaluated there and the map is J_N(ρ_t) R_t (docs/math.md T4-qk-rot)."""
    batch, d_model = X.shape[0], X.shape[-1]
    accuracy = A.gain_accuracy(W)
    gain = A.GainAccuracy(
        gain=_per_sequence(expand_kv_heads(accuracy.gain, n_head, -3), batch, 3),
        **{k: _per_sequence(expand_kv_heads(getattr(accuracy, k), n_head, -1), batch, 1)
           for k in ("basis_norm", "residual", "frobenius")},
    )  # fmt: skip
    magnitude = T.projection_magnitudes(X, W, b, n_head)
    if norm is None or inputs is None:
        errors = T.projection_errors(magnitude, norm, inputs, d_model, shift=shift)
        if rotations is None:
            return _Side(gain=gain.gain, factors=None, accuracy=A.plain_factor_accuracy(gain, w_norm), errors=errors,
                         floor=1.0)  # fmt: skip
        factors = T.functional_factors(gain.gain, rotations)
        side = A.mapped_factor_accuracy(gain, factors, rotations, None, w_norm, A.schur_norm_upper_bound(rotations))
        return _Side(gain=gain.gain, factors=factors, accuracy=side, errors=errors, floor=1.0)
    floor, input_error = T.qk_norm_floors(magnitude, norm, inputs, d_model, shift, rotation_norm)
    errors = T.projection_errors(magnitude, norm, inputs, d_model, (floor, input_error), rotation_norm=rotation_norm)
    if qk_norm_is_joint(norm, W.shape[-2]):
        w_all = _per_sequence(spectral_norm_upper_bound(W.flatten(-3, -2))[..., None], batch, 1)
        factors, side = T.joint_norm_factors(
            expand_kv_heads(W, n_head, -3), inputs, norm, rotations, floor, input_error, w_all.expand_as(w_norm)
        )
        return _Side(gain=gain.gain, factors=factors, accuracy=side, errors=errors, floor=floor)
    gamma_max = norm.gamma.to(torch.float64).abs().amax()
    jacobians = T.norm_jacobians(inputs, norm)
    if rotations is None:
        maps = jacobians
    else:
        maps = jacobians @ rotations if rotation_norm is not None else rotations @ jacobians
    map_error = A.qk_norm_map_error(jacobians, rotations, gamma_max, floor, input_error)
    rotation_bound = floor.new_ones(()) if rotations is None else A.schur_norm_upper_bound(rotations)
    map_norm = div_up(mul_up(rotation_bound, gamma_max), floor)  # ≥ ‖R_t J_N(a_t)‖, or ‖J_N(ρ_t) R_t‖, really
    factors = T.functional_factors(gain.gain, maps)
    side = A.mapped_factor_accuracy(gain, factors, maps, map_error, w_norm, map_norm)
    return _Side(gain=gain.gain, factors=factors, accuracy=side, errors=errors, floor=floor)


def _smallest_floor(side: _Side) -> Tensor | float:
    """The smallest certified r of a QK-norm over each sequence's positions ``[batch, head]`` (1.0 without one)."""
    return side.floor if isinstance(side.floor, float) else side.floor.amin(dim=-1)


def _output_accuracy(Wo: Tensor, n_head: int, batch: int) -> A.OutputAccuracy:
    """``attention_accuracy.output_accuracy`` of W_O with a batch axis on every tensor."""
    accuracy = A.output_accuracy(Wo, n_head)
    fields = {k: getattr(accuracy, k) for k in ("factor", "scale", "slack", "residual", "basis_norm", "frobenius")}
    shared = {"factor": 3}
    return A.OutputAccuracy(
        floor=accuracy.floor, **{k: _per_sequence(t, batch, shared.get(k, 1)) for k, t in fields.items()}
    )


def _combine_heads(per_head: Tensor, w_o: Tensor, w_o_head: Tensor) -> Tensor:
    """Best of ‖W_O‖ (Σ_h g_h²)^{1/2} and Σ_h ‖W_O^{(h)}‖ g_h over the last (head) axis (shapes broadcast),
    each rounded up."""
    stacked = mul_up(w_o, norm2_upper_bound(per_head, dim=-1))
    blockwise = sum_upper_bound(mul_up(w_o_head, per_head), dim=-1)
    return torch.minimum(stacked, blockwise)


def _per_sequence(t: Tensor, batch: int, shared_ndim: int) -> Tensor:
    """A weights-derived tensor, shared (``shared_ndim`` axes) or per sequence (one more), as per sequence."""
    return t.expand(batch, *t.shape) if t.ndim == shared_ndim else t


def mha_local_jacobian_bounds(
    X: Tensor, weights: AttentionWeights, *, geometry: Geometry = "rms", input_radius: Tensor | None = None
) -> MHALocalJacobianBounds:
    """‖D MHA(X)‖_{b∞→b∞} ≤ ‖W_O‖ Σ_h (‖W_V^h‖ + (θ̃_h/τ) Φ_h), θ̃_h from the actual rows at X (module docstring).

    The steps of docs/math.md T4, each its own function: (1) the float64 forward and the radii of its values
    (``_local_forward``), (2) the score spread s_i (``_score_spread_bounds``), (3) θ̃ of the real rows via
    ``attnsens.theta.certify`` (``_row_theta_bounds``), (4) the value path through W_O (``_value_path_upper_bound``)
    and (5) their combination per row (``_row_upper_bound``).

    Args:
        X: ``[batch, query, d_model]`` attention input.
        weights: the sublayer (its projections, biases, τ, causal or sliding-window mask, RoPE, QK-norm, softcap
            and ALiBi slopes, as in ``mha_forward``).
        geometry: convention of the reported radius.
        input_radius: ``[batch, query]`` ℓ2 radii δ_t ≥ 0, or None (X is the input). With radii the bounds hold
            at every U with ‖U_t − X_t‖₂ ≤ δ_t, so at a real input that a float64 X only approximates (a block's
            N₁(x), docs/architecture.md "Rounding"): every projection error gains ‖W^h‖ δ_t
            (``attention_terms.input_shift``), and so do the scores, the softmax rows' accuracy and the QK-norm floors.

    Returns:
        ``MHALocalJacobianBounds``: certified upper bounds of the Jacobian's block-∞ operator norm at X (or on the
        ball of ``input_radius``; docs/math.md T4/T5, θ̃_h = max over rows of an upper bound of the real softmax
        row's θ) and the forward enclosure of MHA there, float64.

    Raises:
        InputError: scores too large for the float64 softmax rows to be certified (about ‖A_q‖‖A_k‖/τ beyond
            2^28/(d_model + d_head), ``attention_terms.softmax_row_accuracy``).
    """
    a = _attention_tensors(weights, X.shape[1], X.device)
    return _mha_local_jacobian_bounds(X, a, geometry=geometry, input_radius=input_radius)


def _mha_local_jacobian_bounds(
    X: Tensor, a: _AttentionTensors, *, geometry: Geometry = "rms", input_radius: Tensor | None = None
) -> MHALocalJacobianBounds:
    """``mha_local_jacobian_bounds`` of the tensor form ``a`` (batched weights, any mask; results per sequence)."""
    geometry = check_geometry(geometry)
    local = _local_forward(X, a, input_radius)
    theta = _row_theta_bounds(X, a, local)
    spread = _score_spread_bounds(X, a, local)
    row_bound = _row_upper_bound(a, local, theta, spread, _value_path_upper_bound(a, local, theta))
    norms, radius_l2 = local.norms, local.radius_l2
    floors = (_smallest_floor(spread.query_side), _smallest_floor(spread.key_side))
    centred_keys = a.rotary is None and a.softcap is None
    phi = _phi(norms, radius_l2, _score_factors(norms, radius_l2, centred_keys, a.q_norm, a.k_norm, floors, a.Wq, a.Wk))
    theta_tilde = theta.theta_upper.amax(dim=-1)
    sensitivity = div_up(mul_up(theta_tilde, phi), float(a.tau))
    paper_form = mul_up(norms.w_o, sum_upper_bound(add_up(norms.w_v, sensitivity), dim=-1))
    radius = radius_l2 / math.sqrt(X.shape[-1]) if geometry == "rms" else radius_l2
    output_radius = _output_radius(
        local.fwd, a.Wo, local.biases64.o, local.head_distance, local.value_error_max, theta.eta, theta.small_mass,
        norms,
    )  # fmt: skip
    return MHALocalJacobianBounds(
        upper_bound=row_bound.amax(dim=-1),
        paper_form_upper_bound=paper_form,
        row_upper_bound=row_bound,
        value_term=norms.w_v,
        sensitivity_term=sensitivity,
        theta_tilde=theta_tilde,
        phi=phi,
        radius=radius,
        norms=norms,
        geometry=geometry,
        output=local.fwd.output,
        output_radius=output_radius,
    )


@dataclass(frozen=True, kw_only=True)
class _LocalForward:
    """Step 1 of the local bound (forward and radii): the float64 forward at X and the radii measured from it.

    fwd: ``AttentionForward`` in float64; biases64: the biases in float64; norms: ``ProjectionNormBounds``;
    shifts: the input radius's share (q, k, v) of the projection errors (``attention_terms.input_shift``, None
    without radii); allowed ``[batch, head, query, key]``; radius_l2 ``[batch]`` ≥ max_t ‖U_t‖₂ over the input
    ball; value_errors ``[batch, head, key]`` ≥ ‖v_m − v̂_m‖ and value_error_max ``[batch, head, query]`` their
    max over the allowed keys; head_distance ≥ max_m ‖v̂_m − ŷ_i‖ and value_spread V_i ≥ min_c max_m ‖v_m − c‖
    over c ∈ {y_i, b_V} (T4 step 2), both ``[batch, head, query]``; output: W_O's ``OutputAccuracy`` per sequence;
    rotations: RoPE's R_t ``[query, d_head, d_head]`` (None without RoPE); norm_rotation: ≥ ‖R_t‖ ``[query]`` when
    the QK-norms act after RoPE (``attention_terms.qk_norm_floors``), else None.
    """

    fwd: AttentionForward
    biases64: AttentionBiases
    norms: ProjectionNormBounds
    shifts: tuple[Tensor | None, Tensor | None, Tensor | None]
    allowed: Tensor
    radius_l2: Tensor
    value_errors: Tensor
    value_error_max: Tensor
    head_distance: Tensor
    value_spread: Tensor
    output: A.OutputAccuracy
    rotations: Tensor | None = None
    norm_rotation: Tensor | None = None

    @property
    def score_shifts(self) -> tuple[Tensor, Tensor] | None:
        """The query and key shifts together, as the score kernels take them (None without input radii)."""
        shift_q, shift_k, _ = self.shifts
        return None if shift_q is None or shift_k is None else (shift_q, shift_k)


def _local_forward(X: Tensor, a: _AttentionTensors, input_radius: Tensor | None) -> _LocalForward:
    """Step 1, forward and radii (docs/math.md T4 steps 1–2): the float64 forward at X, the projection norms, the
    input radii's shifts, the radius R = max_t ‖x_t‖₂ (+ max_t δ_t) and the value radii V_i, each rounded up."""
    check_attention_shapes(X, a.Wq, a.Wk, a.Wv, a.Wo)
    biases64 = AttentionBiases(**{k: (None if t is None else t.to(torch.float64)) for k, t in vars(a.biases).items()})
    wide = replace(a, Wq=a.Wq.double(), Wk=a.Wk.double(), Wv=a.Wv.double(), Wo=a.Wo.double(), biases=biases64)
    fwd = _mha_forward(X.to(torch.float64), wide)
    norms = projection_norm_bounds(a.Wq, a.Wk, a.Wv, a.Wo, a.biases)
    delta = _input_radius(input_radius, X)
    shift_q, shift_k, shift_v = (T.input_shift(w, delta) for w in (norms.w_q, norms.w_k, norms.w_v))
    allowed = fwd.allowed.expand_as(fwd.probabilities)
    n_head, batch = a.Wq.shape[-3], X.shape[0]
    value_errors = T.value_errors(X, a.Wv, a.biases.v, n_head, shift_v)  # [batch, head, key]
    value_error_max = A.row_max_of_keys(value_errors, allowed)
    value_centre_bias = (
        torch.zeros_like(fwd.head_outputs)
        if biases64.v is None
        else (expand_kv_heads(biases64.v, n_head, -2)[..., :, None, :].expand_as(fwd.head_outputs))
    )
    head_distance = T.float_value_distance(fwd.values, fwd.head_outputs, allowed)  # ≥ max_m ‖v̂_m − ŷ_i‖
    value_spread = torch.minimum(
        add_up(head_distance, value_error_max),
        T.max_value_distance(fwd.values, value_centre_bias, value_errors, allowed),
    )
    radius_l2 = norm2_upper_bound(X, dim=-1).amax(dim=-1)
    if delta is not None:
        radius_l2 = add_up(radius_l2, delta.amax(dim=-1))
    rotations = None if a.rotary is None else T.rotation_matrices(X.shape[1], a.Wq.shape[-2], a.rotary, X.device)
    norm_rotation = None
    if rotations is not None and a.qk_norm_after_rotary:
        norm_rotation = A.schur_norm_upper_bound(rotations)
    return _LocalForward(
        fwd=fwd, biases64=biases64, norms=norms, shifts=(shift_q, shift_k, shift_v), allowed=allowed,
        radius_l2=radius_l2, value_errors=value_errors, value_error_max=value_error_max, head_distance=head_distance,
        value_spread=value_spread, output=_output_accuracy(a.Wo, n_head, batch), rotations=rotations,
        norm_rotation=norm_rotation,
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class _RowThetaBounds:
    """θ of the real softmax rows, ``[batch, head, query]``: theta_upper ≥ θ(p_i) (T1, T4 step 3); eta and
    small_mass, the rows' accuracy p ≤ (1 + η) p̂ (+ m on the keys with tiny p̂), from
    ``attention_terms.softmax_row_accuracy``."""

    theta_upper: Tensor
    eta: Tensor
    small_mass: Tensor


def _row_theta_bounds(X: Tensor, a: _AttentionTensors, local: _LocalForward) -> _RowThetaBounds:
    """Step 3, θ̃ via ``certify`` (docs/math.md T4 step 3): the certified θ of every float64 row, enlarged by what
    the real rows may differ from it (``attention_terms.real_row_theta_upper_bound``)."""
    from attnsens.theta import certify

    fwd = local.fwd
    position_bias = 0.0 if a.alibi_slopes is None else float(a.alibi_slopes.double().abs().max()) * (X.shape[1] - 1)
    eta, small_mass = T.softmax_row_accuracy(
        X, a.Wq, a.Wk, a.biases.q, a.biases.k, fwd.probabilities, local.allowed, a.tau, q_norm=a.q_norm,
        k_norm=a.k_norm, query_inputs=fwd.query_inputs, key_inputs=fwd.key_inputs, softcap=a.softcap,
        position_bias=position_bias, shifts=local.score_shifts, rotation_norm=local.norm_rotation,
    )  # fmt: skip
    stored_theta = certify(fwd.probabilities, dim=-1).upper.to(torch.float64)  # [batch, head, query]
    theta_upper = T.real_row_theta_upper_bound(fwd.probabilities, stored_theta, eta, small_mass)
    return _RowThetaBounds(theta_upper=theta_upper, eta=eta, small_mass=small_mass)


@dataclass(frozen=True, kw_only=True)
class _ScoreSpreadBounds:
    """Step 2's result: spread ``[batch, head, query]`` ≥ s_i = max_{j∈K(i)} |du_ij − c| per unit ‖dX‖ (module
    docstring, step 3), the best of its centres; and what the key-sum form reuses: the query and key ``_Side``,
    the keys' radius, the query functionals' norms, the centres (key mean, key bias or 0) and, under a softcap,
    the certified slopes, their slack and the spread without slopes (None otherwise)."""

    spread: Tensor
    query_side: _Side
    key_side: _Side
    key_radius: T.KeyRadius
    query_norms: Tensor
    key_mean: Tensor
    key_centre: Tensor
    slopes: Tensor | None = None
    slack: Tensor | None = None
    plain_spread: Tensor | None = None


def _score_spread_bounds(X: Tensor, a: _AttentionTensors, local: _LocalForward) -> _ScoreSpreadBounds:
    """Step 2, score spread (docs/math.md T4 step 4, as the code computes it): s_i ≤ min over centres m of
    max_j ‖W_Qᵀ R_iᵀ(k̃_j − m)‖ + ‖W_Kᵀ R_jᵀ q̃_i‖, the centre m the attention-weighted key mean or b_K (no RoPE,
    QK-norm or softcap) / 0; under a softcap the slopes D_j weigh the key terms (docs/math.md T4-cap)."""
    fwd, allowed, batch, n_head = local.fwd, local.allowed, X.shape[0], a.Wq.shape[-3]
    key_mean = fwd.probabilities @ fwd.keys
    key_centre = torch.zeros_like(key_mean)
    if local.biases64.k is not None and a.rotary is None and a.k_norm is None and a.softcap is None:
        key_centre = expand_kv_heads(local.biases64.k, n_head, -2)[..., :, None, :].expand_as(key_mean)
    rotations = local.rotations
    shift_q, shift_k, _ = local.shifts
    query_side, key_side = (
        _side(X, W, b, norm, inputs, rotations, _per_sequence(w_norm, batch, 1), n_head, shift, local.norm_rotation)
        for W, b, norm, inputs, w_norm, shift in (
            (a.Wq, a.biases.q, a.q_norm, fwd.query_inputs, local.norms.w_q, shift_q),
            (a.Wk, a.biases.k, a.k_norm, fwd.key_inputs, local.norms.w_k, shift_k),
        )
    )  # fmt: skip
    gain_q, query_factors, accuracy_q = query_side.gain, query_side.factors, query_side.accuracy
    key_radius = T.KeyRadius(
        norm=A.row_max_of_keys(norm2_upper_bound(fwd.keys), allowed),
        error=A.row_max_of_keys(key_side.errors, allowed),
    )
    query_norms = T.query_functional_norms(fwd, key_side.gain, key_side.factors, key_side.accuracy, query_side.errors)

    def spread(centre: Tensor, slopes: Tensor | None = None) -> Tensor:
        return T.score_spread(fwd, centre, gain_q, query_norms, allowed, query_factors, accuracy_q, key_radius, slopes)

    slopes = slack = plain_spread = None
    if fwd.score_slopes is None or a.softcap is None:
        score_spread = torch.minimum(spread(key_mean), spread(key_centre))
    else:  # under a softcap (attention_terms.softcap_slopes): centre 0, or the key mean with its extra term
        score_errors, _ = T.score_error(
            X, a.Wq, a.Wk, a.biases.q, a.biases.k, a.tau, q_norm=a.q_norm, k_norm=a.k_norm,
            query_inputs=fwd.query_inputs, key_inputs=fwd.key_inputs, shifts=local.score_shifts,
            rotation_norm=local.norm_rotation,
        )  # fmt: skip
        slopes, half_range, slack = T.softcap_slopes(fwd.score_slopes, score_errors, a.softcap, allowed)
        centred = add_up(
            spread(key_mean, slopes),
            mul_up(half_range, T.centre_functional_norms(gain_q, query_factors, key_mean, accuracy_q)),
        )
        score_spread = torch.minimum(centred, spread(key_centre, slopes))
        plain_spread = spread(key_centre)
    return _ScoreSpreadBounds(
        spread=score_spread, query_side=query_side, key_side=key_side, key_radius=key_radius,
        query_norms=query_norms, key_mean=key_mean, key_centre=key_centre, slopes=slopes, slack=slack,
        plain_spread=plain_spread,
    )  # fmt: skip


def _value_path_upper_bound(a: _AttentionTensors, local: _LocalForward, theta: _RowThetaBounds) -> Tensor:
    """Step 4, value path (docs/math.md T4 step 1 seen through W_O): ≥ ‖Σ_h W_O^{(h)} Σ_j p^h_ij W_V^h dx_j‖ per
    unit ‖dX‖, the value part of all heads together, ``[batch, query]``: Σ_j min_w (w ‖Σ_h A_h‖ + Σ_h |p^h_ij − w|
    ‖A_h‖) with A_h = W_O^{(h)} W_V^h (``attention_terms.joint_value_path``), plus Σ_h ‖A_h‖ (η + m) for the real
    rows."""
    batch = local.fwd.probabilities.shape[0]
    head_value, joint_value = T.value_path_norms(
        _per_sequence(a.Wv, batch, 3), _per_sequence(a.Wo, batch, 2), local.output,
        _per_sequence(local.norms.w_v, batch, 1),
    )  # fmt: skip
    # The value part weighs keys by p̂; the real weights differ by at most (η + m) per head and key in total.
    return add_up(
        T.joint_value_path(local.fwd.probabilities, head_value, joint_value),
        sum_upper_bound(mul_up(head_value[..., None], add_up(theta.eta, theta.small_mass)), dim=-2),
    )


def _row_upper_bound(
    a: _AttentionTensors, local: _LocalForward, theta: _RowThetaBounds, spread: _ScoreSpreadBounds,
    value_part: Tensor,
) -> Tensor:  # fmt: skip
    """Step 5, combine, ``[batch, query]``: the smaller of ‖W_O‖-combined g_ih = ‖W_V‖ + (θ(p_i)/τ) V_i s_i
    (``_combine_heads``) and the value part plus Σ_h min(θ form, key-sum form) with W_O^{(h)} applied per head."""
    fwd, norms, batch = local.fwd, local.norms, local.fwd.probabilities.shape[0]
    sensitivity_rate = mul_up(div_up(theta.theta_upper, float(a.tau)), spread.spread)  # bounds ‖dp_i‖₁ per unit ‖dX‖
    per_row_head = add_up(mul_up(sensitivity_rate, local.value_spread), norms.w_v[..., None])  # [batch, head, query]
    row_bound = _combine_heads(per_row_head.transpose(-1, -2), norms.w_o[..., None], norms.w_o_head[..., None, :])
    # W_O applied per head before norms are taken: value part of all heads together, and per head the better
    # of the θ form and the key-sum form of the sensitivity part (attention_terms).
    w_o_head = _per_sequence(norms.w_o_head, batch, 1)
    outputs, distances, value_radius = T.projected_values(fwd, local.output, local.value_errors, w_o_head)
    output_spread = T.output_spread(outputs, distances, value_radius, local.output, local.biases64.v, local.allowed)
    theta_form = mul_up(sensitivity_rate, output_spread)
    cutoff = mul_up(theta_form, float(a.tau))  # rows where the key-sum form cannot win need no spectral norm
    key_sum_form = _key_sum_upper_bound(a, local, theta, spread, distances, cutoff)
    projected = add_up(value_part, sum_upper_bound(torch.minimum(theta_form, key_sum_form), dim=-2))
    return torch.minimum(row_bound, projected)


def _key_sum_upper_bound(
    a: _AttentionTensors, local: _LocalForward, theta: _RowThetaBounds, spread: _ScoreSpreadBounds,
    distances: Tensor, cutoff: Tensor,
) -> Tensor:  # fmt: skip
    """The key-sum form of the sensitivity part per head and row ``[batch, head, query]`` (docs/math.md T4), for
    the real rows: (1 + η) times the form at the float rows plus their correction, over τ."""
    fwd, norms, query = local.fwd, local.norms, spread.query_side
    inputs = T.KeySumInputs(
        accuracy=query.accuracy, output=local.output, keys=spread.key_radius, value_error_max=local.value_error_max,
        centres=(spread.key_mean, spread.key_centre), w_o_head=_per_sequence(norms.w_o_head, fwd.values.shape[0], 1),
    )  # fmt: skip
    terms = (fwd, distances, query.gain, spread.query_norms, query.factors, inputs)
    if spread.slopes is None or spread.slack is None or spread.plain_spread is None:
        key_sum = T.key_sum_sensitivity(*terms, cutoff=cutoff)
        correction = T.key_sum_weight_correction(
            fwd, distances, spread.spread, norms.w_o_head, theta.eta, theta.small_mass, local.allowed,
            local.value_error_max,
        )  # fmt: skip
    else:  # weights p̂ D̂ with the float slopes; the correction covers the real (p, D)
        key_sum = T.key_sum_sensitivity(*terms, fwd.score_slopes, cutoff)
        correction = T.softcap_key_sum_correction(
            fwd, distances, spread.plain_spread, norms.w_o_head, theta.eta, theta.small_mass, spread.slack,
            local.allowed, local.value_error_max,
        )  # fmt: skip
    return div_up(add_up(mul_up(key_sum, add_up(theta.eta, 1.0)), correction), float(a.tau))


def _input_radius(input_radius: Tensor | None, X: Tensor) -> Tensor | None:
    """The input radii as float64 ``[batch, query]`` (None when absent), checked to be finite and ≥ 0."""
    if input_radius is None:
        return None
    delta = torch.as_tensor(input_radius, dtype=torch.float64, device=X.device).expand(X.shape[:-1])
    if not bool(((delta >= 0) & torch.isfinite(delta)).all()):
        raise ConfigError("input_radius must be finite and ≥ 0 at every position")
    return delta


def _output_radius(
    fwd: AttentionForward, Wo: Tensor, b_o: Tensor | None, head_distance: Tensor, value_error_max: Tensor,
    eta: Tensor, small_mass: Tensor, norms: ProjectionNormBounds,
) -> Tensor:  # fmt: skip
    """≥ ‖MHA(U)_i − ẑ_i‖₂ per row ``[batch, query]``, ẑ the float64 output at X and U the real input (within
    the radii already folded into ``value_error_max`` ≥ max_m ‖v_m − v̂_m‖, ``eta`` and ``small_mass``), from
    ``head_distance`` ≥ max_m ‖v̂_m − ŷ_i‖ (``attention_terms.float_value_distance``).

    Per head, with p the real row, v the real values, ŷ the float head output and ŝ = Σ_m p̂_m:
    Σ_m p_m v_m − ŷ = Σ_m p_m (v_m − v̂_m) + Σ_m (p_m − p̂_m)(v̂_m − ŷ) + (1 − ŝ) ŷ + (Σ_m p̂_m v̂_m − ŷ), since
    Σ p = 1; |p_m − p̂_m| ≤ η p̂_m (p/p̂ ∈ [e^-ζ, e^ζ], ``softmax_row_accuracy``) on the keys with p̂_m ≥ 2^-1000
    and ≤ 2^-990 on the others, so the head output is within e_h = max_m ‖v_m − v̂_m‖ + (η ŝ + m) max_m ‖v̂_m − ŷ‖
    + |1 − ŝ| ‖ŷ‖ + γ_n ŝ max_m ‖v̂_m‖ of ŷ (the last term: the float product P̂V̂). W_O maps the heads' errors to
    at most min(‖W_O‖ ‖e‖₂, Σ_h ‖W_O^(h)‖ e_h), and the float output projection adds γ_{HD+1} ‖|Ŷ||W_O|ᵀ + |b_O|‖.
    """
    P, allowed = fwd.probabilities, fwd.allowed.expand_as(fwd.probabilities)
    n_key = P.shape[-1]
    total_up, total_down = sum_upper_bound(P), sum_lower_bound(P)
    off_one = torch.maximum(sub_up(total_up, 1.0), sub_up(-total_down, -1.0)).clamp_min(0.0)
    d_head = fwd.values.shape[-1]
    value_max = A.row_max_of_keys(A.norm_upper(torch.linalg.vector_norm(fwd.values, dim=-1), d_head), allowed)
    head_norm = A.norm_upper(torch.linalg.vector_norm(fwd.head_outputs, dim=-1), d_head)
    head_error = add_up(
        add_up(value_error_max, mul_up(add_up(mul_up(eta, total_up), small_mass), head_distance)),
        add_up(mul_up(off_one, head_norm), mul_up(mul_up(total_up, value_max), gamma(n_key))),
    )  # [batch, head, query]
    mixed = _combine_heads(head_error.transpose(-1, -2), norms.w_o[..., None], norms.w_o_head[..., None, :])
    concatenated = fwd.head_outputs.abs().transpose(1, 2).flatten(-2)  # [batch, query, head·d_head]
    magnitude = concatenated @ Wo.to(torch.float64).abs().transpose(-1, -2)
    if b_o is not None:
        magnitude = magnitude + b_o.abs()[..., None, :]
    rounding = mul_up(norm2_upper_bound(magnitude), product_error_factor(concatenated.shape[-1] + 1))
    return add_up(mixed, rounding)


def mha_lipschitz_bounds(weights: AttentionWeights, *, radius_rms: float | Tensor) -> MHALipschitzBounds:
    """Lip(MHA on {‖X‖_{∞,rms} ≤ R_rms}) ≤ ‖W_O‖ Σ_h (‖W_V^h‖ + Φ_h/τ), Φ_h with R = √d R_rms, θ = 1.

    Args:
        weights: the sublayer (only ‖b_Q‖, and ‖b_K‖ under RoPE or a softcap, enter of its biases). A softcap c
            keeps |ds| ≤ |du| (ds = sech²(u/c) du), so only the key bias's cancellation is lost. An additive bias
            independent of the input (ALiBi) changes no derivative and θ ≤ 1 holds for every row, so the constant
            holds with it unchanged; so does every mask. A QK-norm side enters through γ_max √d_head (its radius on
            every input) and ‖W‖ γ_max/√ε (its derivative bound where the projection vanishes, a loose but valid
            constant).
        radius_rms: R_rms (scalar or ``[...]``: results gain those axes).

    Returns:
        ``MHALipschitzBounds``: certified Lipschitz bound in the block-∞ operator norm, independent of the sequence
        length and of masking (docs/math.md T5; the ball is convex, so the sup of the local bound is a Lipschitz bound).
    """
    return _mha_lipschitz_bounds(_attention_tensors(weights), radius_rms=radius_rms)


def _mha_lipschitz_bounds(a: _AttentionTensors, *, radius_rms: float | Tensor) -> MHALipschitzBounds:
    """``mha_lipschitz_bounds`` of the tensor form ``a`` (weights optionally batched: results gain that axis;
    the mask is not used)."""
    Wq, Wk, Wv, Wo = a.Wq, a.Wk, a.Wv, a.Wo
    if Wq.ndim not in (3, 4):
        raise ShapeError(f"Wq must be [(batch,) head, d_head, d_model], got {tuple(Wq.shape)}")
    d_model, q_norm, k_norm = Wq.shape[-1], a.q_norm, a.k_norm
    radius_rms = torch.as_tensor(radius_rms, dtype=torch.float64, device=Wq.device)
    if bool((radius_rms < 0).any()):
        raise ConfigError(f"radius_rms must be ≥ 0, got {radius_rms}")
    norms = projection_norm_bounds(Wq, Wk, Wv, Wo, a.biases)
    radius_l2 = mul_up(radius_rms, math.nextafter(math.sqrt(d_model), math.inf))
    floors = tuple(
        1.0 if n is None else sqrt_down(torch.tensor(float(n.eps), dtype=torch.float64)) for n in (q_norm, k_norm)
    )
    centred_keys = a.rotary is None and a.softcap is None
    factors = _score_factors(norms, radius_l2, centred_keys, q_norm, k_norm, (floors[0], floors[1]), Wq, Wk)
    phi = _phi(norms, radius_l2, factors)
    sensitivity = div_up(phi, float(a.tau))
    per_head = add_up(norms.w_v, sensitivity)
    return MHALipschitzBounds(
        upper_bound=_combine_heads(per_head, norms.w_o, norms.w_o_head),
        paper_form_upper_bound=mul_up(norms.w_o, sum_upper_bound(per_head, dim=-1)),
        value_term=norms.w_v,
        sensitivity_term=sensitivity,
        phi=phi,
        radius_rms=radius_rms,
        norms=norms,
    )
