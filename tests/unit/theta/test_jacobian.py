"""docs/math.md T1: the brute-force ‖J_softmax(u/τ)‖_{∞→1} lies in softmax_jacobian_inf_to_one_norm's interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnsens.errors import ConfigError
from attnsens.theta import softmax_jacobian_inf_to_one_norm
from tests.reference.theta_oracles import (
    inf_to_one_norm_bilinear_brute_force,
    inf_to_one_norm_brute_force,
    softmax_jacobian,
)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_brute_force_norm_inside_interval(backend: str) -> None:
    gen = torch.Generator().manual_seed(13)
    for trial in range(40):
        length = 2 + trial % 11
        sigma = [0.5, 1.0, 2.0, 4.0, 8.0][trial % 5]
        tau = math.exp(float(torch.empty(()).uniform_(math.log(0.1), math.log(10), generator=gen)))
        u = sigma * torch.randn(length, generator=gen, dtype=torch.float64)
        cert = softmax_jacobian_inf_to_one_norm(u, tau=tau, backend=backend)
        p = torch.softmax(u / tau, -1).numpy()
        jac = softmax_jacobian(p, tau)
        norm = inf_to_one_norm_brute_force(jac)
        assert float(cert.lower) - 1e-12 <= norm <= float(cert.upper) + 1e-12
        if length <= 7:
            assert float(cert.lower) - 1e-12 <= inf_to_one_norm_bilinear_brute_force(jac) <= float(cert.upper) + 1e-12
        assert float(cert.upper - cert.lower) <= 1e-12 / tau


def test_closed_forms_and_batching() -> None:
    """Uniform scores over 2 keys: θ = 1, so the norm is 1/τ; over 3 keys: (1 − 1/9)/τ."""
    u = torch.zeros(2, 3, dtype=torch.float32)
    u[1, 2] = -torch.inf
    cert = softmax_jacobian_inf_to_one_norm(u, tau=4.0, dim=-1)
    assert float(cert.lower[1]) <= 0.25 <= float(cert.upper[1])
    assert float(cert.lower[0]) <= (8 / 9) / 4 <= float(cert.upper[0])
    assert cert.shape == (2,)
    assert float(cert.upper.max() - cert.lower.min()) < 0.1
    np.testing.assert_array_less(cert.lower.numpy() - 1e-15, cert.upper.numpy())


def test_tau_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="tau"):
        softmax_jacobian_inf_to_one_norm(torch.zeros(3), tau=0.0)
