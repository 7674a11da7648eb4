"""Each step of the local attention bound against its own closed form (docs/math.md T4; attention_bounds): forward
and radii, score spread, θ̃ via certify, value path, combine. Every certified value must lie at or just above the
exact one (rounded up, by a relative 1e-9 at most on these small instances)."""

from __future__ import annotations

import math

import torch

from attnsens.geometry.attention import _AttentionTensors
from attnsens.geometry.attention_bounds import (
    _local_forward,
    _row_theta_bounds,
    _row_upper_bound,
    _score_spread_bounds,
    _value_path_upper_bound,
)

F64 = torch.float64
EYE = torch.eye(2, dtype=F64)


def _assert_just_above(got: torch.Tensor, exact: torch.Tensor | float) -> None:
    """exact ≤ got ≤ exact (1 + 1e-9) + 1e-12, elementwise: certified, and tight."""
    exact = torch.as_tensor(exact, dtype=F64).expand_as(got)
    assert bool((got >= exact).all()), (got, exact)
    assert bool((got <= exact * (1 + 1e-9) + 1e-12).all()), (got, exact)


def _one_head(Wq: torch.Tensor, X: torch.Tensor, tau: float = 1.0) -> _AttentionTensors:
    """One head, d_model = d_head = 2, W_K = W_V = W_O = I."""
    return _AttentionTensors(Wq[None], EYE[None], EYE[None], EYE, tau)


def test_forward_and_radii_closed_form() -> None:
    """W_Q = 0: rows uniform, p = (½, ½), y = (x₁ + x₂)/2. x = (1, 0), (3, 0): R = 3; V_i = min(max_m ‖v_m − y‖,
    max_m ‖v_m‖) = min(1, 3) = 1. Input radii δ = (½, ¼) add max δ to R and ‖W_V‖ max δ = ½ to V_i."""
    X = torch.tensor([[[1.0, 0.0], [3.0, 0.0]]], dtype=F64)
    a = _one_head(torch.zeros(2, 2, dtype=F64), X)
    local = _local_forward(X, a, None)
    torch.testing.assert_close(local.fwd.probabilities, torch.full((1, 1, 2, 2), 0.5, dtype=F64))
    _assert_just_above(local.radius_l2, 3.0)
    _assert_just_above(local.value_spread, 1.0)
    _assert_just_above(local.head_distance, 1.0)
    widened = _local_forward(X, a, torch.tensor([[0.5, 0.25]], dtype=F64))
    _assert_just_above(widened.radius_l2, 3.5)
    _assert_just_above(widened.value_spread, 1.5)


def test_score_spread_closed_form() -> None:
    """W_Q = W_K = I, no bias: s_i = min over m ∈ {Σ_j p_ij x_j, 0} of max_j ‖x_j − m‖ + ‖x_i‖. x = (3, 0), (3, 1):
    row 0 has scores (9, 9), p = (½, ½), m = (3, ½), so s_0 = ½ + 3 (the centre 0 gives √10 + 3); row 1 by the
    same formula with p = softmax(9, 10)."""
    X = torch.tensor([[[3.0, 0.0], [3.0, 1.0]]], dtype=F64)
    a = _one_head(EYE, X)
    spread = _score_spread_bounds(X, a, _local_forward(X, a, None)).spread[0, 0]
    _assert_just_above(spread[0], 3.5)
    p = torch.softmax(torch.tensor([9.0, 10.0], dtype=F64), dim=0)
    keys, query_norm = X[0], math.sqrt(10.0)
    mean = p @ keys
    exact = min(float((keys - mean).norm(dim=-1).amax()), float(keys.norm(dim=-1).amax())) + query_norm
    _assert_just_above(spread[1], exact)


def test_theta_via_certify_closed_form() -> None:
    """Two keys: θ(p) = 4 p₁ p₂ (a two-atom row), so θ = 1 on the row with equal scores (9, 9) and
    4e/(1 + e)² on the row with scores (9, 10); one key: θ = 0."""
    X = torch.tensor([[[3.0, 0.0], [3.0, 1.0]]], dtype=F64)
    a = _one_head(EYE, X)
    theta = _row_theta_bounds(X, a, _local_forward(X, a, None)).theta_upper[0, 0]
    _assert_just_above(theta, torch.tensor([1.0, 4 * math.e / (1 + math.e) ** 2], dtype=F64))
    single = X[:, :1]
    _assert_just_above(_row_theta_bounds(single, a, _local_forward(single, a, None)).theta_upper, 0.0)


def _two_heads() -> _AttentionTensors:
    """Two heads of width 1 reading one coordinate each (W_V^1 = e₁ᵀ, W_V^2 = e₂ᵀ), W_O = I, W_Q = 0: uniform rows,
    A_h = W_O^(h) W_V^h has norm 1 and Σ_h A_h = I."""
    Wv = EYE[:, None, :]  # [head, d_head = 1, d_model]
    return _AttentionTensors(torch.zeros(2, 1, 2, dtype=F64), Wv, Wv, EYE, 1.0)


def test_value_path_closed_form() -> None:
    """Equal rows in both heads: Σ_j min_w (w ‖Σ_h A_h‖ + Σ_h |p^h_j − w| ‖A_h‖) = Σ_j p_j ‖I‖ = 1, not
    Σ_h ‖A_h‖ = 2; one head with rows summing to 1: ‖W_O W_V‖ = ‖P diag(2, 1)‖ = 2 for the permutation P."""
    X = torch.tensor([[[1.0, 2.0], [-1.0, 0.5], [0.3, 0.0]]], dtype=F64)
    a = _two_heads()
    local = _local_forward(X, a, None)
    _assert_just_above(_value_path_upper_bound(a, local, _row_theta_bounds(X, a, local)), 1.0)
    swap = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=F64)
    one = _AttentionTensors(EYE[None], EYE[None], torch.diag(torch.tensor([2.0, 1.0], dtype=F64))[None], swap, 0.7)
    local = _local_forward(X, one, None)
    _assert_just_above(_value_path_upper_bound(one, local, _row_theta_bounds(X, one, local)), 2.0)


def test_combine_closed_form() -> None:
    """One token (θ = 0): the row bound is the value path, here ‖I‖ = 1, below both head combinations of ‖W_V^h‖
    (‖W_O‖ √2 and Σ_h ‖W_O^(h)‖ = 2). One head with W_O = I: it is at most g_i = ‖W_V‖ + (θ(p_i)/τ) V_i s_i from
    the other steps' results."""
    X = torch.tensor([[[1.0, 2.0]]], dtype=F64)
    a = _two_heads()
    local = _local_forward(X, a, None)
    theta = _row_theta_bounds(X, a, local)
    spread = _score_spread_bounds(X, a, local)
    _assert_just_above(_row_upper_bound(a, local, theta, spread, _value_path_upper_bound(a, local, theta)), 1.0)

    X = torch.tensor([[[3.0, 0.0], [3.0, 1.0], [-1.0, 2.0]]], dtype=F64)
    a = _one_head(0.5 * EYE, X, tau=0.8)
    local = _local_forward(X, a, None)
    theta = _row_theta_bounds(X, a, local)
    spread = _score_spread_bounds(X, a, local)
    rows = _row_upper_bound(a, local, theta, spread, _value_path_upper_bound(a, local, theta))
    g = local.norms.w_v + theta.theta_upper[0, 0] / 0.8 * local.value_spread[0, 0] * spread.spread[0, 0]
    assert bool((rows[0] <= g * (1 + 1e-12)).all()), (rows, g)
    assert bool((rows[0] >= local.norms.w_v).all()), "the value term alone is a lower bound of every row here"
