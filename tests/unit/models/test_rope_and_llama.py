"""Llama-family correctness: every transformers RoPE type, gate and attention biases, checked against the HF block."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import attnsens.models as M
from attnsens.errors import ConfigError, ShapeError, UnsupportedModelError, WeightsFidelityError
from attnsens.geometry.attention import apply_rotary, rotary_inverse_frequencies
from attnsens.models.hf import rotary_of
from attnsens.store.layer_weights import load_layer_weights, save_layer_weights
from attnsens.study.bounds import bound_model
from tests.unit.models.tiny_models import VOCAB, tiny_model

THETA = 500.0
ROPES = {
    "linear": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 10},
    "yarn_mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 10, "mscale": 2.0,
                    "mscale_all_dim": 1.0, "beta_fast": 8.0, "beta_slow": 0.5},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 12},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3], "long_factor": [2.0, 2.5, 3.5],
                 "original_max_position_embeddings": 10},
}  # fmt: skip


def _llama(rope: str | None = None, **config) -> torch.nn.Module:
    if rope is not None:
        config["rope_parameters"] = {**ROPES[rope], "rope_theta": THETA}
    return tiny_model("llama", **config)


def _ids(n: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("rope", ROPES)
@pytest.mark.parametrize("n", [7, 40, 90])
def test_inverse_frequencies_match_transformers(rope: str, n: int) -> None:
    config = LlamaConfig(
        hidden_size=36, num_attention_heads=6, max_position_embeddings=41,
        rope_parameters={**ROPES[rope], "rope_theta": THETA},
    )  # fmt: skip
    expected, _ = ROPE_INIT_FUNCTIONS[ROPES[rope]["rope_type"]](config, None, seq_len=n)
    got = rotary_inverse_frequencies(rotary_of(config, 6), n)
    torch.testing.assert_close(got, expected.double(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("rope", ROPES)
def test_scaled_rope_stays_a_rotation(rope: str) -> None:
    config = LlamaConfig(hidden_size=36, num_attention_heads=6, rope_parameters={**ROPES[rope], "rope_theta": THETA})
    x = torch.randn(3, 23, 6, dtype=torch.float64)
    rotated = apply_rotary(x, rotary_of(config, 6))
    torch.testing.assert_close(torch.linalg.vector_norm(rotated, dim=-1), torch.linalg.vector_norm(x, dim=-1))


@pytest.mark.parametrize("rope", ROPES)
def test_every_rope_type_passes_the_gate(rope: str) -> None:
    adapter = M.load(_llama(rope))
    assert adapter.layers[0].attention.rotary.rope_type == ROPES[rope]["rope_type"]
    for n in (9, 37):  # below and above the pretraining context of yarn, llama3 and longrope
        _, results = M.weights_fidelity(adapter, _ids(n))
        assert max(r.relative_error for r in results) < 1e-5


def test_yarn_attention_factor_is_folded_into_the_temperature() -> None:
    model = _llama("yarn_mscale")
    adapter = M.load(model)
    m = model.model.rotary_emb.attention_scaling
    assert m != 1.0
    attention = adapter.layers[0].attention
    assert attention.tau == pytest.approx(1.0 / (model.model.layers[0].self_attn.scaling * m * m))
    adapter.layers[0] = replace(adapter.layers[0], attention=replace(attention, tau=attention.tau * m * m))
    with pytest.raises(WeightsFidelityError, match="layer 0 attention"):
        M.check_weights_fidelity(adapter, _ids(11))


WRONG_ROPES = [("linear", {"factor": 2.0}), ("llama3", {"factor": 4.0}), ("yarn", {"rope_type": "default"}),
               ("longrope", {"base": 600.0})]  # fmt: skip


@pytest.mark.parametrize(("rope", "change"), WRONG_ROPES)
def test_the_gate_refuses_a_wrong_rope_factor(rope: str, change: dict) -> None:
    adapter = M.load(_llama(rope))
    layer = adapter.layers[1]
    rotary = replace(layer.attention.rotary, **change)
    adapter.layers[1] = replace(layer, attention=replace(layer.attention, rotary=rotary))
    with pytest.raises(WeightsFidelityError) as caught:
        bound_model(adapter, _ids(13), n_queries=2, iterations=2)
    assert (caught.value.layer, caught.value.field) == (1, "attention")


def test_an_unknown_rope_type_is_refused_by_name_while_rows_stay_auditable() -> None:
    model = _llama("linear")
    model.config.rope_parameters["rope_type"] = "proportional"
    adapter = M.load(model)
    chunks = list(adapter.stream_attention(_ids(5)))
    assert chunks and chunks[0].probs.shape[-1] == 5
    with pytest.raises(UnsupportedModelError, match="'proportional'"):
        bound_model(adapter, _ids(5))


def test_an_attention_factor_on_a_partial_rotary_is_refused() -> None:
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 10, "rope_theta": THETA,
            "partial_rotary_factor": 0.4}  # fmt: skip
    adapter = M.load(tiny_model("gpt_neox", rope_parameters=rope, rotary_pct=0.4))
    with pytest.raises(UnsupportedModelError, match="attention factor"):
        M.check_weights_fidelity(adapter, _ids(5))


@pytest.mark.parametrize(("family", "rotating"), [("llama", 6), ("starcoder2", 6), ("cohere", 6), ("stablelm", 2)])
def test_the_rotating_dimensions_are_the_models_own(family: str, rotating: int) -> None:
    """A partial_rotary_factor of 0.34 in rope_parameters: Llama's, StarCoder 2's and Cohere's default RoPE ignore
    it and rotate all 6 dimensions of a head, StableLM's rotates int(0.34 × 6) = 2. attnsens rotates what the
    model's frequency table holds, so the gate passes either way (read from the config alone, it refused the
    first three with a relative error near 1)."""
    rope = {"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": 0.34}
    overrides = {"hidden_size": 36} if family == "stablelm" else {}  # six heads of 6 dimensions, as the others
    adapter = M.load(tiny_model(family, rope_parameters=rope, **overrides))
    assert adapter.spec.d_head == 6
    assert [layer.attention.rotary.rotary_dim for layer in adapter.layers] == [rotating, rotating]
    M.check_weights_fidelity(adapter, _ids(13))


@pytest.mark.parametrize("family", ["phi", "gpt_neox"])
def test_an_odd_number_of_rotating_dimensions_is_refused_by_the_gate(family: str) -> None:
    """A partial rotary of 0.4 on heads of 4 dimensions rotates int(1.6) = 1 of them, which no RoPE pairs: the gate
    refuses it (dynamic RoPE too, whose scaled base would otherwise divide by zero), while the rows stay
    auditable."""
    rope = {"rope_type": "dynamic", "factor": 3.0, "rope_theta": 100.0, "partial_rotary_factor": 0.4}
    extra = {"rotary_pct": 0.4} if family == "gpt_neox" else {"num_key_value_heads": 1}
    model = tiny_model(family, num_attention_heads=1, hidden_size=4, rope_parameters=rope, **extra)
    adapter = M.load(model)
    assert list(adapter.stream_attention(_ids(6)))
    with pytest.raises(ShapeError, match="rotary_dim must be even"):
        M.check_weights_fidelity(adapter, _ids(6))


def test_dynamic_rope_over_two_dimensions_is_refused_by_name() -> None:
    rotary = M.RotaryConfig(base=100.0, rotary_dim=2, rope_type="dynamic", factor=3.0, original_max_positions=4)
    with pytest.raises(UnsupportedModelError, match="dynamic NTK RoPE over 2 rotating dimensions"):
        rotary_inverse_frequencies(rotary, 9)


@pytest.mark.parametrize("config", [{"mlp_bias": True}, {"attention_bias": True, "mlp_bias": True}])
def test_llama_biases_pass_the_gate_and_a_dropped_gate_bias_is_refused(config: dict) -> None:
    adapter = M.load(_llama("llama3", **config))
    layer = adapter.layers[0]
    assert layer.mlp.b_gate is not None and (layer.attention.b_q is not None) == ("attention_bias" in config)
    _, results = M.weights_fidelity(adapter, _ids(13))
    assert max(r.relative_error for r in results) < 1e-5
    adapter.layers[0] = replace(layer, mlp=replace(layer.mlp, b_gate=None))
    with pytest.raises(WeightsFidelityError, match="layer 0 mlp"):
        M.check_weights_fidelity(adapter, _ids(13))


def test_scaled_rope_and_gate_bias_survive_the_weights_file(tmp_path) -> None:
    layers = M.load(_llama("longrope", mlp_bias=True)).layers
    back = load_layer_weights(save_layer_weights(layers, tmp_path / "w.safetensors"))
    assert back[1].attention.rotary == layers[1].attention.rotary
    torch.testing.assert_close(back[1].mlp.b_gate, layers[1].mlp.b_gate)
    table = bound_model(back, seq_len=11, n_queries=2, iterations=3)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["mha_jacobian_estimate"] <= layer_rows["mha_local_jacobian_upper_bound"]).all()
    assert (layer_rows["block_jacobian_estimate"] <= layer_rows["residual_jacobian_upper_bound"]).all()


@pytest.mark.parametrize(
    "bad",
    [{"rope_type": "ntk"}, {"rope_type": "yarn"}, {"rope_type": "llama3", "original_max_positions": 8,
     "low_freq_factor": 4.0, "high_freq_factor": 1.0}, {"rope_type": "longrope", "original_max_positions": 8,
     "short_factor": (1.0,), "long_factor": (1.0, 2.0, 3.0)}, {"factor": 0.0}],
)  # fmt: skip
def test_rotary_config_validates(bad: dict) -> None:
    with pytest.raises(ConfigError):
        M.RotaryConfig(base=THETA, rotary_dim=6, **bad)
