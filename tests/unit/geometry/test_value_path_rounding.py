"""The joint value-path norm ‖Σ_h W_O^(h) W_V^h‖ of the local MHA bound holds in real arithmetic where the float64
product cancels."""

from __future__ import annotations

from fractions import Fraction

import torch

from attnsens._rounding import spectral_norm_upper_bound
from attnsens.geometry.attention_accuracy import output_accuracy
from attnsens.geometry.attention_terms import value_path_norms
from tests.helpers.constants_rounding import K_COLUMN, Q_COLUMN, exact_dot


def test_joint_value_path_norm_bounds_a_product_float64_rounds_to_zero() -> None:
    f64 = torch.float64
    wo = torch.tensor([[Q_COLUMN]], dtype=f64)  # [batch, d_model = 1, head · d_head = 33]
    wv = torch.tensor([[[[k] for k in K_COLUMN]]], dtype=f64)  # [batch, kv_head = 1, d_head = 33, d_model = 1]
    assert float((wo @ wv.flatten(-3, -2)).abs().max()) == 0.0  # the premise: float64 loses the product
    _, joint = value_path_norms(wv, wo, output_accuracy(wo, 1), spectral_norm_upper_bound(wv[0])[None])
    assert Fraction(float(joint.max())) >= abs(exact_dot(Q_COLUMN, K_COLUMN))
