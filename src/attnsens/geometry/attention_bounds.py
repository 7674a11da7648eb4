"""Certified Jacobian bounds of multi-head attention in the block-∞ geometry (MATH.md T4, T5).

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

which is MATH.md T4's Φ_h^bias = ‖W_K‖‖W_V‖R(2‖W_Q‖R + ‖b_Q‖) without RoPE (corrected here for RoPE with a key
bias). Heads combine through W_O: ‖dz_i‖ ≤ ‖W_O‖ Σ_h g_ih (the paper's form, T5), and also
‖dz_i‖ ≤ ‖W_O‖ (Σ_h g_ih²)^{1/2}, ≤ Σ_h ‖W_O^{(h)}‖ g_ih, and, applying W_O^{(h)} before taking norms,
≤ Σ_h [‖W_O^{(h)} W_V^h‖ + (θ(p_i)/τ) s_i min_c max_j ‖W_O^{(h)}(v_j − c)‖]; each is valid, the reported
``upper_bound`` is the max over rows of the smallest. Grouped-query attention changes nothing: each query head
reads its own (shared) W_K^g, W_V^g.
The operator maps d_model → d_model tokens, so its value is the same in the RMS and ℓ2 block conventions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attnsens.errors import ConfigError, ShapeError
from attnsens.geometry.attention import (
    AttentionBiases,
    AttentionForward,
    apply_rotary,
    check_attention_shapes,
    expand_kv_heads,
    mha_forward,
)
from attnsens.geometry.norms import Geometry, block_l2_norm, check_geometry, spectral_norm
from attnsens.models.weights import RotaryConfig


@dataclass(frozen=True, kw_only=True)
class ProjectionNorms:
    """Spectral norms (float64) per query head: w_q, w_k, w_v, w_o_head ``[head]``; w_o scalar; bias norms
    b_q, b_k ``[head]`` (zeros when absent)."""

    w_q: Tensor
    w_k: Tensor
    w_v: Tensor
    w_o_head: Tensor
    w_o: Tensor
    b_q: Tensor
    b_k: Tensor


@dataclass(frozen=True, kw_only=True)
class MHALocalJacobianBound:
    """Certified bounds of ‖D MHA(X)‖ in the block-∞ operator norm (MATH.md T4/T5), float64.

    upper_bound ``[batch]``: the tightest certified bound (max over rows of the best head combination);
    paper_form_upper_bound ``[batch]``: ‖W_O‖ Σ_h (‖W_V^h‖ + θ̃_h Φ_h/τ); row_upper_bound ``[batch, query]``;
    value_term ``[head]``: ‖W_V^h‖; sensitivity_term ``[batch, head]``: θ̃_h Φ_h/τ; theta_tilde, phi
    ``[batch, head]``; radius ``[batch]``: ‖X‖ in ``geometry``; norms: ``ProjectionNorms``; geometry.
    """

    upper_bound: Tensor
    paper_form_upper_bound: Tensor
    row_upper_bound: Tensor
    value_term: Tensor
    sensitivity_term: Tensor
    theta_tilde: Tensor
    phi: Tensor
    radius: Tensor
    norms: ProjectionNorms
    geometry: str


@dataclass(frozen=True, kw_only=True)
class MHALipschitzBound:
    """Certified Lipschitz bound of MHA on {‖X‖_{∞,rms} ≤ R_rms}, any length and mask (MATH.md T5), float64.

    upper_bound: best head combination; paper_form_upper_bound: ‖W_O‖ Σ_h (‖W_V^h‖ + Φ_h/τ); value_term,
    sensitivity_term (= Φ_h/τ), phi: ``[head]``; radius_rms; norms.
    """

    upper_bound: Tensor
    paper_form_upper_bound: Tensor
    value_term: Tensor
    sensitivity_term: Tensor
    phi: Tensor
    radius_rms: Tensor
    norms: ProjectionNorms


def projection_norms(
    Wq: Tensor, Wk: Tensor, Wv: Tensor, Wo: Tensor, biases: AttentionBiases | None = None
) -> ProjectionNorms:
    """Spectral norms of every head's projections (key/value heads repeated per query head, GQA)."""
    biases = biases or AttentionBiases()
    n_head, d_head, _ = Wq.shape[-3:]
    wo_heads = Wo.reshape(*Wo.shape[:-1], n_head, d_head).movedim(-2, -3)  # [..., head, d_model, d_head]

    def bias_norm(b: Tensor | None, like: Tensor) -> Tensor:
        if b is None:
            return torch.zeros(like.shape[:-2], dtype=torch.float64, device=like.device)
        return torch.linalg.vector_norm(b.to(torch.float64), dim=-1)

    return ProjectionNorms(
        w_q=spectral_norm(Wq),
        w_k=expand_kv_heads(spectral_norm(Wk), n_head, -1),
        w_v=expand_kv_heads(spectral_norm(Wv), n_head, -1),
        w_o_head=spectral_norm(wo_heads),
        w_o=spectral_norm(Wo),
        b_q=bias_norm(biases.q, Wq),
        b_k=expand_kv_heads(bias_norm(biases.k, Wk), n_head, -1),
    )


