"""Softmax, LayerNorm and RMSNorm Jacobians and their norms against dense oracles (docs/math.md T1, T6)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from attnsens.geometry.jacobians import (
    layernorm_jacobian,
    norm_jacobian_spectral_norm_upper_bound,
    rmsnorm_jacobian,
    softmax_jacobian,
    softmax_jacobian_inf_to_inf_norm,
    softmax_jacobian_spectral_norm,
)
from attnsens.theta import softmax_jacobian_inf_to_one_norm
from tests.reference.jacobian_oracles import (
    layernorm_plain,
    matrix_inf_to_inf_norm,
    matrix_inf_to_one_norm_brute,
    rmsnorm_plain,
    softmax_tempered,
    theta_brute,
)

F64 = torch.float64


@given(n=st.integers(1, 9), tau=st.floats(0.2, 5.0), scale=st.floats(0.0, 8.0), seed=st.integers(0, 2**16))
def test_softmax_jacobian_and_norms_match_dense_oracles(n: int, tau: float, scale: float, seed: int) -> None:
    u = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=F64) * scale
    p = softmax_tempered(u, tau)
    dense = torch.func.jacrev(lambda v: softmax_tempered(v, tau))(u)
    assert_close(softmax_jacobian(p, tau), dense)
    assert_close(softmax_jacobian_inf_to_inf_norm(p, tau), matrix_inf_to_inf_norm(dense))
    assert_close(softmax_jacobian_inf_to_inf_norm(p, tau), (2 * p * (1 - p)).amax() / tau)
    assert_close(softmax_jacobian_spectral_norm(p, tau), torch.linalg.matrix_norm(dense, ord=2))
    assert float(softmax_jacobian_spectral_norm(p, tau)) <= 1 / (2 * tau) + 1e-15


def test_softmax_inf_to_one_certificate_brackets_brute_force() -> None:
    tau = 0.7
    u = torch.randn(300, 7, dtype=F64) * torch.linspace(0, 6, 300, dtype=F64)[:, None]
    p = softmax_tempered(u, tau)
    brute = matrix_inf_to_one_norm_brute(softmax_jacobian(p, tau))
    assert_close(brute, theta_brute(p) / tau)  # docs/math.md T1 identity, dense
    certificate = softmax_jacobian_inf_to_one_norm(u, tau)  # the one ‖J‖_{∞→1} API (attnsens.theta)
    assert bool((certificate.lower <= brute + 1e-12).all())
    assert bool((certificate.upper >= brute - 1e-12).all())


def test_masked_keys_do_not_change_the_norms() -> None:
    p = torch.tensor([0.25, 0.0, 0.75, 0.0], dtype=F64)
    assert_close(softmax_jacobian_inf_to_inf_norm(p), softmax_jacobian_inf_to_inf_norm(p[[0, 2]]))
    assert_close(softmax_jacobian_spectral_norm(p), softmax_jacobian_spectral_norm(p[[0, 2]]))


def test_layernorm_jacobian_matches_jacrev_and_its_spectrum() -> None:
    d, eps = 7, 1e-2
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(d, generator=g, dtype=F64) * (0.05 + seed / 5)
        gamma, beta = torch.randn(d, generator=g, dtype=F64), torch.randn(d, generator=g, dtype=F64)
        dense = torch.func.jacrev(layernorm_plain)(x, gamma, beta, eps)
        assert_close(layernorm_jacobian(x, gamma, eps), dense)
        sigma2 = ((x - x.mean()) ** 2).mean() + eps
        projector = layernorm_jacobian(x, torch.ones(d, dtype=F64), eps) * sigma2.sqrt()
        expected = torch.cat([torch.zeros(1, dtype=F64), (eps / sigma2)[None], torch.ones(d - 2, dtype=F64)])
        assert_close(torch.linalg.eigvalsh(projector), expected.sort().values)
        bound = norm_jacobian_spectral_norm_upper_bound(x, gamma, eps, "layernorm")
        assert float(torch.linalg.matrix_norm(dense, ord=2)) <= float(bound) * (1 + 1e-12)


def test_rmsnorm_jacobian_matches_jacrev_and_its_spectrum() -> None:
    d, eps = 5, 3e-2
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(d, generator=g, dtype=F64) * (0.05 + seed / 5)
        gamma = torch.randn(d, generator=g, dtype=F64)
        dense = torch.func.jacrev(rmsnorm_plain)(x, gamma, eps)
        assert_close(rmsnorm_jacobian(x, gamma, eps), dense)
        r2 = (x**2).mean() + eps
        projector = rmsnorm_jacobian(x, torch.ones(d, dtype=F64), eps) * r2.sqrt()
        expected = torch.cat([(eps / r2)[None], torch.ones(d - 1, dtype=F64)])
        assert_close(torch.linalg.eigvalsh(projector), expected.sort().values)
        bound = norm_jacobian_spectral_norm_upper_bound(x, gamma, eps, "rmsnorm")
        assert float(torch.linalg.matrix_norm(dense, ord=2)) <= float(bound) * (1 + 1e-12)


def test_norm_bound_is_attained_for_constant_gain() -> None:
    x = torch.randn(3, 6, dtype=F64)
    gamma = torch.full((6,), -2.5, dtype=F64)
    for kind, jac in (("layernorm", layernorm_jacobian), ("rmsnorm", rmsnorm_jacobian)):
        exact = torch.linalg.matrix_norm(jac(x, gamma, 0.0), ord=2)
        assert_close(norm_jacobian_spectral_norm_upper_bound(x, gamma, 0.0, kind), exact)


def test_oracle_catches_a_layernorm_jacobian_without_the_rank_one_term() -> None:
    d, eps = 6, 1e-3
    x, gamma = torch.randn(d, dtype=F64), torch.randn(d, dtype=F64)
    sigma = (((x - x.mean()) ** 2).mean() + eps).sqrt()
    wrong = gamma[:, None] * (torch.eye(d, dtype=F64) - 1.0 / d) / sigma
    dense = torch.func.jacrev(lambda v: layernorm_plain(v, gamma, torch.zeros(d, dtype=F64), eps))(x)
    assert not torch.allclose(wrong, dense)
    wrong_inf = (2 * softmax_tempered(x, 1.0) * (1 - softmax_tempered(x, 1.0))).amax() / 2  # p(1−p): a wrong kernel
    assert not torch.allclose(wrong_inf, matrix_inf_to_inf_norm(softmax_jacobian(softmax_tempered(x, 1.0))))
