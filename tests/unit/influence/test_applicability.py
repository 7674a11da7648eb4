"""Where the theorem's assumptions fail the certificate says why instead of printing a meaningless number."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attnsens.errors import ConfigError, UnsupportedModelError
from attnsens.geometry import norm_lipschitz_upper_bound
from attnsens.influence import builtin_lnfree, certified_constant
from attnsens.models.own_gpt import gpt_layer_weights
from attnsens.train.model import GPT, GPTConfig
from attnsens.weights import NormWeights, RotaryConfig


def _gpt(**overrides: object) -> GPT:
    torch.manual_seed(0)
    fields: dict = {"vocab_size": 11, "n_layer": 2, "n_head": 2, "d_model": 6, "max_positions": 37}
    return GPT(GPTConfig(**{**fields, **overrides}))


@pytest.mark.parametrize("norm", ["pre", "post", "deepnorm"])
def test_layernorm_models_are_flagged_vacuous_with_the_lipschitz_constant(norm: str) -> None:
    model = _gpt(norm=norm, layer_norm_eps=1e-5)
    cert = certified_constant(model)
    assert not cert.applicable
    assert cert.norm_lipschitz == pytest.approx(1 / math.sqrt(1e-5), rel=1e-6)  # γ = 1 at init
    assert any("‖γ‖∞/√ε" in reason and "316.2" in reason for reason in cert.reasons)
    assert cert.log10_constant is not None and cert.log10_constant > 10  # indicative only, and vacuous
    with pytest.raises(UnsupportedModelError, match="no influence certificate"):
        cert.influence_upper_bound(64)


def test_norm_lipschitz_upper_bound_is_attained_at_constant_inputs() -> None:
    """‖γ‖∞/√ε is sharp up to 1 − 1/d: at x = c·1 the Jacobian is diag(γ)(I − 11ᵀ/d)/√ε, and its value at the
    basis vector of max|γ_k| has norm ≥ |γ_k|(1 − 1/d)/√ε."""
    gamma = torch.tensor([0.5, -2.0, 1.0, 0.25], dtype=torch.float64)
    norm = NormWeights(kind="layernorm", gamma=gamma, beta=None, eps=1e-3)
    jacobian = torch.func.jacrev(lambda x: torch.nn.functional.layer_norm(x, (4,), gamma, None, 1e-3))(
        torch.full((4,), 0.3, dtype=torch.float64)
    )
    observed = torch.linalg.matrix_norm(jacobian, ord=2)
    expected = float(norm_lipschitz_upper_bound(norm))
    assert float(observed) <= expected
    assert float(observed) >= expected * (1 - 1 / 4)


def test_learned_positions_certify_only_up_to_n_ctx() -> None:
    cert = certified_constant(_gpt(norm="none", positions="learned", causal=False))
    assert cert.applicable and cert.max_length == 37
    assert math.isfinite(cert.influence_upper_bound(37))
    with pytest.raises(ConfigError, match="37 learned positions"):
        cert.influence_upper_bound(38)


def test_sinusoidal_and_no_positions_certify_every_length() -> None:
    for positions in ("sinusoidal", "none"):
        cert = certified_constant(_gpt(norm="none", positions=positions, causal=False))
        assert cert.applicable and cert.max_length is None
        assert cert.influence_upper_bound(10**7) < cert.influence_upper_bound(10**3)


def test_causal_models_get_the_polylog_variant() -> None:
    cert = certified_constant(builtin_lnfree(causal=True))
    unmasked = certified_constant(builtin_lnfree())
    assert cert.applicable and cert.masking == "causal"
    assert cert.influence_upper_bound(2) >= unmasked.influence_upper_bound(2)
    with pytest.raises(ConfigError, match="unmasked"):
        cert.log10_length_for_probability_change(0.01)


def test_rotary_and_gated_layers_are_named() -> None:
    layers = gpt_layer_weights(builtin_lnfree())
    rotary = [
        dataclasses.replace(
            layer, attention=dataclasses.replace(layer.attention, rotary=RotaryConfig(base=1e4, rotary_dim=8))
        )
        for layer in layers
    ]
    embedding = builtin_lnfree().wte.weight.detach()
    cert = certified_constant(rotary, token_embedding=embedding)
    assert not cert.applicable and any("rotary" in r for r in cert.reasons)
    gated_mlp = dataclasses.replace(layers[0].mlp, kind="gated", activation="silu", w_gate=layers[0].mlp.w_in)
    gated = [dataclasses.replace(layers[0], mlp=gated_mlp), layers[1]]
    cert = certified_constant(gated, token_embedding=embedding)
    assert not cert.applicable and cert.log10_constant is None
    assert any("gated MLP in layer(s) [0]" in r for r in cert.reasons)


def test_norms_after_the_sublayers_give_a_reason_and_no_number() -> None:
    """OLMo-2-style blocks x + N(F(x)): the recursion does not model them, so no constant, not even indicative."""
    layers = gpt_layer_weights(builtin_lnfree())
    d = layers[1].attention.d_model
    norm = NormWeights(kind="rmsnorm", gamma=torch.ones(d), beta=None, eps=1e-6)
    out_normed = [layers[0], dataclasses.replace(layers[1], attn_out_norm=norm, mlp_out_norm=norm)]
    cert = certified_constant(out_normed, token_embedding=builtin_lnfree().wte.weight.detach())
    assert not cert.applicable and cert.log10_constant is None and cert.blocks == ()
    assert any("norms after the sublayers (x + N(F(x))) in layer(s) [1]" in r for r in cert.reasons)
    assert cert.norm_lipschitz == pytest.approx(1e3)
    with pytest.raises(UnsupportedModelError, match=r"no influence certificate: .*norms after the sublayers"):
        cert.constant()


def test_bidirectional_windows_give_a_reason_and_no_number() -> None:
    """Rows of a bidirectional window see fewer keys than the n the unmasked recursion averages over (ModernBERT's
    local layers): no constant, not even indicative, while the same layers without the window get one."""
    layers = gpt_layer_weights(builtin_lnfree())
    assert not any(layer.attention.causal for layer in layers)
    embedding = builtin_lnfree().wte.weight.detach()
    assert certified_constant(layers, token_embedding=embedding).log10_constant is not None
    attention = dataclasses.replace(layers[1].attention, sliding_window=3)
    cert = certified_constant(
        [layers[0], dataclasses.replace(layers[1], attention=attention)], token_embedding=embedding
    )
    assert not cert.applicable and cert.log10_constant is None and cert.blocks == ()
    assert any("bidirectional sliding windows in layer(s) [1]" in r for r in cert.reasons)


def test_gemma2_passes_the_gate_and_gets_reasons_not_a_number() -> None:
    from attnsens.models import load
    from tests.unit.models.tiny_models import tiny_model

    cert = certified_constant(load(tiny_model("gemma2", attn_implementation="eager")))
    assert not cert.applicable and cert.log10_constant is None
    assert any("norms after the sublayers (x + N(F(x))) in layer(s) [0, 1]" in r for r in cert.reasons)


def test_transformers_model_gets_reasons_not_a_number() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from attnsens.models import load

    torch.manual_seed(0)
    module = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=6, vocab_size=13, n_positions=29))
    cert = certified_constant(load(module))
    assert not cert.applicable and cert.log10_constant is None and cert.masking == "causal"
    text = " ".join(cert.reasons)
    assert "layernorm" in text and "causal" in text and "n ≤ 29" in text


def test_n_star_and_probability_constant() -> None:
    """n*(η) = spread·C/(2η); at n = n* the probability bound equals η."""
    cert = certified_constant(builtin_lnfree())
    log_n_star = cert.log10_length_for_probability_change(0.01)
    n_star = 10**log_n_star
    assert 10 ** cert.log10_probability_change_upper_bound(round(n_star)) == pytest.approx(0.01, rel=1e-3)
    assert cert.unembedding_spread <= 2 * float(torch.linalg.matrix_norm(builtin_lnfree().wte.weight.detach(), 2))


def test_the_certificate_prints_as_one_line() -> None:
    cert = certified_constant(builtin_lnfree())
    text = repr(cert)
    assert "\n" not in text and len(text) < 200
    assert text == (
        f"InfluenceCertificate(applicable=True, C=10^{cert.log10_constant:.4g}, masking='unmasked', layers=2)"
    )