def _phi(norms: ProjectionNorms, radius_l2: Tensor, rotary: RotaryConfig | None) -> Tensor:
    """Φ_h for radius R (ℓ2 per token); radius ``[...]`` → ``[..., head]``."""
    R = radius_l2[..., None]
    key_bias = norms.b_k if rotary is not None else torch.zeros_like(norms.b_k)
    score = norms.w_q * (norms.w_k * R + key_bias) + norms.w_k * (norms.w_q * R + norms.b_q)
    return norms.w_v * R * score


def _combine_heads(per_head: Tensor, w_o: Tensor, w_o_head: Tensor) -> Tensor:
    """Best of ‖W_O‖ (Σ_h g_h²)^{1/2} and Σ_h ‖W_O^{(h)}‖ g_h over the last (head) axis (shapes broadcast)."""
    stacked = w_o * torch.linalg.vector_norm(per_head, dim=-1)
    blockwise = (w_o_head * per_head).sum(dim=-1)
    return torch.minimum(stacked, blockwise)


def _per_sequence(t: Tensor, batch: int, shared_ndim: int) -> Tensor:
    """A weights-derived tensor, shared (``shared_ndim`` axes) or per sequence (one more), as per sequence."""
    return t.expand(batch, *t.shape) if t.ndim == shared_ndim else t


def _gain_factor(W: Tensor) -> Tensor:
    """G with ‖Wᵀ v‖₂ = ‖G v‖₂ for every v: G = diag(S) Uᵀ from W = U S Vᵀ. ``[..., d_head, d_model]`` →
    ``[..., rank, d_head]`` (float64)."""
    U, S, _ = torch.linalg.svd(W.to(torch.float64), full_matrices=False)
    return S[..., :, None] * U.transpose(-1, -2)


def _rotation_matrices(n_pos: int, d_head: int, rotary: RotaryConfig, device: torch.device) -> Tensor:
    """R_t ``[position, d_head, d_head]`` with apply_rotary(x)_t = R_t x_t."""
    basis = torch.eye(d_head, dtype=torch.float64, device=device)[:, None, :].expand(d_head, n_pos, d_head)
    return apply_rotary(basis, rotary).permute(1, 2, 0)


def _score_spread(
    fwd: AttentionForward, centre: Tensor, gain_q: Tensor, gain_k: Tensor, allowed: Tensor, rotary: RotaryConfig | None
) -> Tensor:
    """s_i = max_{j∈K(i)} (‖W_Qᵀ R_iᵀ (k̃_j − m_i)‖ + ‖W_Kᵀ R_jᵀ q̃_i‖): the exact norms of the two linear
    functionals dx_i ↦ (R_i W_Q dx_i)·(k̃_j − m_i) and dx_j ↦ q̃_i·(R_j W_K dx_j) (module docstring, step 3).
    ``[batch, head, query]``; with RoPE it materializes ``[batch, head, query, key, rank]``."""
    if rotary is None:
        keys = torch.einsum("bhre,bhke->bhkr", gain_q, fwd.keys)
        centres = torch.einsum("bhre,bhqe->bhqr", gain_q, centre)
        key_term = _masked_max_distance(keys, centres, allowed)
        query_term = torch.linalg.vector_norm(torch.einsum("bhre,bhqe->bhqr", gain_k, fwd.queries), dim=-1)
        return key_term + query_term
    n_pos, d_head = fwd.keys.shape[-2], fwd.keys.shape[-1]
    R = _rotation_matrices(n_pos, d_head, rotary, fwd.keys.device)
    back_q = torch.einsum("bhrd,ied->bhire", gain_q, R)  # G_Q R_iᵀ
    back_k = torch.einsum("bhrd,jed->bhjre", gain_k, R)  # G_K R_jᵀ
    key_term = torch.linalg.vector_norm(
        torch.einsum("bhire,bhje->bhijr", back_q, fwd.keys)
        - torch.einsum("bhire,bhie->bhir", back_q, centre)[..., None, :],
        dim=-1,
    )
    query_term = torch.linalg.vector_norm(torch.einsum("bhjre,bhie->bhijr", back_k, fwd.queries), dim=-1)
    return (key_term + query_term).masked_fill(~allowed, 0.0).amax(dim=-1)


