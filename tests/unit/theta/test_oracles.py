"""The reference oracles against closed forms and each other, and catching deliberately wrong kernels."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tests.reference.theta_oracles import (
    inf_to_one_norm_bilinear_brute_force,
    inf_to_one_norm_brute_force,
    softmax_jacobian,
    theta_float64,
    theta_fraction,
)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7, 10])
def test_uniform_closed_form(k: int) -> None:
    """Uniform over k keys: θ = 1 for even k, 1 − 1/k² for odd k (docs/math.md T1 consequences), on dyadic 1/k."""
    v = Fraction(1, 2 ** (k.bit_length() + 1))
    expected = k * v - (k % 2) * v * v
    assert theta_fraction([float(v)] * k + [0.0, 0.0]) == expected


def test_fraction_and_float64_enumeration_agree() -> None:
    rng = np.random.default_rng(5)
    for length in range(1, 13):
        p = rng.dirichlet(np.ones(length) * 0.7)
        assert abs(float(theta_fraction(p)) - theta_float64(p)) <= 1e-15


def test_brute_force_norm_equals_theta_over_tau() -> None:
    """docs/math.md T1 on the oracles themselves: max_x ‖Jx‖₁ = max_{x,y} yᵀJx = θ/τ."""
    rng = np.random.default_rng(6)
    for length in range(2, 8):
        p = rng.dirichlet(np.ones(length))
        tau = float(np.exp(rng.uniform(np.log(0.1), np.log(10))))
        jac = softmax_jacobian(p, tau)
        theta = float(theta_fraction(p))
        assert abs(inf_to_one_norm_brute_force(jac) - theta / tau) <= 1e-13 / tau
        assert abs(inf_to_one_norm_bilinear_brute_force(jac) - theta / tau) <= 1e-13 / tau


def test_meta_norm_oracle_catches_wrong_jacobian() -> None:
    """Dropping the −ppᵀ term (a plausible bug) changes the brute-force norm well beyond rounding."""
    p = np.array([0.6, 0.3, 0.1])
    wrong = np.diag(p)
    assert abs(inf_to_one_norm_brute_force(wrong) - float(theta_fraction(p))) > 1e-3


def test_meta_theta_oracle_catches_half_target() -> None:
    """For s ≠ 1 a kernel using 1/2 instead of s/2 disagrees with the oracle."""
    p = [0.3006, 0.3, 0.2, 0.2]
    s = sum(p)
    sums = [sum(p[i] for i in range(4) if mask >> i & 1) for mask in range(16)]
    wrong = s - 4 * min(abs(x - 0.5) for x in sums) ** 2
    assert abs(wrong - float(theta_fraction(p))) > 1e-9
