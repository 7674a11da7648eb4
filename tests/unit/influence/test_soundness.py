"""Soundness: the measured influence never exceeds the certified bound, and the measured decay is 1/n (§10.5)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from attnsens.influence import builtin_lnfree, certified_constant, fit_loglog_slope, measure
from attnsens.train.model import GPT, GPTConfig

GRID = (16, 32, 64, 128, 256, 512, 1024, 2048)


@pytest.fixture(scope="module")
def builtin_measured() -> pd.DataFrame:
    return measure(builtin_lnfree(), GRID, n_samples=3, seed=0)


def test_builtin_slope_is_minus_one(builtin_measured: pd.DataFrame) -> None:
    fit = fit_loglog_slope(builtin_measured)
    assert -1.15 <= fit.slope <= -0.85, fit
    assert fit.slope_ci[0] < fit.slope < fit.slope_ci[1]


def test_builtin_measured_never_exceeds_certified_bound(builtin_measured: pd.DataFrame) -> None:
    cert = certified_constant(builtin_lnfree())
    assert cert.applicable and cert.masking == "unmasked" and cert.max_length is None
    for row in builtin_measured.itertuples():
        assert row.influence_max <= cert.influence_upper_bound(row.n, tightened=True) <= cert.constant / row.n


def test_builtin_probability_bound_holds(builtin_measured: pd.DataFrame) -> None:
    """TV = ‖Δp‖₁/2 ≤ spread · C/(4n) (θ sharpening of docs/math.md §10.3)."""
    cert = certified_constant(builtin_lnfree())
    for row in builtin_measured.itertuples():
        assert 2 * row.tv_max <= 10 ** cert.log10_probability_change_upper_bound(row.n)


def _random_gpt(seed: int, **overrides: object) -> GPT:
    torch.manual_seed(seed)
    fields: dict = {
        "vocab_size": 7,
        "n_layer": 2,
        "n_head": 2,
        "d_model": 6,
        "d_ff": 11,
        "max_positions": 64,
        "norm": "none",
        "positions": "sinusoidal",
        "position_scale": 0.7,
        "causal": False,
        "activation": "gelu",
        "init_std": 0.35,
    }
    config = GPTConfig(**{**fields, **overrides})
    model = GPT(config)
    with torch.no_grad():  # non-zero biases everywhere, so the bias terms of the bound are exercised
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0.0, 0.5)
    return model.eval()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_random_models_with_biases_stay_below_the_bound(seed: int, causal: bool) -> None:
    """Large weights and biases (scores of order 1–10) at short lengths, where the bound is least slack."""
    model = _random_gpt(seed, causal=causal)
    cert = certified_constant(model)
    assert cert.applicable and cert.masking == ("causal" if causal else "unmasked")
    table = measure(model, (2, 3, 5, 8, 13), n_samples=16, seed=seed, dtype=torch.float64)
    for row in table.itertuples():
        assert row.influence_max <= cert.influence_upper_bound(row.n, tightened=True)
        assert row.influence_max <= cert.influence_upper_bound(row.n)


def test_causal_bound_decays_slower_than_one_over_n() -> None:
    cert = certified_constant(builtin_lnfree(causal=True))
    assert cert.masking == "causal" and len(cert.log_polynomial) == 2  # degree L − 1 = 1 in H_n
    scaled = [n * cert.influence_upper_bound(n) for n in (16, 256, 4096)]
    assert scaled[0] < scaled[1] < scaled[2]


def test_bound_is_attained_by_uniform_attention_without_mlp() -> None:
    """G = 0 (uniform attention), OV = I, MLP = 0: Δy_n = (v_a − v_b)/n exactly, and C = ‖OV‖·D_0 = ‖v_a − v_b‖.

    A recursion that under-counts any term would fall below the measurement here.
    """
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=2, n_layer=1, n_head=1, d_model=5, max_positions=64, norm="none", positions="none", causal=False
    )
    model = GPT(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.wte.weight.copy_(torch.tensor([[0.3, -1.0, 0.5, 0.2, 0.0], [-0.4, 0.6, 0.1, 0.0, 0.9]]))
        model.blocks[0].attn.c_attn.weight[10:].copy_(torch.eye(5))  # W_V = I (rows 2d:3d of [W_Q; W_K; W_V])
        model.blocks[0].attn.c_proj.weight.copy_(torch.eye(5))  # W_O = I
    cert = certified_constant(model)
    distance = float(torch.linalg.vector_norm(model.wte.weight[0] - model.wte.weight[1]).detach())
    assert cert.constant == pytest.approx(distance, rel=1e-6)
    table = measure(model, (3, 7, 19), n_samples=2, dtype=torch.float64)
    for row in table.itertuples():
        assert row.influence_max <= cert.influence_upper_bound(row.n)
        assert row.influence_max == pytest.approx(cert.influence_upper_bound(row.n), rel=1e-6)