def _projected_head_sum(
    fwd: AttentionForward, Wv: Tensor, Wo: Tensor, b_v: Tensor | None, sensitivity_rate: Tensor, allowed: Tensor
) -> Tensor:
    """Σ_h [‖W_O^{(h)} W_V^h‖ + ‖dp_i^h‖₁ min_c max_j ‖W_O^{(h)}(v_j − c)‖]: the head sum with W_O applied per head
    before the norms are taken, c ∈ {y_i^h, b_V}. ``[batch, query]``."""
    n_head, d_head = fwd.values.shape[-3], fwd.values.shape[-1]
    wo_heads = Wo.to(torch.float64).reshape(*Wo.shape[:-1], n_head, d_head).movedim(-2, -3)  # [b, h, d, e]
    # ‖W_O^{(h)} W_V^h‖ = ‖R W_V^h‖ with W_O^{(h)} = Q R (Q has orthonormal columns): a d_head-row matrix.
    triangular = torch.linalg.qr(wo_heads, mode="r").R
    value_path = spectral_norm(triangular @ expand_kv_heads(Wv.to(torch.float64), n_head, -3))  # [b, h]
    outputs = torch.einsum("bhde,bhke->bhkd", wo_heads, fwd.values)
    centres = torch.einsum("bhde,bhqe->bhqd", wo_heads, fwd.head_outputs)
    spread = _masked_max_distance(outputs, centres, allowed)
    bias_centre = torch.zeros_like(centres)
    if b_v is not None:
        bias = _per_sequence(expand_kv_heads(b_v, n_head, -2), outputs.shape[0], 2)
        bias_centre = torch.einsum("bhde,bhe->bhd", wo_heads, bias)[..., None, :].expand_as(centres)
    spread = torch.minimum(spread, _masked_max_distance(outputs, bias_centre, allowed))
    return (value_path[..., None] + sensitivity_rate * spread).sum(dim=-2)


def _masked_max_distance(points: Tensor, centres: Tensor, allowed: Tensor) -> Tensor:
    """max_{j allowed for i} ‖points_j − centres_i‖: points ``[b, h, key, e]``, centres ``[b, h, query, e]``."""
    distances = torch.cdist(centres, points, compute_mode="donot_use_mm_for_euclid_dist")
    return distances.masked_fill(~allowed, 0.0).amax(dim=-1)


