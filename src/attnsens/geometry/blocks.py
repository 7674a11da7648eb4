"""Lipschitz and local Jacobian bounds of positionwise maps and whole residual blocks (docs/math.md §2.7, T6, T7).

Activation constants (max_z |act'(z)|, rounded up; verified on a fine grid in the tests):
gelu (erf) 1.128905 at z = √2 (gelu'' = φ(z)(2 − z²)); gelu_tanh 1.128994 — the often-quoted 1.12899 is
below the true maximum 1.1289931 and so not a valid Lipschitz constant —; relu 1; silu 1.099840 at z ≈ 2.3994;
quick_gelu z·σ(1.702 z) is silu of y = 1.702 z divided by 1.702, so its slope is silu's slope at y, at most 1.099840.
Every one also satisfies |act(z)| ≤ |z| (act(z) = z·s(z) with s(z) ∈ [0, 1]).

relu2 (relu(z)², Nemotron, Arcee, Persimmon) has slope 2 relu(z), unbounded: it is Lipschitz on bounded sets only,
with slope at most 2 relu(ẑ + r) on [ẑ − r, ẑ + r] and at most 2 max_k(‖w_in,k‖R + |b_in,k|) over the ball
{‖x‖₂ ≤ R} of a plain MLP's inputs (Cauchy–Schwarz), which is the constant ``ffn_lipschitz_upper_bound`` gives it.
attnsens bounds it in plain MLPs only (no family gates with it).

xielu (Apertus; ``attnsens.weights.XIELUParameters``) f(z) = α_p z² + β z for z > 0, α_n(expm1(min(z, ε)) − z) + β z
for z ≤ 0 has slope 2α_p z + β for z > 0, α_n(e^z − 1) + β for z < min(ε, 0) and β − α_n on ε < z < 0: a kink at ε
(the slope steps from α_n(e^ε − 1) + β to β − α_n) and, with ε < 0, a jump of J = |α_n expm1(ε)| at 0 (f(0) =
α_n expm1(ε), f(0⁺) = 0). For z ≤ 0 the slope is β + α_n(s − 1) with s ∈ [0, 1], so it lies between β − α_n and β;
for z > 0 it is at most 2|α_p| z + |β|. On [a, b] every slope, one-sided ones at the kinks included, is at most
max(|β − α_n|, |β|) where a ≤ 0 and 2|α_p| max(b, 0) + |β| where b ≥ 0 (``xielu_slope_upper_bound``), which
bounds the Jacobian at the actual pre-activations; the values move by at most that slope times the radius, plus J
where the interval holds 0 and a positive point (the mean value theorem on each side of the jump). Unbounded for
z > 0, the slope has no global constant, and with J > 0 f is Lipschitz on no set of pre-activations across 0:
``ffn_lipschitz_upper_bound`` is infinite then, and relu2's ball constant with xielu's slopes when ε ≥ 0.

Gated maps φ(x) = W_out (a(g) ⊙ u) with g = W_gate x + b_gate, u = W_in x + b_in (SwiGLU when a = silu) are not globally
Lipschitz (the product is quadratic). Their Jacobian is W_out [diag(a'(g) ⊙ u) W_gate + diag(a(g)) W_in], so

    ‖Dφ(x)‖₂ ≤ ‖W_out‖ (Lip(a) max_k |u_k| ‖W_gate‖ + max_k |a(g_k)| ‖W_in‖),

and on the ball {‖x‖₂ ≤ R}: |u_k| ≤ ‖w_in,k‖ R + |b_in,k| and |a(g_k)| ≤ |g_k| ≤ ‖w_gate,k‖ R + |b_gate,k| (row
norms, Cauchy–Schwarz), giving
Lip(φ on the ball) ≤ ‖W_out‖ (Lip(a) ‖W_gate‖ max_k(‖w_in,k‖R + |b_in,k|) + ‖W_in‖ max_k(‖w_gate,k‖R + |b_gate,k|))
(the ball is convex, so the sup of the Jacobian norm is a Lipschitz constant). Tokenwise maps have the same
constant in the block-∞ norm (ℓ2 per token).

Block bounds. Norm outputs lie in a ball independent of the input (v1 Lemma 3.3, T6): ‖N(x)‖_rms ≤
‖γ‖_∞ + ‖β‖_rms, since ‖ẑ‖_rms ≤ 1 for LayerNorm and ‖x̂‖_rms ≤ 1 for RMSNorm. Pre-LN (T7):
Lip(block) ≤ (1 + Lip(N₁) L_MHA(R₁))(1 + Lip(N₂) L_FFN(R₂)) with Lip(N) = ‖γ‖_∞/√ε globally. The σ_min variant
of T7 is not a Lipschitz constant (the set {σ(x) ≥ σ_min} is not convex); it is used here only in local Jacobian
bounds at actual inputs, where ‖J_N(x)‖ ≤ ‖γ‖_∞/σ(x) per token is certified. A pre-LN block without N₁ (ModernBERT's
first, whose embeddings end with a norm) has attention half x + A(x): its Jacobian I + J_A has no norm factor, and
globally (1 + L_MHA(R_in))(1 + Lip(N₂) L_FFN(R₂)) holds on {‖X‖_{∞,rms} ≤ R_in}, the MLP still reading N₂'s ball.

Norms after the sublayers (``LayerWeights.attn_out_norm`` N_ao, ``mlp_out_norm`` N_mo; Gemma 2/3 with pre-norms,
OLMo 2 without). The attention half is h = x + N_ao(A(u)) with u = N₁(x) (pre) or u = x (none). Its Jacobian is
I + D_ao J_A D₁ with the tokenwise D_ao = diag_i J_{N_ao}(a_i) at the actual attention outputs a = A(u) and
D₁ = diag_t J_{N₁}(x_t) (I without N₁). A tokenwise map has block-∞ norm max_t of its per-token spectral norms, and
row i of J_A maps a perturbation of block-∞ norm ≤ 1 to one of norm ≤ ρ_i (the attention bound's per-row
``row_upper_bound``), so row i of the branch has norm ≤ ‖J_{N_ao}(a_i)‖ ρ_i max_t ‖J_{N₁}(x_t)‖ and

    ‖D_ao J_A D₁‖_{b∞} ≤ max_i (‖γ_ao‖_∞/r(a_i)) ρ_i · max_t ‖J_{N₁}(x_t)‖,

with ‖J_N(a)‖₂ ≤ ‖γ‖_∞/r(a) (σ(a) for LayerNorm; T6) evaluated at the sublayer's actual output. The MLP half
h ↦ h + N_mo(F(N₂(h))) is tokenwise, so its branch has norm ≤ max_t ‖J_{N_mo}(f_t)‖ ‖DF(g_t)‖ ‖J_{N₂}(h_t)‖ with
g = N₂(h), f = F(g): a per-token product, never above the product of the per-factor maxima. The local bound is
(1 + attention branch)(1 + MLP branch), as for the other sequential blocks. Globally Lip(N) ≤ ‖γ‖_∞/√ε enters as
one more factor of each branch: pre, (1 + Lip(N_ao) L_MHA(R₁) Lip(N₁))(1 + Lip(N_mo) L_FFN(R₂) Lip(N₂)) on all
inputs; none, (1 + Lip(N_ao) L_MHA(R_in))(1 + Lip(N_mo) L_FFN(R_mid)) on {‖X‖_{∞,rms} ≤ R_in}, where the MLP input
h = x + N_ao(A(x)) has per-token ℓ2 norm ≤ R_mid = √d (R_in + ‖γ_ao‖_∞ + ‖β_ao‖_rms) because N_ao's output lies
in its reset ball whatever A's output (T6; without N_ao, R_mid = √d R_in + the attention output radius). A
missing norm is the identity (factor 1). ``mlp_out_norm``'s output ball bounds the block output but no input of
this block, so it is not used.

Every certified number here is evaluated with ``attnsens._rounding``: spectral norms and row norms as certified
upper bounds, products and sums rounded up. The local bounds' factors after the block input are bounded over the
proved enclosures of their real arguments (``enclosures``): the float64 intermediate and its forward-error radius.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attnsens._rounding import (
    add_down,
    add_up,
    div_up,
    float_up,
    gamma,
    mul_down,
    mul_up,
    norm2_upper_bound,
    product_error_factor,
    spectral_norm_upper_bound,
    sqrt_down,
    sub_down,
    sum_lower_bound,
    sum_upper_bound,
)
from attnsens.errors import ConfigError, RouterTieError
from attnsens.geometry.attention_bounds import (
    MHALocalJacobianBounds,
    mha_lipschitz_bounds,
    mha_local_jacobian_bounds,
)
from attnsens.geometry.enclosures import Enclosure, exact, norm_enclosure, residual_sum
from attnsens.geometry.jacobians import norm_jacobian_spectral_norm_upper_bound
from attnsens.geometry.layers import activation, check_whole_block
from attnsens.geometry.norms import Geometry
from attnsens.weights import AttentionWeights, LayerWeights, MLPWeights, MoEWeights, NormWeights, XIELUParameters

ACTIVATION_LIPSCHITZ = {"gelu": 1.128905, "gelu_tanh": 1.128994, "relu": 1.0, "silu": 1.099840, "quick_gelu": 1.099840}

ACTIVATION_CURVATURE = {"gelu": 0.81, "gelu_tanh": 1.0, "silu": 0.87, "quick_gelu": 1.49}
"""max_z |act''(z)|, rounded up: gelu'' = φ(z)(2 − z²), at most 2φ(0) = 0.7979 (and z²φ(z) ≤ 2φ(√2) elsewhere);
silu'' = σ'(z)(2 − z tanh(z/2)) with σ' ≤ 1/4 and |z| tanh(|z|/2) σ'(z) ≤ |z| e^-|z| ≤ 1/e, so ≤ 0.5 + 1/e;
quick_gelu'' is 1.702 silu''(1.702 z), at most 1.702 · 0.87 = 1.4807;
the second derivative of gelu_tanh peaks at √(2/π) = 0.7979 at z = 0 (an 801-point grid on [−8, 8] plus half a
step times the largest third derivative there, 0.78, checked in the tests; outside, sech² of the argument is
below e^-25)."""

ACTIVATION_EVALUATION_ERROR = 2.0**-40
"""Absolute error, per unit of max(1, |z|), of the float64 act(z) and act'(z): a few roundings and elementary
functions accurate to a few ulps, on terms of magnitude at most 2 max(1, |z|), so a wide margin."""


def _sqrt_up(d: int) -> float:
    return math.nextafter(math.sqrt(d), math.inf)


UNBOUNDED_SLOPE = {
    "relu2": "relu2 (relu(z)²) has no global Lipschitz constant",
    "xielu": "xielu (α_p z² + β z for z > 0) has no global Lipschitz constant",
}
"""Activations whose slope grows without bound: bounded on bounded sets of pre-activations, in plain MLPs only."""


def activation_lipschitz(name: str) -> float:
    """Certified max_z |act'(z)| for gelu, gelu_tanh, relu, silu, quick_gelu (module docstring); relu2 and xielu
    have none."""
    try:
        return ACTIVATION_LIPSCHITZ[name]
    except KeyError:
        if name in UNBOUNDED_SLOPE:
            raise ConfigError(f"{UNBOUNDED_SLOPE[name]}; bound it on a bounded set of pre-activations") from None
        raise ConfigError(f"unknown activation {name!r}; expected one of {sorted(ACTIVATION_LIPSCHITZ)}") from None


def xielu_slope_upper_bound(lower: Tensor, upper: Tensor, xielu: XIELUParameters) -> Tensor:
    """≥ |f'(z)| for xIELU f at every z ∈ [lower, upper] entrywise, and ≥ both one-sided slopes at its kinks there
    (ε, and 0): max(|β − α_n|, |β|) where lower ≤ 0, max with 2|α_p| max(upper, 0) + |β| where upper ≥ 0 (module
    docstring), rounded up.

    Args:
        lower, upper: float64 interval ends, any equal shape.
        xielu: the layer's parameters.

    Returns:
        float64 tensor of the shape of ``upper``; 0 where the interval is empty.

    >>> from attnsens.weights import XIELUParameters
    >>> p = XIELUParameters(alpha_p=0.5, alpha_n=2.0, beta=0.5, eps=-1e-6)
    >>> xielu_slope_upper_bound(torch.tensor([-1.0, 1.0]), torch.tensor([-0.5, 2.0]), p)
    tensor([1.5000, 2.5000], dtype=torch.float64)
    """
    beta = abs(xielu.beta)
    negative = max(float_up(abs(xielu.beta - xielu.alpha_n)), beta)  # the slopes of z ≤ 0 lie in [β − α_n, β]
    positive = add_up(mul_up(upper.to(torch.float64).clamp_min(0.0), 2.0 * abs(xielu.alpha_p)), beta)
    zero = torch.zeros_like(positive)
    return torch.maximum(torch.where(lower <= 0, negative, zero), torch.where(upper >= 0, positive, zero))


def xielu_jump(xielu: XIELUParameters) -> float:
    """≥ |f(0) − f(0⁺)| = |α_n expm1(min(ε, 0))|, the jump of xIELU at 0 (0 when ε ≥ 0): expm1 within a few ulps,
    enlarged by 2⁻⁵⁰ relative before the product, rounded up."""
    if xielu.eps >= 0 or xielu.alpha_n == 0:  # f(0) = α_n expm1(0) = 0 = f(0⁺) exactly: no jump
        return 0.0
    exp_part = float_up(abs(math.expm1(min(xielu.eps, 0.0))) * (1.0 + 2.0**-50))
    return float_up(abs(xielu.alpha_n) * exp_part)


def _params(mlp: MLPWeights) -> XIELUParameters:
    if mlp.xielu is None:
        raise ConfigError(f"an MLP with activation {mlp.activation!r} has no xielu parameters")
    return mlp.xielu


def _slope_upper_bound(pre: Tensor, radius: Tensor, mlp: MLPWeights) -> Tensor:
    """≥ max |act'(z)| over z ∈ [ẑ − r, ẑ + r] entrywise: 2 relu(ẑ + r) for relu2, ``xielu_slope_upper_bound``
    for xielu, else the global constant."""
    if mlp.activation == "relu2":
        return 2.0 * add_up(pre, radius).clamp_min(0.0)  # doubling is exact
    if mlp.activation == "xielu":
        return xielu_slope_upper_bound(sub_down(pre, radius), add_up(pre, radius), _params(mlp))
    return torch.full_like(pre, activation_lipschitz(mlp.activation))


def _check_gated_activation(mlp: MLPWeights) -> None:
    if mlp.kind == "gated" and mlp.activation in UNBOUNDED_SLOPE:
        raise ConfigError(
            f"a gated MLP with {mlp.activation} is not bounded (attnsens bounds {mlp.activation} in plain MLPs only)"
        )


def _rows_l2(W: Tensor) -> Tensor:
    return norm2_upper_bound(W, dim=-1)


def ffn_lipschitz_upper_bound(mlp: MLPWeights | MoEWeights, *, radius_l2: float | Tensor | None = None) -> Tensor:
    """‖W_out‖ Lip(act) ‖W_in‖ (plain MLP, any input) or the gated bound on {‖x‖₂ ≤ R}; relu2's plain MLP on
    {‖x‖₂ ≤ R}: ‖W_out‖ 2 max_k(‖w_in,k‖R + |b_in,k|) ‖W_in‖, xielu's the same with its slope bound on
    |z_k| ≤ ‖w_in,k‖R + |b_in,k|, and infinite where xielu jumps at 0 (ε < 0; module docstring).

    Args:
        mlp: positionwise weights.
        radius_l2: per-token ℓ2 radius R of the input set; required for gated maps, relu2 and xielu, ignored
            otherwise.

    Returns:
        float64 certified Lipschitz bound in the block-∞ norm (docs/math.md §2.7; gated maps: extension); infinite
        for a mixture of experts, which jumps where its router's choice changes (docs/math.md T7).
    """
    if isinstance(mlp, MoEWeights):
        return torch.full_like(torch.as_tensor(0.0 if radius_l2 is None else radius_l2, dtype=torch.float64), math.inf)
    _check_gated_activation(mlp)
    w_out, w_in = spectral_norm_upper_bound(mlp.w_out), spectral_norm_upper_bound(mlp.w_in)
    if mlp.activation in UNBOUNDED_SLOPE:  # slopes at |z_k| ≤ ‖w_in,k‖R + |b_in,k| on the ball (Cauchy–Schwarz)
        if radius_l2 is None:
            raise ConfigError(f"an MLP with {mlp.activation} is only Lipschitz on a bounded set; pass radius_l2")
        R = torch.as_tensor(radius_l2, dtype=torch.float64)
        b = torch.zeros(()) if mlp.b_in is None else mlp.b_in.to(torch.float64).abs()
        reach = add_up(mul_up(_rows_l2(mlp.w_in), R[..., None]), b)
        if mlp.activation == "relu2":
            slope = 2.0 * reach.amax(dim=-1)
        elif xielu_jump(_params(mlp)) > 0:  # a jump at 0: no Lipschitz constant on a set crossing it
            return torch.full_like(mul_up(w_out, R), math.inf)
        else:
            slope = xielu_slope_upper_bound(-reach, reach, _params(mlp)).amax(dim=-1)
        return mul_up(mul_up(w_out, slope), w_in)
    lip = activation_lipschitz(mlp.activation)
    if mlp.kind != "gated":
        return mul_up(mul_up(w_out, lip), w_in)
    if radius_l2 is None:
        raise ConfigError("a gated MLP is only Lipschitz on a bounded set; pass radius_l2 (per-token ℓ2 radius)")
    R = torch.as_tensor(radius_l2, dtype=torch.float64)
    b_in = torch.zeros(()) if mlp.b_in is None else mlp.b_in.to(torch.float64).abs()
    up_max = add_up(mul_up(_rows_l2(mlp.w_in), R[..., None]), b_in).amax(dim=-1)
    b_gate = torch.zeros(()) if mlp.b_gate is None else mlp.b_gate.to(torch.float64).abs()
    gate_max = add_up(mul_up(_rows_l2(mlp.gate), R[..., None]), b_gate).amax(dim=-1)
    gate_term = mul_up(mul_up(spectral_norm_upper_bound(mlp.gate), lip), up_max)
    return mul_up(w_out, add_up(gate_term, mul_up(w_in, gate_max)))


def ffn_local_jacobian_upper_bound(
    x: Tensor, mlp: MLPWeights | MoEWeights, *, input_radius: Tensor | None = None
) -> Tensor:
    """max_t ‖Dφ(x_t)‖₂ bound from the actual pre-activations: ‖W_out‖ ‖act'(h_t)‖_∞ ‖W_in‖ (plain) or
    ‖W_out‖ (‖a'(g)⊙u‖_∞ ‖W_gate‖ + ‖a(g)‖_∞ ‖W_in‖) (gated).

    Args:
        x: ``[batch, query, d_model]`` MLP inputs.
        input_radius: as in ``ffn_token_jacobian_upper_bound``.

    Returns:
        ``[batch]`` float64 certified bound of the Jacobian's block-∞ operator norm at x.
    """
    return ffn_token_jacobian_upper_bound(x, mlp, input_radius=input_radius).amax(dim=-1)


def _pre_activation(x: Tensor, W: Tensor, b: Tensor | None, input_radius: Tensor | None) -> tuple[Tensor, Tensor]:
    """(ẑ, r) ``[batch, query, hidden]``: the float W x + b and r ≥ |z − ẑ| entrywise for the real z = W X + b,
    r = γ_{d+1}(|W||x| + |b|) (the float magnitude itself enlarged by its own rounding) plus ‖w_j‖₂ δ_t when the
    real input X is only known within ``input_radius`` δ ``[batch, query]`` of x (Cauchy–Schwarz)."""
    d_model = x.shape[-1]
    W64 = W.to(torch.float64)
    value = x @ W64.T + (0.0 if b is None else b.to(torch.float64))
    magnitude = x.abs() @ W64.abs().T + (0.0 if b is None else b.to(torch.float64).abs())
    radius = mul_up(magnitude, product_error_factor(d_model + 1))
    if input_radius is not None:
        radius = add_up(radius, mul_up(_rows_l2(W64), input_radius.to(torch.float64)[..., None]))
    return value, radius


def _activation_error(pre: Tensor, mlp: MLPWeights) -> Tensor:
    """≥ the absolute error of the float act(ẑ) and act'(ẑ) (``ACTIVATION_EVALUATION_ERROR``; relu is exact, and
    relu2 rounds once, its square, within 2⁻⁵² ẑ², its slope 2 relu(ẑ) exact). xielu's value (its slope is bounded
    from the interval alone) takes at most five roundings and one expm1 (|expm1| ≤ 1 on z ≤ 0) on terms of
    magnitude |α_p| ẑ², |α_n|(1 + |ẑ|) and |β ẑ|, so 2⁻⁴⁸ (32 units in the last place) times their sum is ample."""
    if mlp.activation == "relu":
        return torch.zeros_like(pre)
    if mlp.activation == "relu2":
        return mul_up(mul_up(pre, pre), 2.0**-52)
    if mlp.activation == "xielu":
        p, size = _params(mlp), pre.abs()
        terms = add_up(mul_up(mul_up(size, size), abs(p.alpha_p)), mul_up(size, abs(p.beta)))
        return mul_up(add_up(terms, mul_up(add_up(size, 1.0), abs(p.alpha_n))), 2.0**-48)
    return mul_up(pre.abs().clamp_min(1.0), ACTIVATION_EVALUATION_ERROR)


def ffn_token_jacobian_upper_bound(
    x: Tensor, mlp: MLPWeights | MoEWeights, *, input_radius: Tensor | None = None
) -> Tensor:
    """The per-token bounds behind ``ffn_local_jacobian_upper_bound``: ``[batch, query]`` float64, each a certified
    bound of ‖Dφ(x_t)‖₂ (the map is tokenwise, so its block-∞ norm is their max over t).

    The slopes are those of the real pre-activations z = W x + b, within r = γ_{d+1}(|W||x| + |b|) of the float
    ones ẑ: |act'(z)| ≤ min(Lip(act), |act'(ẑ)| + e(ẑ) + curvature·r), e the evaluation error
    (``ACTIVATION_EVALUATION_ERROR``, ``ACTIVATION_CURVATURE``); relu's slope is 1 wherever [ẑ − r, ẑ + r] reaches
    0 or above, relu2's is at most 2 relu(ẑ + r), xielu's ``xielu_slope_upper_bound`` on [ẑ − r, ẑ + r]. Gated
    maps bound |u| by |û| + r_u and |a(g)| by |a(ĝ)| + e + Lip(a)·r_g. With ``input_radius`` δ ``[batch, query]``
    the bound holds at every input within δ_t of x_t: r grows by ‖w_j‖₂ δ_t per unit j, and every bound above holds
    on the whole interval [ẑ − r, ẑ + r]. A mixture of experts: ``moe_token_jacobian_upper_bound``."""
    if isinstance(mlp, MoEWeights):
        return moe_token_jacobian_upper_bound(x, mlp, input_radius=input_radius)
    x64 = x.detach().to(torch.float64)
    up, up_radius = _pre_activation(x64, mlp.w_in, mlp.b_in, input_radius)
    if mlp.kind != "gated":
        pre, pre_radius = up, up_radius
    else:
        pre, pre_radius = _pre_activation(x64, mlp.gate, mlp.b_gate, input_radius)
    pre = pre.requires_grad_(True)
    with torch.enable_grad():
        (slope,) = torch.autograd.grad(activation(mlp.activation, pre, mlp.xielu).sum(), pre)
    pre = pre.detach()
    _check_gated_activation(mlp)
    error = _activation_error(pre, mlp)
    if mlp.activation == "relu":
        slope_bound = (add_up(pre, pre_radius) >= 0).to(torch.float64)
    elif mlp.activation in UNBOUNDED_SLOPE:
        slope_bound = _slope_upper_bound(pre, pre_radius, mlp)
    else:
        lip = activation_lipschitz(mlp.activation)
        moved = add_up(error, mul_up(pre_radius, ACTIVATION_CURVATURE[mlp.activation]))
        slope_bound = add_up(slope.abs(), moved).clamp_max(lip)
    w_out_norm, w_in_norm = spectral_norm_upper_bound(mlp.w_out), spectral_norm_upper_bound(mlp.w_in)
    if mlp.kind != "gated":
        return mul_up(mul_up(w_out_norm, slope_bound.amax(dim=-1)), w_in_norm)
    gate_slopes = mul_up(slope_bound, add_up(up.abs(), up_radius)).amax(dim=-1)
    gate_term = mul_up(gate_slopes, spectral_norm_upper_bound(mlp.gate))
    values = activation(mlp.activation, pre, mlp.xielu).abs()
    value_bound = add_up(add_up(values, error), mul_up(pre_radius, activation_lipschitz(mlp.activation)))
    up_term = mul_up(value_bound.amax(dim=-1), w_in_norm)
    return mul_up(w_out_norm, add_up(gate_term, up_term))


def mlp_enclosure(x: Enclosure, mlp: MLPWeights | MoEWeights) -> Enclosure:
    """The float64 MLP output at x̂ (the operations of ``layers.mlp_forward``) and a radius ≥ ‖φ(X)_t − φ̂_t‖₂ for
    every real X within ``x.radius`` of ``x.value``.

    With r the pre-activations' radius (``_pre_activation``) and e the activation's evaluation error, the hidden
    units are within ε_j = Lip(act) r_j + e_j of the float ones (plain), or, for h = a(g) u,
    |a(g)u − fl(â û)| ≤ (Lip(a) r^g_j + e_j)(|û_j| + r^u_j) + |â_j| r^u_j + γ₁|ĥ_j| (gated); relu2 and xielu take
    their slope bound on [û − r, û + r] for Lip(act), and xielu adds its jump J where that interval holds 0 and a
    positive point (module docstring). The output projection
    maps them to ≤ ‖W_out‖ ‖ε‖₂ and adds its own rounding γ_{k+1}‖|W_out||ĥ| + |b_out|‖ (k hidden units).

    Raises:
        ConfigError: a mixture of experts, whose output is not enclosed (a block that needs it, post-LN or with a
            norm after the MLP, is not bounded with one).
    """
    if isinstance(mlp, MoEWeights):
        raise ConfigError(
            "the output of a mixture of experts is not enclosed: a post-LN block or a norm after the MLP with one "
            "is not bounded (pre-LN blocks without that norm are)"
        )
    x64, radius = x.value, x.radius_or_none
    _check_gated_activation(mlp)
    up, up_radius = _pre_activation(x64, mlp.w_in, mlp.b_in, radius)
    if mlp.kind == "gated":
        lip = activation_lipschitz(mlp.activation)
        gate, gate_radius = _pre_activation(x64, mlp.gate, mlp.b_gate, radius)
        gated = activation(mlp.activation, gate)
        hidden = gated * up
        gate_error = add_up(mul_up(gate_radius, lip), _activation_error(gate, mlp))
        hidden_error = add_up(
            add_up(mul_up(gate_error, add_up(up.abs(), up_radius)), mul_up(gated.abs(), up_radius)),
            mul_up(hidden.abs(), gamma(1)),
        )
    else:
        hidden = activation(mlp.activation, up, mlp.xielu)
        slope = _slope_upper_bound(up, up_radius, mlp)  # over [û − r, û + r]: the mean value theorem
        hidden_error = add_up(mul_up(up_radius, slope), _activation_error(up, mlp))
        if mlp.activation == "xielu":  # f jumps at 0: a real z on the other side of it moves by J more
            crosses = (sub_down(up, up_radius) <= 0) & (add_up(up, up_radius) > 0)
            hidden_error = add_up(hidden_error, crosses.to(torch.float64) * xielu_jump(_params(mlp)))  # J or 0
    w_out = mlp.w_out.to(torch.float64)
    value = hidden @ w_out.T
    magnitude = hidden.abs() @ w_out.abs().T
    if mlp.b_out is not None:
        value = value + mlp.b_out.to(torch.float64)
        magnitude = magnitude + mlp.b_out.to(torch.float64).abs()
    rounding = mul_up(norm2_upper_bound(magnitude), product_error_factor(hidden.shape[-1] + 1))
    moved = mul_up(spectral_norm_upper_bound(mlp.w_out), norm2_upper_bound(hidden_error))
    return Enclosure(value, add_up(moved, rounding))


EXP_RELATIVE_ERROR = 2.0**-40
"""Relative error of the float64 exp and sigmoid: correctly rounded to within a few units in the last place
(2⁻⁵²), so a wide margin."""


@dataclass(frozen=True, kw_only=True)
class CertifiedRouting:
    """The router of a mixture of experts over a ball of inputs, its choice certified (``moe_certified_routing``).

    selected ``[batch, query, top_k]``: S, the same at every input of the ball; gate_upper ``[batch, query, top_k]``:
    ≥ g_e over the ball for e ∈ S (in S's order), and ≥ every weight of the softmax the gates come from.
    """

    selected: Tensor
    gate_upper: Tensor


def moe_certified_routing(x: Tensor, moe: MoEWeights, *, input_radius: Tensor | None = None) -> CertifiedRouting:
    """S = the top-k of ℓ = W_r x, certified constant on the ball: min_{e∈S} ℓ_e > max_{f∉S} ℓ_f for every real
    input within ``input_radius`` δ_t of x_t, from the logits' enclosures ℓ̂ ± ρ (``_pre_activation``: rounding
    plus ‖w_e‖₂ δ_t); and g_e ≤ 1/(1 + Σ_{f∈P, f≠e} exp(ℓ_f⁻ − ℓ_e⁺)) over the ball, P the experts the softmax runs
    over (S for "topk_softmax", all for "softmax"), ℓ⁻ and ℓ⁺ the ends of the enclosures (docs/math.md T7).

    Args:
        x: ``[batch, query, d_model]`` MoE inputs; input_radius: ``[batch, query]`` or None (x exact).

    Raises:
        RouterTieError: a token whose k-th and (k+1)-th logits are not certified apart, named with its experts.
    """
    x64 = x.detach().to(torch.float64)
    logits, radius = _pre_activation(x64, moe.router, None, input_radius)
    low, high = sub_down(logits, radius), add_up(logits, radius)
    order = logits.topk(min(moe.top_k + 1, moe.n_expert), dim=-1).indices
    selected = order[..., : moe.top_k]
    if moe.top_k < moe.n_expert:
        chosen_low = low.gather(-1, selected).amin(dim=-1)
        others_high = high.scatter(-1, selected, -math.inf).amax(dim=-1)
        tied = ~(chosen_low > others_high)
        if bool(tied.any()):
            b, t = (int(i) for i in tied.nonzero()[0])
            kth, next_ = int(order[b, t, -2]), int(order[b, t, -1])
            gap = float(logits[b, t, kth] - logits[b, t, next_])
            raise RouterTieError(
                f"router tie at token {t} of sequence {b}: the logits of experts {kth} (the last of its top "
                f"{moe.top_k}) and {next_} (the first left out) lie {gap:.3g} apart, within their certified error "
                f"{float(radius[b, t, kth] + radius[b, t, next_]):.3g}; the router's choice there is not certified, "
                "so no local bound of a fixed choice holds"
            )
    pool = torch.ones_like(logits, dtype=torch.bool)
    if moe.gate_mode == "topk_softmax":
        pool = torch.zeros_like(pool).scatter(-1, selected, True)
    others = pool.unsqueeze(-2) & (torch.arange(moe.n_expert, device=x64.device) != selected.unsqueeze(-1))
    exponent = sub_down(low.unsqueeze(-2), high.gather(-1, selected).unsqueeze(-1))  # [batch, query, k, expert]
    terms = torch.where(others, mul_down(torch.exp(exponent), 1.0 - EXP_RELATIVE_ERROR), 0.0)
    gate_upper = div_up(torch.ones_like(exponent[..., 0]), add_down(sum_lower_bound(terms), 1.0))
    return CertifiedRouting(selected=selected, gate_upper=gate_upper)


def moe_token_jacobian_upper_bound(x: Tensor, moe: MoEWeights, *, input_radius: Tensor | None = None) -> Tensor:
    """``[batch, query]`` certified bounds of ‖D MoE(x_t)‖₂ with the router's choice S certified constant around
    x_t (``moe_certified_routing``), over every input within ``input_radius`` δ_t of x_t (docs/math.md T7):

        D MoE = Σ_{e∈S} g_e J_{E_e} + Σ_{e∈S} E_e ∇g_eᵀ (+ σ(w_s·x) J_{E_s} + E_s σ'(w_s·x) w_sᵀ),

    ‖Σ_e g_e J_{E_e}‖ ≤ min(Σ_e ḡ_e B_e, max_e B_e) (Σ_e g_e ≤ 1) with B_e each expert's
    ``ffn_token_jacobian_upper_bound``; the gates' motion Σ_e E_e ∇g_eᵀ = V_S R_S (diag q − q qᵀ) W_P, q the softmax
    over the pool P with router rows W_P, V_S = [E_e]_{e∈S}, R_S S's rows of the pool, has norm
    ≤ ‖V_S‖_F min(max_e q̄_e, ½) ‖W_P‖ (‖W_P‖ ≤ min(‖W_r‖, ‖W_S‖_F) for P = S), ‖E_e‖ bounded by ``mlp_enclosure``;
    the shared expert adds σ̄ B_s + ‖E_s‖ σ̄' ‖w_s‖, σ̄ and σ̄' (≤ ¼) the sigmoid's largest value and slope on the
    enclosure of w_s·x.

    Raises:
        RouterTieError: the router's choice is not certified at some token (``moe_certified_routing``).
    """
    x64 = x.detach().to(torch.float64)
    routing = moe_certified_routing(x64, moe, input_radius=input_radius)
    ball = exact(x64) if input_radius is None else Enclosure(x64, input_radius.to(torch.float64))
    jacobians = torch.zeros((*routing.selected.shape[:-1], moe.n_expert), dtype=torch.float64, device=x64.device)
    sizes = torch.zeros_like(jacobians)  # [batch, query, expert]; only the experts some token selects are read
    for e in routing.selected.unique().tolist():
        jacobians[..., e] = ffn_token_jacobian_upper_bound(x64, moe.experts[e], input_radius=input_radius)
        sizes[..., e] = _output_norm_upper_bound(ball, moe.experts[e])
    chosen = jacobians.gather(-1, routing.selected)
    experts_term = torch.minimum(sum_upper_bound(mul_up(routing.gate_upper, chosen)), chosen.amax(dim=-1))
    router_norm = spectral_norm_upper_bound(moe.router)
    if moe.gate_mode == "topk_softmax":  # W_P = W_S, the selected rows
        router_norm = torch.minimum(router_norm, norm2_upper_bound(_rows_l2(moe.router)[routing.selected]))
    spread = routing.gate_upper.amax(dim=-1).clamp_max(0.5)  # ‖diag q − q qᵀ‖₂ ≤ min(max q, ½)
    motion = mul_up(mul_up(norm2_upper_bound(sizes.gather(-1, routing.selected)), spread), router_norm)
    bound = add_up(experts_term, motion)
    if moe.shared is None or moe.shared_gate is None:
        return bound
    logit, logit_radius = _pre_activation(x64, moe.shared_gate[None], None, input_radius)
    low, high = sub_down(logit, logit_radius)[..., 0], add_up(logit, logit_radius)[..., 0]
    gate = mul_up(torch.sigmoid(high), 1.0 + EXP_RELATIVE_ERROR).clamp_max(1.0)
    # σ'(z) = e^{-|z|}/(1 + e^{-|z|})², largest at the point of [z⁻, z⁺] nearest 0 (no cancellation in this form)
    nearest = torch.where(low > 0, low, torch.where(high < 0, -high, 0.0))
    decay = torch.exp(-nearest)
    slope = mul_up(decay / (1.0 + decay).square(), 1.0 + EXP_RELATIVE_ERROR).clamp_max(0.25)
    shared = mul_up(gate, ffn_token_jacobian_upper_bound(x64, moe.shared, input_radius=input_radius))
    size = _output_norm_upper_bound(ball, moe.shared)
    gate_motion = mul_up(mul_up(size, slope), norm2_upper_bound(moe.shared_gate))
    return add_up(bound, add_up(shared, gate_motion))


def _output_norm_upper_bound(x: Enclosure, mlp: MLPWeights) -> Tensor:
    """``[batch, query]``: ≥ ‖φ(X)_t‖₂ for every real X within ``x.radius`` of ``x.value`` (``mlp_enclosure``)."""
    enclosure = mlp_enclosure(x, mlp)
    return add_up(norm2_upper_bound(enclosure.value), enclosure.radius)


def norm_output_radius_rms(norm: NormWeights) -> Tensor:
    """‖N(x)‖_rms ≤ ‖γ‖_∞ + ‖β‖_rms for every x (v1 Lemma 3.3, docs/math.md T6)."""
    gamma_max = norm.gamma.to(torch.float64).abs().amax()
    if norm.beta is None:
        return gamma_max
    beta = norm.beta.to(torch.float64)
    return add_up(gamma_max, div_up(norm2_upper_bound(beta.flatten()), math.nextafter(math.sqrt(beta.numel()), 0.0)))


def norm_lipschitz_upper_bound(norm: NormWeights) -> Tensor:
    """Lip(N) ≤ ‖γ‖_∞/√ε for LayerNorm and RMSNorm (docs/math.md T6); infinite when ε = 0."""
    gamma_max = norm.gamma.to(torch.float64).abs().amax()
    if not norm.eps > 0:
        return torch.full_like(gamma_max, math.inf)
    return div_up(gamma_max, sqrt_down(torch.tensor(float(norm.eps), dtype=torch.float64)))


def attention_output_radius_l2(attention: AttentionWeights, radius_l2: Tensor) -> Tensor:
    """max_i ‖MHA(X)_i‖₂ ≤ ‖W_O‖ (Σ_h (‖W_V^h‖R + ‖b_V^h‖)²)^{1/2} + ‖b_O‖ (outputs are convex mixes of values)."""
    per_head = attention.per_query_head()
    w_v = spectral_norm_upper_bound(per_head.w_v)
    b_v = torch.zeros_like(w_v) if per_head.b_v is None else norm2_upper_bound(per_head.b_v, dim=-1)
    b_o = 0.0 if attention.b_o is None else norm2_upper_bound(attention.b_o)
    head_radii = add_up(mul_up(w_v, radius_l2), b_v)
    return add_up(mul_up(spectral_norm_upper_bound(attention.w_o), norm2_upper_bound(head_radii)), b_o)


def attention_lipschitz(attention: AttentionWeights, radius_l2: Tensor) -> Tensor:
    """``mha_lipschitz_bounds`` of a sublayer on the ℓ2 ball of radius R."""
    radius_rms = div_up(radius_l2, math.nextafter(math.sqrt(attention.d_model), 0.0))
    return mha_lipschitz_bounds(attention, radius_rms=radius_rms).upper_bound


@dataclass(frozen=True, kw_only=True)
class BlockLipschitzBound:
    """Certified Lipschitz bound of one block in the block-∞ norm with its factors (docs/math.md T7), float64.

    A norm the block does not have counts as 1: attn_norm_lipschitz and mlp_norm_lipschitz for placement "none",
    attn_out_norm_lipschitz and mlp_out_norm_lipschitz for a block without norms after its sublayers.
    """

    upper_bound: Tensor
    attention_lipschitz: Tensor
    ffn_lipschitz: Tensor
    attn_norm_lipschitz: Tensor
    mlp_norm_lipschitz: Tensor
    attn_out_norm_lipschitz: Tensor
    mlp_out_norm_lipschitz: Tensor


def block_lipschitz_upper_bound(layer: LayerWeights, *, input_radius_rms: float | None = None) -> BlockLipschitzBound:
    """Pre-LN: (1 + Lip(N₁) L_MHA)(1 + Lip(N₂) L_FFN) on all inputs (T7); post-LN / DeepNorm:
    Lip(N₂)(α + L_FFN) Lip(N₁)(α + L_MHA), no-norm: (1 + L_FFN)(1 + L_MHA) and pre-LN without N₁:
    (1 + L_MHA)(1 + Lip(N₂) L_FFN), all three on {‖X‖_{∞,rms} ≤ R_in}. Norms after the sublayers multiply their
    branch by Lip(N_ao), Lip(N_mo) (module docstring).

    Args:
        layer: the block's weights.
        input_radius_rms: R_in, required where the attention sees the raw input ("post", "none", and "pre"
            without attn_norm).

    Returns:
        ``BlockLipschitzBound`` (docs/math.md T7; post/none placements and norms after the sublayers: the same
        chain rule on the stated ball).
    """
    check_whole_block(layer)
    d = layer.attention.d_model
    one = torch.ones((), dtype=torch.float64)

    def lipschitz_or_one(norm: NormWeights | None) -> Tensor:
        return one if norm is None else norm_lipschitz_upper_bound(norm)

    n_ao, n_mo = lipschitz_or_one(layer.attn_out_norm), lipschitz_or_one(layer.mlp_out_norm)

    def result(bound: Tensor, lip_attn: Tensor, lip_ffn: Tensor, n1: Tensor, n2: Tensor) -> BlockLipschitzBound:
        return BlockLipschitzBound(
            upper_bound=bound,
            attention_lipschitz=lip_attn,
            ffn_lipschitz=lip_ffn,
            attn_norm_lipschitz=n1,
            mlp_norm_lipschitz=n2,
            attn_out_norm_lipschitz=n_ao,
            mlp_out_norm_lipschitz=n_mo,
        )

    def times_out(value: Tensor, norm: NormWeights | None, lipschitz: Tensor) -> Tensor:
        """``value`` times the Lipschitz bound of a norm after the sublayer, rounded up (as is without one)."""
        return value if norm is None else mul_up(value, lipschitz)

    if layer.placement == "pre" and layer.attn_norm is not None:
        attn_norm, mlp_norm = layer.norms()
        r_attn = mul_up(norm_output_radius_rms(attn_norm), _sqrt_up(d))
        r_mlp = mul_up(norm_output_radius_rms(mlp_norm), _sqrt_up(d))
        lip_attn = attention_lipschitz(layer.attention, r_attn)
        lip_ffn = ffn_lipschitz_upper_bound(layer.mlp, radius_l2=r_mlp)
        n1, n2 = norm_lipschitz_upper_bound(attn_norm), norm_lipschitz_upper_bound(mlp_norm)
        # A parallel block X + A(N1 X) + F(N2 X) has Jacobian I + J_A J_N1 + J_F J_N2: no cross term.
        if layer.parallel_residual:
            bound = add_up(add_up(mul_up(n1, lip_attn), mul_up(n2, lip_ffn)), 1.0)
        else:
            first = add_up(times_out(mul_up(n1, lip_attn), layer.attn_out_norm, n_ao), 1.0)
            bound = mul_up(first, add_up(times_out(mul_up(n2, lip_ffn), layer.mlp_out_norm, n_mo), 1.0))
        return result(bound, lip_attn, lip_ffn, n1, n2)
    if input_radius_rms is None:
        raise ConfigError(
            f"placement {layer.placement!r}{' without attn_norm' if layer.placement == 'pre' else ''} needs "
            "input_radius_rms (attention reads the raw input)"
        )
    r_in = mul_up(torch.as_tensor(input_radius_rms, dtype=torch.float64), _sqrt_up(d))
    lip_attn = attention_lipschitz(layer.attention, r_in)
    if layer.placement == "pre":  # no N1: X + A(X), then + F(N2 ·), N2's output in its reset ball (T6)
        mlp_norm = layer.mlp_pre_norm()
        lip_ffn = ffn_lipschitz_upper_bound(layer.mlp, radius_l2=mul_up(norm_output_radius_rms(mlp_norm), _sqrt_up(d)))
        n2 = norm_lipschitz_upper_bound(mlp_norm)
        first = add_up(times_out(lip_attn, layer.attn_out_norm, n_ao), 1.0)
        bound = mul_up(first, add_up(times_out(mul_up(n2, lip_ffn), layer.mlp_out_norm, n_mo), 1.0))
        return result(bound, lip_attn, lip_ffn, one, n2)
    if layer.placement == "post":
        alpha = layer.residual_scale
        attn_norm, mlp_norm = layer.norms()
        r_mlp = mul_up(norm_output_radius_rms(attn_norm), _sqrt_up(d))
        lip_ffn = ffn_lipschitz_upper_bound(layer.mlp, radius_l2=r_mlp)
        n1, n2 = norm_lipschitz_upper_bound(attn_norm), norm_lipschitz_upper_bound(mlp_norm)
        bound = mul_up(mul_up(n2, add_up(lip_ffn, alpha)), mul_up(n1, add_up(lip_attn, alpha)))
        return result(bound, lip_attn, lip_ffn, n1, n2)
    if layer.attn_out_norm is None:
        r_mlp = add_up(r_in, attention_output_radius_l2(layer.attention, r_in))
    else:  # x + N_ao(A(x)): N_ao's output lies in its reset ball whatever A(x) is (T6)
        r_mlp = add_up(r_in, mul_up(norm_output_radius_rms(layer.attn_out_norm), _sqrt_up(d)))
    lip_ffn = ffn_lipschitz_upper_bound(layer.mlp, radius_l2=r_mlp)
    first = add_up(times_out(lip_attn, layer.attn_out_norm, n_ao), 1.0)
    bound = mul_up(add_up(times_out(lip_ffn, layer.mlp_out_norm, n_mo), 1.0), first)
    return result(bound, lip_attn, lip_ffn, one, one)


def _attention_local_jacobian_bounds(
    u: Enclosure, attention: AttentionWeights, geometry: Geometry = "rms"
) -> MHALocalJacobianBounds:
    """The local attention bound on the ball of ``u`` (at u's value when it is exact)."""
    return mha_local_jacobian_bounds(u.value, attention, geometry=geometry, input_radius=u.radius_or_none)


def _attention_output(bound: MHALocalJacobianBounds) -> Enclosure:
    return Enclosure(bound.output, bound.output_radius)


def _norm_tokens(x: Enclosure, norm: NormWeights) -> Tensor:
    """``[batch, query]``: ‖J_N‖₂ ≤ ‖γ‖_∞/σ per token over the ball of ``x`` (docs/math.md T6)."""
    return norm_jacobian_spectral_norm_upper_bound(
        x.value, norm.gamma, norm.eps, norm.kind, input_radius=x.radius_or_none
    )


def _norm_local(x: Enclosure, norm: NormWeights) -> Tensor:
    return _norm_tokens(x, norm).amax(dim=-1)


def _ffn_local(x: Enclosure, mlp: MLPWeights | MoEWeights) -> Tensor:
    return ffn_local_jacobian_upper_bound(x.value, mlp, input_radius=x.radius_or_none)


@dataclass(frozen=True, kw_only=True)
class BlockLocalJacobianBounds:
    """Certified bound of one block's Jacobian at its input, with the attention factor it was built from.

    upper_bound ``[batch]``; attention: the ``MHALocalJacobianBounds`` of the attention sublayer at attention_input
    ``[batch, query, d_model]`` (float64), the point the chain rule evaluates it at (N₁ of the block input for
    pre-LN and parallel blocks, the block input itself otherwise). A caller that also reports the attention
    bound reads it here instead of computing it a second time. mlp_input: the enclosure of the MLP's real input
    (``enclosures.Enclosure``), for a caller that needs a certified radius of it.
    """

    upper_bound: Tensor
    attention: MHALocalJacobianBounds
    attention_input: Tensor
    mlp_input: Enclosure


def block_local_jacobian_upper_bound(x: Tensor, layer: LayerWeights) -> Tensor:
    """``block_local_jacobian_bounds(x, layer).upper_bound``: the certified ``[batch]`` bound alone."""
    return block_local_jacobian_bounds(x, layer).upper_bound


def block_local_jacobian_bounds(
    x: Tensor, layer: LayerWeights, *, geometry: Geometry = "rms"
) -> BlockLocalJacobianBounds:
    """Certified bound of ‖D block(X)‖_{b∞→b∞} at X from local factor bounds and the chain rule.

    pre: (1 + ‖J_N₂‖‖J_F‖)(1 + ‖J_N₁‖‖J_A‖), the factor ‖J_N₁‖ dropped without N₁; parallel pre:
    1 + ‖J_N₁‖‖J_A‖ + ‖J_N₂‖‖J_F‖;
    post: ‖J_N₂(αY + F(Y))‖(α + ‖J_F‖) ‖J_N₁(αX + A(X))‖(α + ‖J_A‖);
    none: (1 + ‖J_F‖)(1 + ‖J_A‖), every factor bounded at the point where it is evaluated. With norms after the
    sublayers (pre or none), each branch gains ‖J_N_out‖ at the sublayer's actual output, taken row by row with the
    attention bound's rows and token by token with the FFN's (module docstring).

    x is exact; every later factor is bounded over a proved enclosure of its real argument (N₁(x), x + A(·), …),
    the float64 intermediate and its forward-error radius (``enclosures``, docs/architecture.md "Rounding").

    Args:
        x: ``[batch, query, d_model]`` block input.
        geometry: convention of the attention bound's reported radius (the operator norms do not depend on it).

    Returns:
        ``BlockLocalJacobianBounds``: the ``[batch]`` float64 certified bound (docs/math.md T4–T8 combined) and the
        attention factor's own bound.

    Raises:
        ConfigError: a layer with a branch beside its attention (``layers.check_whole_block``); its attention
            alone is bounded by ``pre_norm_attention_local_jacobian_bounds``.
    """
    check_whole_block(layer)
    x0 = exact(x)
    if layer.has_out_norms:
        return _out_norm_block_local_jacobian_bounds(x0, layer, geometry)
    if layer.placement == "none":
        attention = _attention_local_jacobian_bounds(x0, layer.attention, geometry)
        y = residual_sum(x0, _attention_output(attention))
        bound = mul_up(add_up(attention.upper_bound, 1.0), add_up(_ffn_local(y, layer.mlp), 1.0))
        return BlockLocalJacobianBounds(upper_bound=bound, attention=attention, attention_input=x0.value, mlp_input=y)
    if layer.placement == "pre" and layer.attn_norm is None:  # (1 + ‖J_N₂‖‖J_F‖)(1 + ‖J_A‖): A reads X itself
        attention = _attention_local_jacobian_bounds(x0, layer.attention, geometry)
        y = residual_sum(x0, _attention_output(attention))
        mlp_norm = layer.mlp_pre_norm()
        g = norm_enclosure(y, mlp_norm)
        second = add_up(mul_up(_norm_local(y, mlp_norm), _ffn_local(g, layer.mlp)), 1.0)
        return BlockLocalJacobianBounds(
            upper_bound=mul_up(add_up(attention.upper_bound, 1.0), second),
            attention=attention,
            attention_input=x0.value,
            mlp_input=g,
        )
    attn_norm, mlp_norm = layer.norms()
    if layer.parallel_residual:
        h_attn, h_mlp = norm_enclosure(x0, attn_norm), norm_enclosure(x0, mlp_norm)
        attention = _attention_local_jacobian_bounds(h_attn, layer.attention, geometry)
        attn = mul_up(_norm_local(x0, attn_norm), attention.upper_bound)
        ffn = mul_up(_norm_local(x0, mlp_norm), _ffn_local(h_mlp, layer.mlp))
        return BlockLocalJacobianBounds(
            upper_bound=add_up(add_up(attn, ffn), 1.0),
            attention=attention,
            attention_input=h_attn.value,
            mlp_input=h_mlp,
        )
    if layer.placement == "pre":
        h = norm_enclosure(x0, attn_norm)
        attention = _attention_local_jacobian_bounds(h, layer.attention, geometry)
        first = add_up(mul_up(_norm_local(x0, attn_norm), attention.upper_bound), 1.0)
        y = residual_sum(x0, _attention_output(attention))
        g = norm_enclosure(y, mlp_norm)
        second = add_up(mul_up(_norm_local(y, mlp_norm), _ffn_local(g, layer.mlp)), 1.0)
        return BlockLocalJacobianBounds(
            upper_bound=mul_up(first, second), attention=attention, attention_input=h.value, mlp_input=g
        )
    attention = _attention_local_jacobian_bounds(x0, layer.attention, geometry)
    alpha = layer.residual_scale
    s1 = residual_sum(x0, _attention_output(attention), alpha)
    first = mul_up(_norm_local(s1, attn_norm), add_up(attention.upper_bound, abs(alpha)))
    y = norm_enclosure(s1, attn_norm)
    s2 = residual_sum(y, mlp_enclosure(y, layer.mlp), alpha)
    second = mul_up(_norm_local(s2, mlp_norm), add_up(_ffn_local(y, layer.mlp), abs(alpha)))
    return BlockLocalJacobianBounds(
        upper_bound=mul_up(first, second), attention=attention, attention_input=x0.value, mlp_input=y
    )


def pre_norm_attention_local_jacobian_bounds(
    x: Tensor, layer: LayerWeights, *, geometry: Geometry = "rms"
) -> tuple[MHALocalJacobianBounds, Tensor]:
    """The attention sublayer's local bound of a "pre" layer with N₁ at N₁ of the exact block input ``x``, over the
    enclosure of its real value, and that float64 input ``[batch, query, d_model]``: the attention factor of
    ``block_local_jacobian_bounds``, computed alone where the block is not the layer's (``beside_attention``)."""
    if layer.placement != "pre" or layer.attn_norm is None or layer.parallel_residual:
        raise ConfigError(f"layer {layer.index}: the attention's own bound here needs a 'pre' layer with N1")
    h = norm_enclosure(exact(x), layer.attn_norm)
    return _attention_local_jacobian_bounds(h, layer.attention, geometry), h.value


def _out_norm_block_local_jacobian_bounds(
    x: Enclosure, layer: LayerWeights, geometry: Geometry
) -> BlockLocalJacobianBounds:
    """(1 + max_i ‖J_N_ao(a_i)‖ ρ_i · max_t ‖J_N₁(x_t)‖)(1 + max_t ‖J_N_mo(f_t)‖ ‖DF(g_t)‖ ‖J_N₂(h_t)‖) for a
    "pre" or "none" block with norms after its sublayers (module docstring; a missing norm is a factor 1), every
    factor bounded over the enclosure of its real argument (``enclosures``)."""
    attn_norm, mlp_norm = layer.attn_norm, layer.mlp_norm  # either may be None: a factor 1
    u = x if attn_norm is None else norm_enclosure(x, attn_norm)
    attention = _attention_local_jacobian_bounds(u, layer.attention, geometry)
    a = _attention_output(attention)
    rows = attention.row_upper_bound  # [batch, query]: row i's bound per unit block-∞ input
    if layer.attn_out_norm is not None:
        rows = mul_up(_norm_tokens(a, layer.attn_out_norm), rows)
        a = norm_enclosure(a, layer.attn_out_norm)
    attn_branch = rows.amax(dim=-1)
    if attn_norm is not None:
        attn_branch = mul_up(attn_branch, _norm_local(x, attn_norm))
    h = residual_sum(x, a)
    g = h if mlp_norm is None else norm_enclosure(h, mlp_norm)
    tokens = ffn_token_jacobian_upper_bound(g.value, layer.mlp, input_radius=g.radius_or_none)  # [batch, query]
    if layer.mlp_out_norm is not None:
        tokens = mul_up(_norm_tokens(mlp_enclosure(g, layer.mlp), layer.mlp_out_norm), tokens)
    if mlp_norm is not None:
        tokens = mul_up(tokens, _norm_tokens(h, mlp_norm))
    bound = mul_up(add_up(attn_branch, 1.0), add_up(tokens.amax(dim=-1), 1.0))
    return BlockLocalJacobianBounds(upper_bound=bound, attention=attention, attention_input=u.value, mlp_input=g)
