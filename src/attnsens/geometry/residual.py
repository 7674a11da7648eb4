"""Pre-LN vs post-LN residual Jacobians (docs/math.md T8) and the LayerNorm projection lemma's condition (T6).

Pre-LN: ∂X_{k+1}/∂X_k = I + J_k, and for the ordered product over layers ℓ…m−1, in any submultiplicative
operator norm (the block-∞ norm is one),

    ‖Π_k (I + J_k) − I − Σ_k J_k‖ ≤ Π_k (1 + ‖J_k‖) − 1 − Σ_k ‖J_k‖,

because the left side is the sum of all products of ≥ 2 distinct J_k and the right side the same sum of norms.
The right side increases in every ‖J_k‖, so certified upper bounds of the branch norms give a certified bound.

Post-LN: ∂X_{k+1}/∂X_k = J_N(Y_k)(I + J_{F_k}); the product has no identity term and its "LN-only" term is
𝒥_LN = J_N(Y_{m−1}) ⋯ J_N(Y_ℓ), tokenwise, with ‖𝒥_LN‖_{b∞} ≤ Π_k max_t ‖γ_k‖_∞/σ(y_{k,t}) (T6; σ is r for
RMSNorm). If every token satisfies σ(y_{k,t}) ≥ ‖γ_k‖_∞/ρ with ρ < 1, the LN-only term contracts like ρ^{m−ℓ}.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from attnsens._rounding import add_up, mul_up
from attnsens.errors import ConfigError
from attnsens.geometry.estimates import block_jacobian_norm_estimate
from attnsens.geometry.jacobians import norm_jacobian_spectral_norm_upper_bound
from attnsens.geometry.layers import attention_sublayer, mlp_forward, norm_forward
from attnsens.weights import LayerWeights, NormWeights


def pre_ln_expansion_remainder_upper_bound(branch_norm_upper_bounds: Tensor) -> Tensor:
    """Π_k (1 + b_k) − 1 − Σ_k b_k ≥ ‖Π_k (I + J_k) − I − Σ_k J_k‖ whenever b_k ≥ ‖J_k‖ (module docstring).

    Args:
        branch_norm_upper_bounds: ``[..., layer]`` bounds b_k ≥ 0 of the branch Jacobian norms.

    Returns:
        ``[...]`` float64 certified bound of the second-and-higher-order remainder (docs/math.md T8), every operation
        rounded up (``attnsens._rounding``).

    >>> bound = float(pre_ln_expansion_remainder_upper_bound(torch.tensor([1.0, 1.0])))  # (2·2) − 1 − 2 = 1
    >>> 1.0 <= bound < 1.0 + 2**-48  # rounded up, a few ulps above the exact value
    True
    """
    b = branch_norm_upper_bounds.to(torch.float64)
    if bool((b < 0).any()):
        raise ConfigError("branch norm bounds must be ≥ 0; pass norms, not signed values")
    # R_k = R_{k−1}(1 + b_k) + b_k S_{k−1} (S = running Σ b): nonnegative terms only, no cancellation.
    remainder = torch.zeros(b.shape[:-1], dtype=b.dtype, device=b.device)
    partial_sum = torch.zeros_like(remainder)
    for k in range(b.shape[-1]):
        remainder = add_up(mul_up(remainder, add_up(b[..., k], 1.0)), mul_up(b[..., k], partial_sum))
        partial_sum = add_up(partial_sum, b[..., k])
    return remainder


@dataclass(frozen=True, kw_only=True)
class LayerNormCondition:
    """Per-token LN contraction ratios ‖γ‖_∞/σ(y_t) (T6) and their summary.

    ratio ``[batch, query]``; satisfied_fraction, ratio_max, ratio_median ``[]``; rho: the threshold used.
    """

    ratio: Tensor
    satisfied_fraction: Tensor
    ratio_max: Tensor
    ratio_median: Tensor
    rho: float


def layernorm_condition(y: Tensor, norm: NormWeights, *, rho: float = 1.0) -> LayerNormCondition:
    """ratio_t = ‖γ‖_∞/σ(y_t) ≥ ‖J_N(y_t)‖₂ per token, and the fraction with σ(y_t) ≥ ‖γ‖_∞/ρ (ratio ≤ ρ).

    Args:
        y: ``[batch, query, d_model]`` pre-normalization residual sums.
        norm: the norm applied to them; rho: contraction threshold ρ > 0.

    Returns:
        ``LayerNormCondition`` (docs/math.md T6 sufficient condition; exact ratios, float64).
    """
    if not rho > 0:
        raise ConfigError(f"rho must be > 0, got {rho}")
    ratio = norm_jacobian_spectral_norm_upper_bound(y, norm.gamma, norm.eps, norm.kind)
    return LayerNormCondition(
        ratio=ratio,
        satisfied_fraction=(ratio <= rho).to(torch.float64).mean(),
        ratio_max=ratio.amax(),
        ratio_median=ratio.flatten().median(),
        rho=rho,
    )


def ln_only_product_upper_bound(ratio_max_per_layer: Tensor) -> Tensor:
    """‖J_N(Y_{m−1}) ⋯ J_N(Y_ℓ)‖_{b∞} ≤ Π_k max_t ‖γ_k‖_∞/σ(y_{k,t}), cumulatively over ``[..., layer]`` (T6),
    each product rounded up."""
    ratios = ratio_max_per_layer.to(torch.float64)
    products = [ratios[..., 0]] if ratios.shape[-1] else []
    for k in range(1, ratios.shape[-1]):
        products.append(mul_up(products[-1], ratios[..., k]))
    return torch.stack(products, dim=-1) if products else ratios


def _sublayers(layer: LayerWeights) -> list[tuple[Callable[[Tensor], Tensor], NormWeights]]:
    attn_norm, mlp_norm = layer.norms()
    return [
        (lambda x: attention_sublayer(x, layer.attention), attn_norm),
        (lambda x: mlp_forward(x, layer.mlp), mlp_norm),
    ]


@dataclass(frozen=True, kw_only=True)
class ResidualJacobianEstimates:
    """Lower estimates (``[batch]`` each) of block-∞ Jacobian norms at one block input, for the two arrangements
    of the same weights: pre = (I + J_F₂ J_N₂)(I + J_A J_N₁) and post = J_N₂(I + J_F₂) J_N₁(I + J_A) (T8)."""

    pre_ln_estimate: Tensor
    post_ln_estimate: Tensor
    pre_ln_branch_estimate: Tensor


def residual_jacobian_estimates(
    x: Tensor,
    layer: LayerWeights,
    *,
    iterations: int = 15,
    restarts: int = 1,
    queries: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> ResidualJacobianEstimates:
    """Estimate ‖∂X_{k+1}/∂X_k‖ at the actual block input for the pre-LN and the post-LN arrangement of the block's
    weights, and the pre-LN branch norm ‖∂X_{k+1}/∂X_k − I‖ (T8). Needs both norms (placement "pre" or "post") and
    none after the sublayers (ConfigError otherwise: such a block has no single post-LN rearrangement).

    Args:
        x: ``[batch, query, d_model]`` block input.

    Returns:
        ``ResidualJacobianEstimates``; every value is a lower estimate (``estimates`` module).
    """
    if layer.attn_norm is None or layer.mlp_norm is None:
        raise ConfigError(
            f"layer {layer.index} has no {'norms' if layer.placement == 'none' else 'attn_norm'}; pre/post-LN "
            "arrangements need attn_norm and mlp_norm"
        )
    if layer.has_out_norms:
        raise ConfigError(
            f"layer {layer.index} has norms after its sublayers (attn_out_norm/mlp_out_norm); the pre- vs post-LN "
            "comparison rearranges blocks with one norm per sublayer only"
        )
    parts = _sublayers(layer)

    def pre(z: Tensor) -> Tensor:
        for branch, norm in parts:
            z = z + branch(norm_forward(z, norm))
        return z

    def post(z: Tensor) -> Tensor:
        for branch, norm in parts:
            z = norm_forward(z + branch(z), norm)
        return z

    def estimate(block: Callable[[Tensor], Tensor]) -> Tensor:
        return block_jacobian_norm_estimate(
            block, x, iterations=iterations, restarts=restarts, queries=queries, generator=generator
        )

    return ResidualJacobianEstimates(
        pre_ln_estimate=estimate(pre),
        post_ln_estimate=estimate(post),
        pre_ln_branch_estimate=estimate(lambda z: pre(z) - z),
    )
