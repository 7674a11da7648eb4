"""Block norms and induced operator norms (docs/math.md §2.5, T3)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from attnsens.errors import ConfigError, ShapeError
from attnsens.geometry.norms import (
    block_l2_norm,
    block_rms_norm,
    token_mixing_operator_norm,
    tokenwise_linear_operator_norm,
)
from tests.reference.jacobian_oracles import block_inf_norm_row_sum_upper, block_inf_norm_scalar_tokens


def test_block_norms_closed_form() -> None:
    X = torch.tensor([[[3.0, 4.0, 0.0], [0.0, 0.0, 1.0]]], dtype=torch.float64)
    assert_close(block_l2_norm(X), torch.tensor([5.0], dtype=torch.float64))
    assert_close(block_rms_norm(X), torch.tensor([5.0 / math.sqrt(3)], dtype=torch.float64))


def test_tokenwise_operator_norm_matches_worst_token_ratio() -> None:
    W = torch.randn(5, 7, dtype=torch.float64)
    _, S, Vh = torch.linalg.svd(W)
    x = Vh[0][None, None, :]  # top right singular vector: attains the norm
    for geometry, norm in (("l2", block_l2_norm), ("rms", block_rms_norm)):
        ratio = norm(x @ W.T) / norm(x)
        assert_close(tokenwise_linear_operator_norm(W, geometry), ratio[0])
        random = torch.randn(200, 3, 7, dtype=torch.float64)
        assert bool((norm(random @ W.T) / norm(random) <= tokenwise_linear_operator_norm(W, geometry) + 1e-12).all())
    assert_close(tokenwise_linear_operator_norm(W, "rms"), S[0] * math.sqrt(7 / 5))


def test_token_mixing_norm_is_exact_against_enumeration() -> None:
    A = torch.randn(4, 5, 5, dtype=torch.float64)
    J = torch.eye(2, dtype=torch.float64)  # any d: the operator A ⊗ I
    dense = torch.einsum("bij,oc->biojc", A, J[:, :1])  # d_in = 1 slice gives the exact enumeration oracle
    assert_close(token_mixing_operator_norm(A), block_inf_norm_scalar_tokens(dense))


def test_row_stochastic_mixing_is_nonexpansive() -> None:
    P = torch.softmax(torch.randn(6, 11, 11, dtype=torch.float64), dim=-1)
    assert_close(token_mixing_operator_norm(P), torch.ones(6, dtype=torch.float64))
    X = torch.randn(6, 11, 3, dtype=torch.float64)
    assert bool((block_rms_norm(P @ X) <= block_rms_norm(X) + 1e-12).all())
    dense = torch.einsum("bij,oc->biojc", P, torch.eye(3, dtype=torch.float64))
    assert bool((block_inf_norm_row_sum_upper(dense) <= 1 + 1e-12).all())


def test_bad_inputs_raise_domain_errors() -> None:
    with pytest.raises(ShapeError):
        block_l2_norm(torch.ones(3))
    with pytest.raises(ConfigError):
        tokenwise_linear_operator_norm(torch.ones(2, 2), "frobenius")  # type: ignore[arg-type]
