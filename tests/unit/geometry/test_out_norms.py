"""Blocks with a norm after each sublayer (Gemma 2/3 "sandwich" norms with pre-norms, OLMo 2 without): the
certified local bound is never below the block-∞ norm of the dense autograd Jacobian, the Lipschitz bound is never
below the local bound, the bounds are not vacuous, and the out-norm factor of the chain rule is needed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attnsens.errors import ConfigError
from attnsens.geometry.blocks import block_lipschitz_upper_bound, block_local_jacobian_bounds
from attnsens.geometry.layers import (
    attention_sublayer,
    block_forward,
    mlp_forward,
    norm_forward,
    synthetic_block_input,
)
from attnsens.geometry.residual import residual_jacobian_estimates
from attnsens.weights import LayerWeights
from tests.reference.jacobian_oracles import (
    block_inf_norm_lower_dense,
    block_inf_norm_row_sum_upper,
    block_inf_norm_single_input_token,
)
from tests.unit.geometry.tiny_layers import tiny_layers

F64 = torch.float64
# Measured on seeds 0-3 (bound / exact): at most 130 with 6 tokens (the dense Jacobian's block-∞ norm, bracketed to
# within 30 % by power ascent and the row-sum bound) and at most 39 with one token (exact). The plain pre-LN bound of
# the same weights without the output norms is about 13 times its Jacobian; each output norm adds its factor
# ‖γ‖_∞/r(a) at the sublayer output (1.5 to 4 here).
MAX_RATIO = {"tokens": 200.0, "single": 60.0}


def _layer(placement: str, gated: bool, seed: int) -> LayerWeights:
    # Gemma 2 (pre, gated gelu_tanh in the model; here SiLU and RoPE for the gated variant) or OLMo 2 (none).
    norm = "rmsnorm" if gated else "layernorm"
    return tiny_layers(placement, out_norms=True, gated=gated, norm=norm, rotary=gated, seed=seed)[0]


def _dense(layer: LayerWeights, X: torch.Tensor) -> torch.Tensor:
    return torch.func.jacrev(lambda z: block_forward(z[None], layer)[0])(X[0])


@pytest.mark.parametrize("gated", [False, True], ids=["mlp", "gated"])
@pytest.mark.parametrize("placement", ["pre", "none"], ids=["gemma2-like", "olmo2-like"])
def test_local_bound_is_above_the_dense_jacobian_and_below_the_lipschitz_bound(placement: str, gated: bool) -> None:
    for seed in range(4):
        layer = _layer(placement, gated, seed)
        X = synthetic_block_input(10, 6, rms=1.3, seed=seed)
        J = _dense(layer, X)
        lower, upper = block_inf_norm_lower_dense(J, iterations=40), block_inf_norm_row_sum_upper(J)
        assert float(upper) <= 1.5 * float(lower)  # the bracket pins the exact norm down (to within 30 % here)
        local = float(block_local_jacobian_bounds(X, layer).upper_bound[0])
        # Above the whole bracket, so above the exact norm whatever the power ascent missed.
        assert float(upper) <= local <= MAX_RATIO["tokens"] * float(lower), (seed, float(lower), local)
        one = X[:, :1]  # one token: the block-∞ norm is the spectral norm of the one Jacobian block, exactly
        exact = float(block_inf_norm_single_input_token(_dense(layer, one)))
        local_one = float(block_local_jacobian_bounds(one, layer).upper_bound[0])
        assert exact <= local_one <= MAX_RATIO["single"] * exact, (seed, exact, local_one)
        lipschitz = float(block_lipschitz_upper_bound(layer, input_radius_rms=1.3).upper_bound)
        assert local <= lipschitz and local_one <= lipschitz


@pytest.mark.parametrize("placement", ["pre", "none"])
def test_the_output_norm_factor_is_needed(placement: str) -> None:
    """Small sublayer outputs make the output norms amplify by ‖γ‖_∞/r(·) ≫ 1: the chain rule without that factor
    (the bound of the same block without its output norms) falls below the true Jacobian; with it, the bound holds."""
    layer = _layer(placement, False, 5)
    attention = replace(layer.attention, w_o=layer.attention.w_o * 0.02, b_o=None)
    layer = replace(layer, attention=attention, mlp=replace(layer.mlp, w_out=layer.mlp.w_out * 0.02, b_out=None))
    X = synthetic_block_input(10, 6, rms=1.0, seed=1)
    lower = float(block_inf_norm_lower_dense(_dense(layer, X), iterations=40))
    without = replace(layer, attn_out_norm=None, mlp_out_norm=None)
    assert float(block_local_jacobian_bounds(X, without).upper_bound[0]) < lower
    assert lower <= float(block_local_jacobian_bounds(X, layer).upper_bound[0])


def test_reference_forward_applies_the_norms_to_the_sublayer_outputs() -> None:
    pre = _layer("pre", True, 0)
    x = synthetic_block_input(10, 5, rms=1.3, seed=3)
    h = x + norm_forward(attention_sublayer(norm_forward(x, pre.attn_norm), pre.attention), pre.attn_out_norm)
    expected = h + norm_forward(mlp_forward(norm_forward(h, pre.mlp_norm), pre.mlp), pre.mlp_out_norm)
    torch.testing.assert_close(block_forward(x, pre), expected, rtol=0, atol=0)
    none = _layer("none", False, 0)
    h = x + norm_forward(attention_sublayer(x, none.attention), none.attn_out_norm)
    expected = h + norm_forward(mlp_forward(h, none.mlp), none.mlp_out_norm)
    torch.testing.assert_close(block_forward(x, none), expected, rtol=0, atol=0)


def test_output_norms_are_refused_where_they_are_not_defined() -> None:
    post = tiny_layers("post")[0]
    norm = post.attn_norm
    with pytest.raises(ConfigError, match=r"need placement 'pre'.*or 'none'.*got 'post'"):
        replace(post, attn_out_norm=norm)
    pre = tiny_layers("pre")[0]
    with pytest.raises(ConfigError, match="not supported beside parallel_residual"):
        replace(pre, parallel_residual=True, mlp_out_norm=norm)
    with pytest.raises(ConfigError, match="one norm per sublayer"):
        residual_jacobian_estimates(synthetic_block_input(10, 4), replace(pre, mlp_out_norm=norm))
