"""The shipped pretrained models: measured slope and the reasons no certificate applies (slow)."""

from __future__ import annotations

import math

import pytest

from attnsens.influence import builtin_lnfree, certified_constant, fit_loglog_slope, measure
from attnsens.influence.experiment import run_influence

pytestmark = pytest.mark.slow


def test_smollm2_is_measured_and_explained() -> None:
    from attnsens.models import load

    adapter = load("smollm2")
    result = run_influence(adapter, (16, 32, 64, 128), name="smollm2", n_samples=2)
    text = " ".join(result.certificate.reasons)
    for failure in ("rmsnorm", "gated MLP", "rotary", "causal"):
        assert failure in text
    assert result.certificate.norm_lipschitz > 100
    assert math.isfinite(result.fit.slope)
    assert result.table.tv_max.notna().all()


def test_minilm_is_unmasked_post_layernorm() -> None:
    from attnsens.models import load

    adapter = load("minilm")
    cert = certified_constant(adapter)
    assert not cert.applicable and cert.masking == "unmasked"
    assert any("post-layernorm" in reason for reason in cert.reasons)
    table = measure(adapter, (8, 32, 128, 512), n_samples=2)
    assert table.tv_max.isna().all()  # no MLM head is loaded: influence only
    assert math.isfinite(fit_loglog_slope(table).slope)


def test_builtin_large_grid_and_causal_twin() -> None:
    grid = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    unmasked = measure(builtin_lnfree(), grid, n_samples=4, seed=1)
    assert -1.1 <= fit_loglog_slope(unmasked).slope <= -0.9
    cert = certified_constant(builtin_lnfree())
    assert all(row.influence_max <= cert.influence_upper_bound(row.n) for row in unmasked.itertuples())
    causal_model = builtin_lnfree(causal=True)
    causal = measure(causal_model, grid, n_samples=4, seed=1)
    causal_cert = certified_constant(causal_model)
    assert all(row.influence_max <= causal_cert.influence_upper_bound(row.n) for row in causal.itertuples())