def mha_local_jacobian_upper_bound(
    X: Tensor,
    Wq: Tensor,
    Wk: Tensor,
    Wv: Tensor,
    Wo: Tensor,
    *,
    tau: float,
    mask: Tensor | None = None,
    biases: AttentionBiases | None = None,
    rotary: RotaryConfig | None = None,
    geometry: Geometry = "rms",
) -> MHALocalJacobianBound:
    """‖D MHA(X)‖_{b∞→b∞} ≤ ‖W_O‖ Σ_h (‖W_V^h‖ + (θ̃_h/τ) Φ_h), θ̃_h from the actual rows at X (module docstring).

    Args:
        X: ``[batch, query, d_model]`` attention input.
        Wq: ``[head, d_head, d_model]``; Wk, Wv: ``[kv_head, d_head, d_model]``; Wo: ``[d_model, head * d_head]``;
            each may carry a leading batch axis matching X (biases likewise).
        tau: temperature; mask: bool ``[query, key]`` or ``[batch, query, key]`` (True = allowed);
        biases, rotary: as in ``mha_forward``; geometry: convention of the reported radius.

    Returns:
        ``MHALocalJacobianBound``: certified upper bounds of the Jacobian's block-∞ operator norm at X
        (MATH.md T4/T5, θ̃_h = max over rows of the θ certificate's upper end), float64.
    """
    from attnsens.theta import certify

    geometry = check_geometry(geometry)
    check_attention_shapes(X, Wq, Wk, Wv, Wo)
    if not tau > 0:
        raise ConfigError(f"temperature tau must be > 0, got {tau}")
    biases = biases or AttentionBiases()
    f64 = {k: (None if t is None else t.to(torch.float64)) for k, t in vars(biases).items()}
    fwd = mha_forward(
        X.to(torch.float64),
        Wq.double(),
        Wk.double(),
        Wv.double(),
        Wo.double(),
        tau=tau,
        mask=mask,
        biases=AttentionBiases(**f64),
        rotary=rotary,
    )
    norms = projection_norms(Wq, Wk, Wv, Wo, biases)
    theta_upper = certify(fwd.probabilities, dim=-1).upper.to(torch.float64)  # [batch, head, query]
    allowed = fwd.allowed.expand_as(fwd.probabilities)
    n_head = Wq.shape[-3]

    value_centre_bias = (
        torch.zeros_like(fwd.head_outputs)
        if f64["v"] is None
        else (expand_kv_heads(f64["v"], n_head, -2)[..., :, None, :].expand_as(fwd.head_outputs))
    )
    value_spread = torch.minimum(
        _masked_max_distance(fwd.values, fwd.head_outputs, allowed),
        _masked_max_distance(fwd.values, value_centre_bias, allowed),
    )
    key_mean = fwd.probabilities @ fwd.keys
    key_centre = torch.zeros_like(key_mean)
    if f64["k"] is not None and rotary is None:
        key_centre = expand_kv_heads(f64["k"], n_head, -2)[..., :, None, :].expand_as(key_mean)
    batch = X.shape[0]
    gain_q = _per_sequence(_gain_factor(Wq), batch, 3)
    gain_k = _per_sequence(expand_kv_heads(_gain_factor(Wk), n_head, -3), batch, 3)
    score_spread = torch.minimum(
        _score_spread(fwd, key_mean, gain_q, gain_k, allowed, rotary),
        _score_spread(fwd, key_centre, gain_q, gain_k, allowed, rotary),
    )
    sensitivity_rate = theta_upper / tau * score_spread  # bounds ‖dp_i‖₁ per unit ‖dX‖
    per_row_head = norms.w_v[..., None] + sensitivity_rate * value_spread  # [batch, head, query]
    row_bound = _combine_heads(per_row_head.transpose(-1, -2), norms.w_o[..., None], norms.w_o_head[..., None, :])
    projected = _projected_head_sum(fwd, _per_sequence(Wv, batch, 3), _per_sequence(Wo, batch, 2), f64["v"],
                                    sensitivity_rate, allowed)  # fmt: skip
    row_bound = torch.minimum(row_bound, projected)

    radius_l2 = block_l2_norm(X.to(torch.float64))
    phi = _phi(norms, radius_l2, rotary)
    theta_tilde = theta_upper.amax(dim=-1)
    sensitivity = theta_tilde * phi / tau
    paper_form = norms.w_o * (norms.w_v + sensitivity).sum(dim=-1)
    radius = radius_l2 / math.sqrt(X.shape[-1]) if geometry == "rms" else radius_l2
    return MHALocalJacobianBound(
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
    )


def mha_lipschitz_upper_bound(
    Wq: Tensor,
    Wk: Tensor,
    Wv: Tensor,
    Wo: Tensor,
    *,
    tau: float,
    radius_rms: float | Tensor,
    d_model: int,
    biases: AttentionBiases | None = None,
    rotary: RotaryConfig | None = None,
) -> MHALipschitzBound:
    """Lip(MHA on {‖X‖_{∞,rms} ≤ R_rms}) ≤ ‖W_O‖ Σ_h (‖W_V^h‖ + Φ_h/τ), Φ_h with R = √d R_rms, θ = 1.

    Args:
        Wq, Wk, Wv, Wo: as in ``mha_local_jacobian_upper_bound`` (optionally batched: results gain that axis).
        tau: temperature; radius_rms: R_rms (scalar or ``[...]``); d_model: width d (must match the weights).
        biases, rotary: as in ``mha_forward`` (only ‖b_Q‖, and ‖b_K‖ under RoPE, enter).

    Returns:
        ``MHALipschitzBound``: certified Lipschitz bound in the block-∞ operator norm, independent of the sequence
        length and of masking (MATH.md T5; the ball is convex, so the sup of the local bound is a Lipschitz bound).
    """
    if Wq.ndim not in (3, 4) or Wq.shape[-1] != d_model:
        raise ShapeError(f"d_model={d_model} does not match Wq {tuple(Wq.shape)}; pass d_model = Wq.shape[-1]")
    if not tau > 0:
        raise ConfigError(f"temperature tau must be > 0, got {tau}")
    radius_rms = torch.as_tensor(radius_rms, dtype=torch.float64, device=Wq.device)
    if bool((radius_rms < 0).any()):
        raise ConfigError(f"radius_rms must be ≥ 0, got {radius_rms}")
    norms = projection_norms(Wq, Wk, Wv, Wo, biases)
    phi = _phi(norms, radius_rms * math.sqrt(d_model), rotary)
    per_head = norms.w_v + phi / tau
    return MHALipschitzBound(
        upper_bound=_combine_heads(per_head, norms.w_o, norms.w_o_head),
        paper_form_upper_bound=norms.w_o * per_head.sum(dim=-1),
        value_term=norms.w_v,
        sensitivity_term=phi / tau,
        phi=phi,
        radius_rms=radius_rms,
        norms=norms,
    )
