"""Certified geometry numbers against real-arithmetic oracles (fractions.Fraction, mpmath at 300–400 bits), on the
families where round-to-nearest lands below the real value: exact fractions, aligned rank-one weights, products
attained by J_k = b_k·I, LayerNorm inputs with a huge offset, and attention rows of huge scores or tiny τ."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

from attnsens.errors import InputError
from attnsens.geometry import (
    norm_jacobian_spectral_norm_upper_bound,
    pre_ln_expansion_remainder_upper_bound,
)
from attnsens.geometry.attention import AttentionBiases, _AttentionTensors, causal_mask
from attnsens.geometry.attention_bounds import _mha_lipschitz_bounds, _mha_local_jacobian_bounds
from attnsens.theta import softmax_jacobian_inf_to_one_norm

F64 = torch.float64


def test_softmax_inf_to_one_bound_at_tau_three_is_not_below_one_third() -> None:
    u = torch.zeros(2, dtype=F64)  # p = (½, ½) exactly, θ = 1: ‖J‖_{∞→1} = 1/τ
    certificate = softmax_jacobian_inf_to_one_norm(u, tau=3.0)
    assert Fraction(float(certificate.upper)) >= Fraction(1, 3)
    assert Fraction(float(certificate.lower)) <= Fraction(1, 3)
    for tau in (0.1, 0.7, 3.0, 10.0, 1e-300):
        certificate = softmax_jacobian_inf_to_one_norm(u, tau=tau)
        assert Fraction(float(certificate.lower)) <= 1 / Fraction(tau) <= Fraction(float(certificate.upper))


def test_layernorm_bound_with_a_huge_offset_is_not_below_the_400_bit_norm() -> None:
    """x = 2^60 + 256·k: the float64 mean is off by up to 256 and σ came out 0.15 % high (the bound low)."""
    row = [2.0**60 + 256 * k for k in range(32)]
    x, gamma = torch.tensor(row, dtype=F64), torch.ones(32, dtype=F64)
    bound = float(norm_jacobian_spectral_norm_upper_bound(x, gamma, 1e-5, "layernorm"))
    with mpmath.workprec(400):
        v = [mpmath.mpf(t) for t in row]
        mean = mpmath.fsum(v) / 32
        sigma = mpmath.sqrt(mpmath.fsum((t - mean) ** 2 for t in v) / 32 + mpmath.mpf(1e-5))
        assert mpmath.mpf(bound) >= 1 / sigma  # an equality for constant γ and d ≥ 3
        assert mpmath.mpf(bound) <= (1 / sigma) * (1 + mpmath.mpf(2) ** -40)


def test_rmsnorm_bound_is_not_below_the_400_bit_norm_on_random_rows() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        d = int(torch.randint(2, 9, (1,), generator=gen))
        x = torch.randn(d, generator=gen, dtype=F64) * float(torch.rand((), generator=gen, dtype=F64) * 10)
        gamma = torch.full((d,), 0.7, dtype=F64)
        bound = float(norm_jacobian_spectral_norm_upper_bound(x, gamma, 1e-6, "rmsnorm"))
        with mpmath.workprec(400):
            r = mpmath.sqrt(mpmath.fsum(mpmath.mpf(t) ** 2 for t in x.tolist()) / d + mpmath.mpf(1e-6))
            assert mpmath.mpf(bound) >= mpmath.mpf(0.7) / r


def test_layernorm_bound_is_no_equality_at_d_two() -> None:
    """At d = 2 the Jacobian's only nonzero eigenvalue is ε/σ² (docstring): the true norm is far below ‖γ‖_∞/σ."""
    from attnsens.geometry.jacobians import layernorm_jacobian

    x, gamma, eps = torch.tensor([0.3, -0.5], dtype=F64), torch.ones(2, dtype=F64), 1e-5
    true = float(torch.linalg.matrix_norm(layernorm_jacobian(x, gamma, eps), ord=2))
    sigma = math.sqrt(0.16 + eps)
    assert math.isclose(true, eps / sigma**3, rel_tol=1e-6)
    assert float(norm_jacobian_spectral_norm_upper_bound(x, gamma, eps, "layernorm")) >= 1 / sigma


def test_pre_ln_remainder_is_not_below_the_exact_rational_value() -> None:
    """J_k = b_k·I attains Π(1 + b_k) − 1 − Σ b_k exactly."""
    rng = random.Random(0)
    for _ in range(300):
        b = [rng.uniform(0, 2) for _ in range(rng.randrange(2, 7))]
        exact = math.prod(1 + Fraction(v) for v in b) - 1 - sum(Fraction(v) for v in b)
        bound = float(pre_ln_expansion_remainder_upper_bound(torch.tensor(b, dtype=F64)))
        assert Fraction(bound) >= exact, b


