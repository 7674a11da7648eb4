"""The block constants of the influence certificate are upper bounds in real arithmetic, also where the float64
products of the weights cancel (docs/math.md §10.4)."""

from __future__ import annotations

from fractions import Fraction

import torch

from attnsens._rounding import product_spectral_norm_upper_bound
from attnsens.influence.constants import block_constants
from attnsens.weights import AttentionWeights, LayerWeights, MLPWeights
from tests.helpers.constants_rounding import K_COLUMN, Q_COLUMN, exact_dot


def cancelling_layer() -> LayerWeights:
    """One head, d_head = 33, d_model = 1: W_Qᵀ W_K, W_O W_V and W_Kᵀ b_Q are all 1 in reals and 0 in float64."""
    f64 = torch.float64
    attention = AttentionWeights(
        w_q=torch.tensor([[[q] for q in Q_COLUMN]], dtype=f64),
        w_k=torch.tensor([[[k] for k in K_COLUMN]], dtype=f64),
        w_v=torch.tensor([[[k] for k in K_COLUMN]], dtype=f64),
        w_o=torch.tensor([Q_COLUMN], dtype=f64),
        b_q=torch.tensor([Q_COLUMN], dtype=f64),
        tau=1.0,
        causal=False,
    )
    mlp = MLPWeights(
        kind="mlp", activation="relu", w_in=torch.zeros(1, 1, dtype=f64), w_out=torch.zeros(1, 1, dtype=f64)
    )
    return LayerWeights(index=0, placement="none", attention=attention, mlp=mlp, attn_norm=None, mlp_norm=None)


def test_float64_loses_the_product_entirely() -> None:
    """The premise, with the batched product the constants compute: 0 in float64, 1 in reals."""
    layer = cancelling_layer().attention
    computed = layer.w_q.transpose(-2, -1) @ layer.w_k
    assert float(computed.abs().max()) == 0.0 and exact_dot(Q_COLUMN, K_COLUMN) == 1


def test_product_norm_bound_covers_the_real_product() -> None:
    a = torch.tensor([Q_COLUMN], dtype=torch.float64)
    b = torch.tensor([[k] for k in K_COLUMN], dtype=torch.float64)
    assert Fraction(float(product_spectral_norm_upper_bound(a, b))) >= abs(exact_dot(Q_COLUMN, K_COLUMN))


def test_block_constants_bound_the_real_score_value_and_bias_norms() -> None:
    """Score ‖W_Qᵀ W_K‖/τ, value ‖W_O W_V‖ and query-bias ‖W_Kᵀ b_Q‖/τ: each 1 in reals (the norm of a 1×1 matrix);
    the norms of the float64 products, even inflated by 1e-10, are 0."""
    head = block_constants(cancelling_layer()).heads[0]
    real = abs(exact_dot(Q_COLUMN, K_COLUMN))
    assert Fraction(head.score_norm) >= real
    assert Fraction(head.value_norm) >= real
    assert Fraction(head.query_bias_score_norm) >= real
