"""Empirical Jacobian-norm estimators against exact dense oracles: they must never exceed the true norm."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from attnsens.geometry.estimates import block_jacobian_norm_estimate, spectral_jacobian_norm_estimate
from tests.reference.jacobian_oracles import (
    block_inf_norm_lower_dense,
    block_inf_norm_row_sum_upper,
    block_inf_norm_scalar_tokens,
    block_inf_norm_single_input_token,
)

F64 = torch.float64


def _linear(J: torch.Tensor):
    """The linear token map with Jacobian J ``[query, d_out, key, d_in]``, batched over a leading axis."""
    return lambda X: torch.einsum("iokd,bkd->bio", J, X)


def test_scalar_tokens_estimate_matches_enumeration_and_never_exceeds_it() -> None:
    for seed in range(12):
        J = torch.randn(4, 3, 6, 1, generator=torch.Generator().manual_seed(seed), dtype=F64)
        exact = block_inf_norm_scalar_tokens(J)
        estimate = block_jacobian_norm_estimate(_linear(J), torch.zeros(1, 6, 1, dtype=F64), iterations=30, restarts=4,
                                                geometry="l2")  # fmt: skip
        assert float(estimate[0]) <= float(exact) * (1 + 1e-12)
        assert float(estimate[0]) >= 0.9 * float(exact)  # ascent from several starts gets close


def test_single_input_token_estimate_converges_to_the_spectral_norm() -> None:
    J = torch.randn(3, 5, 1, 4, dtype=F64)
    exact = block_inf_norm_single_input_token(J)
    estimate = block_jacobian_norm_estimate(_linear(J), torch.zeros(2, 1, 4, dtype=F64), iterations=80, geometry="l2")
    assert_close(estimate, exact.expand(2))


def test_estimate_lies_between_dense_lower_and_row_sum_upper() -> None:
    J = torch.randn(5, 4, 5, 3, dtype=F64)
    estimate = block_jacobian_norm_estimate(_linear(J), torch.zeros(1, 5, 3, dtype=F64), iterations=40, restarts=3,
                                            geometry="l2", chunk=2)  # fmt: skip
    assert float(estimate[0]) <= float(block_inf_norm_row_sum_upper(J))
    assert float(estimate[0]) >= 0.95 * float(block_inf_norm_lower_dense(J))


def test_rms_geometry_rescales_by_width_ratio() -> None:
    J = torch.randn(2, 6, 2, 3, dtype=F64)
    X = torch.zeros(1, 2, 3, dtype=F64)
    l2 = block_jacobian_norm_estimate(_linear(J), X, geometry="l2", generator=torch.Generator().manual_seed(1))
    rms = block_jacobian_norm_estimate(_linear(J), X, geometry="rms", generator=torch.Generator().manual_seed(1))
    assert_close(rms, l2 * (3 / 6) ** 0.5)


def test_spectral_estimate_matches_dense_spectral_norm() -> None:
    J = torch.randn(3, 4, 3, 4, dtype=F64)
    dense = torch.linalg.matrix_norm(J.reshape(12, 12), ord=2)
    estimate = spectral_jacobian_norm_estimate(_linear(J), torch.zeros(1, 3, 4, dtype=F64), iterations=300)
    assert float(estimate[0]) <= float(dense) * (1 + 1e-12)
    assert_close(estimate[0], dense, rtol=1e-6, atol=0)


def test_oracles_catch_a_wrong_estimator() -> None:
    """Meta-test: the row-sum bound is not the norm; the enumeration oracle exposes an estimator returning it."""
    J = torch.randn(3, 2, 5, 1, generator=torch.Generator().manual_seed(3), dtype=F64)
    wrong = block_inf_norm_row_sum_upper(J) * 1.0 + 0.0
    exact = block_inf_norm_scalar_tokens(J)
    assert float(wrong) > float(exact) * (1 + 1e-6)