def test_mha_lipschitz_bound_at_radius_zero_is_not_below_the_aligned_rank_one_norm() -> None:
    """W_V = a bᵀ, W_O = c aᵀ/‖a‖-free aligned rank one: at R = 0 the bound's real value is ‖W_O‖‖W_V‖ =
    ‖c‖‖a‖·‖a‖‖b‖, attained by D MHA(0) = W_O W_V ⊗ (row-stochastic mixing)."""
    gen = torch.Generator().manual_seed(1)
    d_model = d_head = 3
    for _ in range(100):
        a, b, c = (torch.randn(3, generator=gen, dtype=F64) for _ in range(3))
        Wv = (a[:, None] * b[None, :])[None]  # [1, d_head, d_model]
        Wo = c[:, None] * a[None, :]  # [d_model, d_head]
        Wq = Wk = torch.randn(1, d_head, d_model, generator=gen, dtype=F64)
        bound = float(_mha_lipschitz_bounds(_AttentionTensors(Wq, Wk, Wv, Wo, tau=1.0), radius_rms=0.0).upper_bound)
        sq = [sum(Fraction(v) ** 2 for v in t.tolist()) for t in (a, b, c)]
        assert Fraction(bound) ** 2 >= sq[2] * sq[0] * sq[0] * sq[1]


def _mha_jacobian_mpmath(X: list[list[float]], bias_q: list[float], tau: float) -> list[list[np.ndarray]]:
    """J_im = ∂y_i/∂x_m (2×2 blocks, rounded to float64) of the causal one-head attention with
    W_Q = W_K = W_V = W_O = I and query bias b, computed at 400 bits."""
    with mpmath.workprec(400):
        n, d = len(X), len(X[0])
        x = [[mpmath.mpf(v) for v in row] for row in X]
        b = [mpmath.mpf(v) for v in bias_q]
        t = mpmath.mpf(tau)
        blocks = [[np.zeros((d, d)) for _ in range(n)] for _ in range(n)]
        for i in range(n):
            q = [x[i][e] + b[e] for e in range(d)]
            keys = range(i + 1)
            u = [mpmath.fsum(q[e] * x[j][e] for e in range(d)) / t for j in keys]
            top = max(u)
            w = [mpmath.exp(v - top) for v in u]
            p = [v / mpmath.fsum(w) for v in w]
            y = [mpmath.fsum(p[j] * x[j][e] for j in keys) for e in range(d)]
            for m in keys:
                for e in range(d):  # output coordinate
                    for f in range(d):  # input coordinate of x_m
                        value = p[m] * (1 if e == f else 0)
                        # dp_j/dx_m,f = p_j (du_j − Σ_l p_l du_l), du_jl/dx_m,f = (δ_im x_l,f + δ_lm q_f)/τ
                        du = [((x[j][f] if i == m else 0) + (q[f] if j == m else 0)) / t for j in keys]
                        mean_du = mpmath.fsum(p[j] * du[j] for j in keys)
                        value += mpmath.fsum(p[j] * (du[j] - mean_du) * (x[j][e] - y[e]) for j in keys)
                        blocks[i][m][e, f] = float(value)
        return blocks


def _block_inf_norm_estimate(blocks: list[list[np.ndarray]]) -> float:
    """max_i max over unit dx_m (angles, refined grids) of ‖Σ_m J_im dx_m‖₂: a lower estimate of the norm."""
    best = 0.0
    for i, row in enumerate(blocks):
        centre, width = np.zeros(i + 1), math.pi
        for _ in range(12):
            grid = np.stack(np.meshgrid(*[c + np.linspace(-width, width, 25) for c in centre], indexing="ij"), -1)
            angles = grid.reshape(-1, i + 1)
            dx = np.stack([np.cos(angles), np.sin(angles)], -1)  # [points, m, 2]
            out = sum(dx[:, m] @ row[m].T for m in range(i + 1))
            norms = np.linalg.norm(out, axis=-1)
            k = int(norms.argmax())
            centre, width = angles[k], width / 6
            best = max(best, float(norms[k]))
    return best


@pytest.mark.parametrize("bias", [1e7, 1e5, 30.0])
def test_local_mha_bound_with_huge_query_bias_is_not_below_the_400_bit_norm(bias: float) -> None:
    """The float64 softmax row moves away from the real one when |q·k|/τ is large; the bound must follow the real
    row (at bias 10^7 the old bound was 0.14 % low)."""
    X = [[1.0, 0.3], [0.2, 1.0], [0.5, -0.7]]
    eye = torch.eye(2, dtype=F64)
    biases = AttentionBiases(q=torch.tensor([[bias, 0.0]], dtype=F64))
    bound = _mha_local_jacobian_bounds(
        torch.tensor([X], dtype=F64),
        _AttentionTensors(eye[None], eye[None], eye[None], eye, tau=1.0, mask=causal_mask(3), biases=biases),
    ).upper_bound
    estimate = _block_inf_norm_estimate(_mha_jacobian_mpmath(X, [bias, 0.0], 1.0))
    assert float(bound) >= estimate, (float(bound), estimate)


@pytest.mark.parametrize(("tau", "bias"), [(1e-12, 0.0), (1.0, 1e8)])
def test_local_mha_bound_refuses_scores_beyond_the_certified_range(tau: float, bias: float) -> None:
    eye = torch.eye(2, dtype=F64)
    X = torch.tensor([[[1.0, 0.3], [0.2, 1.0], [0.5, -0.7]]], dtype=F64)
    with pytest.raises(InputError, match="scores too large"):
        _mha_local_jacobian_bounds(
            X,
            _AttentionTensors(
                eye[None],
                eye[None],
                eye[None],
                eye,
                tau=tau,
                mask=causal_mask(3),
                biases=AttentionBiases(q=torch.tensor([[bias, 0.0]], dtype=F64)),
            ),
        )
