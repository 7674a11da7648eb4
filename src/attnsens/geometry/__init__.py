"""Block-∞/RMS geometry: norms, Jacobians and certified bounds for attention, normalization and blocks.

Pure functions of tensors and weights (docs/math.md §2.5–§5). A certified bound returned as a number ends in
``_upper_bound``; a function returning several bounds in a dataclass is named for it (``mha_local_jacobian_bounds``
returns ``MHALocalJacobianBounds``); empirical values from autograd end in ``_estimate`` and are lower bounds of the
quantity they estimate. The primary norm
convention is the RMS variant ‖X‖_{∞,rms} = max_i ‖x_i‖₂/√d; the ℓ2 variant max_i ‖x_i‖₂ is available.
"""

from __future__ import annotations

from attnsens.geometry.attention import (
    AttentionBiases,
    AttentionForward,
    apply_rotary,
    causal_mask,
    mha_forward,
    window_mask,
)
from attnsens.geometry.attention_bounds import (
    MHALipschitzBounds,
    MHALocalJacobianBounds,
    ProjectionNormBounds,
    mha_lipschitz_bounds,
    mha_local_jacobian_bounds,
    projection_norm_bounds,
)
from attnsens.geometry.blocks import (
    BlockLocalJacobianBounds,
    activation_lipschitz,
    block_lipschitz_upper_bound,
    block_local_jacobian_bounds,
    block_local_jacobian_upper_bound,
    ffn_lipschitz_upper_bound,
    ffn_local_jacobian_upper_bound,
    norm_lipschitz_upper_bound,
    norm_output_radius_rms,
    pre_norm_attention_local_jacobian_bounds,
)
from attnsens.geometry.estimates import block_jacobian_norm_estimate, spectral_jacobian_norm_estimate
from attnsens.geometry.jacobians import (
    layernorm_jacobian,
    norm_jacobian_spectral_norm_upper_bound,
    rmsnorm_jacobian,
    softmax_jacobian,
    softmax_jacobian_inf_to_inf_norm,
    softmax_jacobian_spectral_norm,
)
from attnsens.geometry.layers import block_forward, mlp_forward, norm_forward, residual_stream
from attnsens.geometry.norms import (
    block_l2_norm,
    block_rms_norm,
    spectral_norm,
    token_mixing_operator_norm,
    tokenwise_linear_operator_norm,
)
from attnsens.geometry.residual import (
    layernorm_condition,
    ln_only_product_upper_bound,
    pre_ln_expansion_remainder_upper_bound,
    residual_jacobian_estimates,
)
from attnsens.geometry.scaling import deepnet_constants, depth_scale_heuristic, quartic_path_norm_product

__all__ = [
    "AttentionBiases",
    "AttentionForward",
    "BlockLocalJacobianBounds",
    "MHALipschitzBounds",
    "MHALocalJacobianBounds",
    "ProjectionNormBounds",
    "activation_lipschitz",
    "apply_rotary",
    "block_forward",
    "block_jacobian_norm_estimate",
    "block_l2_norm",
    "block_lipschitz_upper_bound",
    "block_local_jacobian_bounds",
    "block_local_jacobian_upper_bound",
    "block_rms_norm",
    "causal_mask",
    "deepnet_constants",
    "depth_scale_heuristic",
    "ffn_lipschitz_upper_bound",
    "ffn_local_jacobian_upper_bound",
    "layernorm_condition",
    "layernorm_jacobian",
    "ln_only_product_upper_bound",
    "mha_forward",
    "mha_lipschitz_bounds",
    "mha_local_jacobian_bounds",
    "mlp_forward",
    "norm_forward",
    "norm_jacobian_spectral_norm_upper_bound",
    "norm_lipschitz_upper_bound",
    "norm_output_radius_rms",
    "pre_ln_expansion_remainder_upper_bound",
    "pre_norm_attention_local_jacobian_bounds",
    "projection_norm_bounds",
    "quartic_path_norm_product",
    "residual_jacobian_estimates",
    "residual_stream",
    "rmsnorm_jacobian",
    "softmax_jacobian",
    "softmax_jacobian_inf_to_inf_norm",
    "softmax_jacobian_spectral_norm",
    "spectral_jacobian_norm_estimate",
    "spectral_norm",
    "token_mixing_operator_norm",
    "tokenwise_linear_operator_norm",
    "window_mask",
]
