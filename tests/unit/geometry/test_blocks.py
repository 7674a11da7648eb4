"""Activation constants, FFN and block bounds: certified bounds are never exceeded (docs/math.md §2.7, T6, T7)."""

from __future__ import annotations

import math

import pytest
import torch

from attnsens.geometry.blocks import (
    ACTIVATION_LIPSCHITZ,
    block_lipschitz_upper_bound,
    block_local_jacobian_upper_bound,
    ffn_lipschitz_upper_bound,
    ffn_local_jacobian_upper_bound,
    norm_output_radius_rms,
)
from attnsens.geometry.estimates import block_jacobian_norm_estimate
from attnsens.geometry.layers import activation, block_forward, mlp_forward, norm_forward, synthetic_block_input
from attnsens.geometry.norms import block_rms_norm
from tests.unit.geometry.tiny_layers import tiny_layers

F64 = torch.float64


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu", "relu", "quick_gelu"])
def test_activation_constants_bound_the_derivative_tightly(name: str) -> None:
    z = torch.linspace(-12, 12, 2_400_001, dtype=F64, requires_grad=True)
    (slope,) = torch.autograd.grad(activation(name, z).sum(), z)
    observed = float(slope.abs().max())
    assert observed <= ACTIVATION_LIPSCHITZ[name] <= observed + 1e-5
    assert bool((activation(name, z).abs() <= z.abs() + 1e-15).all())  # |act(z)| ≤ |z|, used by the gated bound


def test_gelu_tanh_constant_of_the_spec_is_too_small() -> None:
    """The often-quoted 1.12899 for tanh-GELU is too small (docs/math.md §11): the true max slope is 1.1289931."""
    z = torch.tensor([1.4185], dtype=F64, requires_grad=True)
    (slope,) = torch.autograd.grad(activation("gelu_tanh", z).sum(), z)
    assert float(slope) > 1.12899


@pytest.mark.parametrize(("gated", "gate_bias"), [(False, False), (True, False), (True, True)])
def test_ffn_bounds_hold_at_estimated_worst_inputs(gated: bool, gate_bias: bool) -> None:
    kwargs = {"gated": gated, "gate_bias": gate_bias, "norm": "rmsnorm" if gated else "layernorm"}
    layer = tiny_layers("pre", **kwargs, seed=3)[0]
    radius_rms = 2.0
    bound = ffn_lipschitz_upper_bound(layer.mlp, radius_l2=radius_rms * math.sqrt(10))
    X = synthetic_block_input(10, 9, batch=3, rms=radius_rms, seed=5)
    estimate = block_jacobian_norm_estimate(lambda z: mlp_forward(z, layer.mlp), X, iterations=30)
    local = ffn_local_jacobian_upper_bound(X, layer.mlp)
    assert bool((estimate <= local).all()) and bool((local <= bound).all())


