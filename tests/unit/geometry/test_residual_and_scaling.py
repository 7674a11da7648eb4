"""Residual-Jacobian expansions (T8), the LayerNorm condition (T6) and the scaling heuristics (T9)."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from attnsens.geometry.blocks import block_local_jacobian_upper_bound
from attnsens.geometry.jacobians import layernorm_jacobian
from attnsens.geometry.layers import synthetic_block_input
from attnsens.geometry.residual import (
    layernorm_condition,
    ln_only_product_upper_bound,
    pre_ln_expansion_remainder_upper_bound,
    residual_jacobian_estimates,
)
from attnsens.geometry.scaling import deepnet_constants, depth_scale_heuristic, quartic_path_norm_product
from attnsens.weights import NormWeights
from tests.reference.jacobian_oracles import matrix_inf_to_inf_norm
from tests.unit.geometry.tiny_layers import tiny_layers

F64 = torch.float64


def test_expansion_remainder_bound_holds_for_random_matrices() -> None:
    g = torch.Generator().manual_seed(0)
    for n_layer in (1, 2, 3, 5):
        J = torch.randn(200, n_layer, 4, 4, generator=g, dtype=F64) * torch.rand(200, n_layer, 1, 1, generator=g)
        product = torch.eye(4, dtype=F64).expand(200, 4, 4)
        for k in range(n_layer):
            product = (torch.eye(4, dtype=F64) + J[:, k]) @ product
        remainder = product - torch.eye(4, dtype=F64) - J.sum(dim=1)
        bound = pre_ln_expansion_remainder_upper_bound(matrix_inf_to_inf_norm(J))
        # The dense remainder is itself computed as product − I − ΣJ, so it carries round-off of order
        # eps·‖product‖ (nonzero even for one layer, where the exact remainder is 0).
        oracle_rounding = 16 * torch.finfo(F64).eps * (1 + matrix_inf_to_inf_norm(J)).prod(dim=-1)
        assert bool((matrix_inf_to_inf_norm(remainder) <= bound + oracle_rounding).all())


def test_expansion_remainder_bound_is_attained_by_commuting_nonnegative_branches() -> None:
    b = torch.tensor([0.3, 0.5, 0.2], dtype=F64)
    J = b[:, None, None] * torch.eye(2, dtype=F64)
    product = torch.linalg.multi_dot([torch.eye(2, dtype=F64) + j for j in J])
    remainder = product - torch.eye(2, dtype=F64) - J.sum(dim=0)
    assert_close(matrix_inf_to_inf_norm(remainder), pre_ln_expansion_remainder_upper_bound(b))


def test_layernorm_condition_ratios_bound_the_jacobians_and_their_product() -> None:
    d = 6
    norms = [NormWeights(kind="layernorm", gamma=torch.rand(d, dtype=F64) + 0.5, beta=None, eps=1e-5)
             for _ in range(3)]  # fmt: skip
    Y = [torch.randn(1, 4, d, dtype=F64) * s for s in (0.5, 2.0, 3.0)]
    conditions = [layernorm_condition(y, n, rho=0.9) for y, n in zip(Y, norms, strict=True)]
    for condition, y, n in zip(conditions, Y, norms, strict=True):
        exact = torch.linalg.matrix_norm(layernorm_jacobian(y, n.gamma, n.eps), ord=2)
        assert bool((exact <= condition.ratio * (1 + 1e-12)).all())
        assert_close(condition.satisfied_fraction, (condition.ratio <= 0.9).to(F64).mean())
    cumulative = ln_only_product_upper_bound(torch.stack([c.ratio_max for c in conditions]))
    product = torch.eye(d, dtype=F64)
    for y, n in zip(Y, norms, strict=True):
        product = layernorm_jacobian(y, n.gamma, n.eps) @ product
    exact_product = torch.linalg.matrix_norm(product, ord=2).amax()
    assert float(exact_product) <= float(cumulative[-1]) * (1 + 1e-12)


def test_pre_and_post_arrangements_are_estimated_at_the_same_input() -> None:
    layer = tiny_layers("pre", seed=2)[0]
    X = synthetic_block_input(10, 5, rms=1.0, seed=1)
    estimates = residual_jacobian_estimates(X, layer, iterations=10)
    post_layer = type(layer)(**{**vars(layer), "placement": "post"})
    assert float(estimates.pre_ln_estimate[0]) <= float(block_local_jacobian_upper_bound(X, layer)[0])
    assert float(estimates.post_ln_estimate[0]) <= float(block_local_jacobian_upper_bound(X, post_layer)[0])
    assert float(estimates.pre_ln_branch_estimate[0]) <= float(block_local_jacobian_upper_bound(X, layer)[0]) - 1


def test_scaling_heuristics_and_deepnet_constants() -> None:
    assert depth_scale_heuristic(81, 4) == 81 ** (-1 / 4)
    for n in (6, 18, 100):
        c = deepnet_constants("decoder", n)
        assert abs(n * c.beta**4 - 1 / 8) < 1e-12 and abs(c.alpha**4 - 2 * n) < 1e-9
    enc = deepnet_constants("encoder_decoder_encoder", 6, n_decoder_layers=6)
    assert abs(enc.alpha - 0.81 * (6**5) ** (1 / 16)) < 1e-12
    dec = deepnet_constants("encoder_decoder_decoder", 6, n_decoder_layers=12)
    assert abs(dec.beta - 144 ** (-1 / 4)) < 1e-12
    assert float(quartic_path_norm_product(torch.tensor(2.0), torch.tensor(3.0), 1.0, 0.5)) == 3.0