def test_relu_squared_mlp_bounds_hold_and_are_refused_without_a_radius_or_in_a_gate() -> None:
    """relu² has slope 2 relu(z), unbounded: the local bound follows the actual pre-activations, the Lipschitz
    bound holds on a ball only (and is refused without one), and a gated MLP with it is refused."""
    from dataclasses import replace

    from attnsens.errors import ConfigError
    from attnsens.geometry.blocks import mlp_enclosure
    from attnsens.geometry.enclosures import Enclosure

    mlp = replace(tiny_layers("pre", seed=3)[0].mlp, activation="relu2")
    radius_rms = 2.0
    bound = ffn_lipschitz_upper_bound(mlp, radius_l2=radius_rms * math.sqrt(10))
    X = synthetic_block_input(10, 9, batch=3, rms=radius_rms, seed=5)
    estimate = block_jacobian_norm_estimate(lambda z: mlp_forward(z, mlp), X, iterations=30)
    local = ffn_local_jacobian_upper_bound(X, mlp)
    assert bool((estimate <= local).all()) and bool((local <= bound).all())
    X = X.to(F64)
    enclosure = mlp_enclosure(Enclosure(X, torch.full(X.shape[:-1], 0.05, dtype=F64)), mlp)
    shift = torch.randn(X.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
    moved = mlp_forward(X + 0.05 * shift / shift.norm(dim=-1, keepdim=True), mlp)
    assert bool(((moved - enclosure.value).norm(dim=-1) <= enclosure.radius).all())
    with pytest.raises(ConfigError, match="only Lipschitz on a bounded set"):
        ffn_lipschitz_upper_bound(mlp)
    gated = replace(tiny_layers("pre", gated=True, seed=3)[0].mlp, activation="relu2")
    with pytest.raises(ConfigError, match="gated MLP with relu2"):
        ffn_local_jacobian_upper_bound(X, gated)


def test_norm_outputs_stay_in_the_reset_ball() -> None:
    for norm in ("layernorm", "rmsnorm"):
        layer = tiny_layers("pre", norm=norm)[0]
        X = torch.randn(4, 9, 10, dtype=F64) * torch.logspace(-3, 3, 4, dtype=F64)[:, None, None]
        radius = norm_output_radius_rms(layer.attn_norm)
        assert bool((block_rms_norm(norm_forward(X, layer.attn_norm)) <= radius * (1 + 1e-12)).all())


@pytest.mark.parametrize("placement", ["pre", "post", "none"])
def test_block_estimate_below_local_below_global(placement: str) -> None:
    layer = tiny_layers(placement, seed=11)[0]
    X = synthetic_block_input(10, 8, batch=2, rms=1.3, seed=2)
    estimate = block_jacobian_norm_estimate(lambda z: block_forward(z, layer), X, iterations=20, restarts=2)
    local = block_local_jacobian_upper_bound(X, layer)
    glob = block_lipschitz_upper_bound(layer, input_radius_rms=1.3).upper_bound
    assert bool((estimate <= local).all()), (estimate, local)
    assert bool((local <= glob).all())


@pytest.mark.parametrize("window", [None, 2])
def test_a_pre_block_without_its_attention_norm_is_bounded_on_its_stream(window: int | None) -> None:
    """ModernBERT's first block, X + A(X) then + F(N₂ ·), bidirectional with and without a window of 2: estimate ≤
    local ≤ global on the ball of the input, the attention factor taken at X itself and no N₁ factor; the global
    bound needs that ball's radius, since nothing normalizes what the attention reads."""
    from dataclasses import replace

    from attnsens.errors import ConfigError
    from attnsens.geometry.blocks import block_local_jacobian_bounds

    base = tiny_layers("pre", seed=11)[0]
    layer = replace(base, attn_norm=None, attention=replace(base.attention, causal=False, sliding_window=window))
    X = synthetic_block_input(10, 8, batch=2, rms=1.3, seed=2)
    estimate = block_jacobian_norm_estimate(lambda z: block_forward(z, layer), X, iterations=20, restarts=2)
    local = block_local_jacobian_bounds(X, layer)
    glob = block_lipschitz_upper_bound(layer, input_radius_rms=1.3)
    assert torch.equal(local.attention_input, X)
    assert bool((estimate <= local.upper_bound).all()), (estimate, local.upper_bound)
    assert bool((local.upper_bound <= glob.upper_bound).all())
    assert float(glob.attn_norm_lipschitz) == 1.0 and float(glob.mlp_norm_lipschitz) > 1.0
    with pytest.raises(ConfigError, match="'pre' without attn_norm needs input_radius_rms"):
        block_lipschitz_upper_bound(layer)


def test_placements_name_the_norms_they_need() -> None:
    """ "pre" may lack N₁ alone (the attention then reads the stream); never N₂, nor N₁ beside a parallel residual."""
    from dataclasses import replace

    from attnsens.errors import ConfigError

    pre, post = tiny_layers("pre")[0], tiny_layers("post")[0]
    assert replace(pre, attn_norm=None).attention_reads_stream and not pre.attention_reads_stream
    with pytest.raises(ConfigError, match="placement 'pre' requires mlp_norm"):
        replace(pre, mlp_norm=None)
    with pytest.raises(ConfigError, match="parallel_residual needs placement 'pre' with both norms"):
        replace(pre, attn_norm=None, parallel_residual=True)
    with pytest.raises(ConfigError, match="placement 'post' requires both"):
        replace(post, attn_norm=None)
    with pytest.raises(ConfigError, match="placement 'none' requires no attn_norm"):
        replace(pre, placement="none", attn_norm=None)
    with pytest.raises(ConfigError, match="placement 'pre' has no attn_norm"):
        replace(pre, attn_norm=None).norms()


def test_parallel_residual_block_bound() -> None:
    base = tiny_layers("pre", seed=4)[0]
    layer = type(base)(**{**vars(base), "parallel_residual": True})
    X = synthetic_block_input(10, 6, rms=1.0, seed=9)
    estimate = block_jacobian_norm_estimate(lambda z: block_forward(z, layer), X, iterations=20)
    local = block_local_jacobian_upper_bound(X, layer)
    assert float(estimate[0]) <= float(local[0]) <= float(block_lipschitz_upper_bound(layer).upper_bound)


@pytest.mark.parametrize("placement", ["pre", "post", "none", "parallel"])
def test_block_bound_carries_the_attention_bound_of_its_chain_rule(placement: str) -> None:
    """The attention factor returned with the block bound is the MHA bound at the point the chain rule uses (N₁ of
    the input for pre-LN and parallel blocks, over that float point's enclosure), so a caller reporting both
    computes the attention bound once."""
    from attnsens.geometry.attention_bounds import mha_local_jacobian_bounds
    from attnsens.geometry.blocks import block_local_jacobian_bounds
    from attnsens.geometry.enclosures import exact, norm_enclosure

    layer = tiny_layers("pre" if placement == "parallel" else placement, seed=7)[0]
    if placement == "parallel":
        layer = type(layer)(**{**vars(layer), "parallel_residual": True})
    X = synthetic_block_input(10, 7, batch=2, rms=1.1, seed=4)
    bound = block_local_jacobian_bounds(X, layer)
    expected_input = X if placement in ("post", "none") else norm_forward(X, layer.attn_norm)
    assert torch.equal(bound.attention_input, expected_input)
    attn = layer.attention
    radius = None if placement in ("post", "none") else norm_enclosure(exact(X), layer.attn_norm).radius
    direct, at_point = (mha_local_jacobian_bounds(expected_input, attn, input_radius=r) for r in (radius, None))
    assert torch.equal(bound.attention.upper_bound, direct.upper_bound)
    assert bool((direct.upper_bound >= at_point.upper_bound).all())
    assert bool((direct.upper_bound <= at_point.upper_bound * (1 + 1e-9)).all())  # a radius of rounding size
    assert torch.equal(bound.upper_bound, block_local_jacobian_upper_bound(X, layer))
