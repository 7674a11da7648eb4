"""attnsens' own GPT: explicit attention vs torch SDPA, hooks, masking, variants, normalized weights."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.nn import functional as F

from attnsens.errors import ConfigError, ShapeError
from attnsens.models.own_gpt import gpt_layer_weights
from attnsens.train.model import GPT, GPTConfig, preset, sinusoidal_position_embeddings

BATCH, QUERY, VOCAB, HEAD, D_HEAD, LAYERS = 3, 7, 11, 3, 5, 2


def micro_config(**overrides: object) -> GPTConfig:
    base = dict(vocab_size=VOCAB, n_layer=LAYERS, n_head=HEAD, d_model=HEAD * D_HEAD, d_ff=13, max_positions=17)
    return GPTConfig(**{**base, **overrides})


def tokens(seed: int = 0, query: int = QUERY) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, query), generator=torch.Generator().manual_seed(seed))


def capture(model: GPT, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every hook point's output, by name."""
    seen: dict[str, torch.Tensor] = {}
    handles = [
        module.register_forward_hook(lambda _m, _i, out, name=name: seen.__setitem__(name, out.detach()))
        for name, module in model.named_modules()
        if name.split(".")[-1].startswith("hook_")
    ]
    with torch.no_grad():
        model(input_ids)
    for handle in handles:
        handle.remove()
    return seen


@pytest.mark.parametrize("causal", [True, False])
def test_explicit_attention_matches_torch_sdpa(causal: bool) -> None:
    model = GPT(micro_config(causal=causal)).eval()
    seen = capture(model, tokens())
    for layer in range(LAYERS):
        q, k, v = (seen[f"blocks.{layer}.attn.hook_{name}"] for name in "qkv")
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(seen[f"blocks.{layer}.attn.hook_z"], expected, rtol=1e-5, atol=1e-6)


def test_hook_points_exist_with_documented_shapes() -> None:
    seen = capture(GPT(micro_config()).eval(), tokens())
    d_model = HEAD * D_HEAD
    per_head = (BATCH, HEAD, QUERY, D_HEAD)
    expected = {"hook_final": (BATCH, QUERY, d_model)}
    for i in range(LAYERS):
        for name in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"):
            expected[f"blocks.{i}.{name}"] = (BATCH, QUERY, d_model)
        expected[f"blocks.{i}.attn.hook_input"] = (BATCH, QUERY, d_model)
        expected[f"blocks.{i}.mlp.hook_input"] = (BATCH, QUERY, d_model)
        for name in ("q", "k", "v", "z"):
            expected[f"blocks.{i}.attn.hook_{name}"] = per_head
        expected[f"blocks.{i}.attn.hook_scores"] = (BATCH, HEAD, QUERY, QUERY)
        expected[f"blocks.{i}.attn.hook_pattern"] = (BATCH, HEAD, QUERY, QUERY)
    assert {name: tuple(t.shape) for name, t in seen.items()} == expected


def test_pattern_rows_are_causal_probabilities() -> None:
    pattern = capture(GPT(micro_config()).eval(), tokens())["blocks.1.attn.hook_pattern"]
    torch.testing.assert_close(pattern.sum(-1), torch.ones(BATCH, HEAD, QUERY))
    future = torch.ones(QUERY, QUERY, dtype=torch.bool).triu(1)
    assert torch.all(pattern[..., future] == 0)
    assert torch.all(pattern[..., ~future] > 0)


@pytest.mark.parametrize("causal", [True, False])
def test_changing_a_late_token_reaches_earlier_positions_only_without_mask(causal: bool) -> None:
    model = GPT(micro_config(causal=causal)).eval()
    ids = tokens()
    changed = ids.clone()
    changed[:, 4] = (changed[:, 4] + 1) % VOCAB
    with torch.no_grad():
        delta = (model(ids) - model(changed)).abs().amax(dim=(0, 2))  # per query position
    if causal:
        assert torch.all(delta[:4] == 0) and torch.all(delta[4:] > 0)
    else:
        assert torch.all(delta > 0)


@pytest.mark.parametrize(
    ("norm", "positions", "activation", "bias"),
    [
        *itertools.product(
            ["pre", "post", "deepnorm", "none"], ["learned", "sinusoidal", "none"], ["gelu_tanh", "relu"], [True]
        ),
        ("pre", "learned", "gelu", False),
        ("post", "sinusoidal", "gelu", False),
    ],
)
def test_every_variant_runs_trains_and_keeps_the_logit_shape(
    norm: str, positions: str, activation: str, bias: bool
) -> None:
    model = GPT(micro_config(norm=norm, positions=positions, activation=activation, bias=bias))
    ids = tokens()
    logits = model(ids)
    assert logits.shape == (BATCH, QUERY, VOCAB) and torch.isfinite(logits).all()
    loss = model.loss(ids[:, :-1], ids[:, 1:])
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    has_ln = any("ln_" in name for name, _ in model.named_parameters())
    assert has_ln == (norm != "none")


def test_loss_is_mean_cross_entropy_of_the_logits() -> None:
    model = GPT(micro_config()).eval()
    ids, targets = tokens(1), tokens(2)
    logits = model(ids)
    expected = -torch.log_softmax(logits, -1).gather(-1, targets[..., None]).mean()
    torch.testing.assert_close(model.loss(ids, targets), expected)


def test_large_preset_is_gpt2_large_exactly_without_allocating() -> None:
    with torch.device("meta"):
        model = GPT(preset("large"))
    assert model.n_params() == 774_030_080
    assert model.config.tau == 8.0 and model.config.d_ff == 5120
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.parametrize(("name", "expected"), [("small", 124_439_808), ("medium", 354_823_168)])
def test_small_and_medium_presets_match_gpt2_counts(name: str, expected: int) -> None:
    with torch.device("meta"):
        assert GPT(preset(name)).n_params() == expected


def test_deepnorm_constants_and_initialization_gains() -> None:
    config = micro_config(norm="deepnorm", n_layer=6, d_model=120, n_head=4, d_ff=240)
    assert config.deepnorm_alpha == pytest.approx(12**0.25) and config.deepnorm_beta == pytest.approx(48**-0.25)
    model = GPT(config)
    weight = model.blocks[0].attn.c_attn.weight
    xavier = math.sqrt(2.0 / (120 + 120))
    assert weight[:120].std().item() == pytest.approx(xavier, rel=0.1)  # W_Q keeps gain 1
    assert weight[240:].std().item() == pytest.approx(config.deepnorm_beta * xavier, rel=0.1)  # W_V gain β
    assert [layer.residual_scale for layer in gpt_layer_weights(model)] == [pytest.approx(12**0.25)] * 6


def test_residual_projections_use_gpt2_scaling() -> None:
    model = GPT(micro_config(n_layer=8, d_model=96, n_head=4, d_ff=384, init_std=0.02))
    assert model.blocks[0].mlp.c_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.1)
    assert model.blocks[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_sinusoidal_positions_closed_form_and_any_length() -> None:
    table = sinusoidal_position_embeddings(3, 4, scale=0.5)
    t = torch.arange(3.0)
    expected = 0.5 * torch.stack([torch.sin(t), torch.cos(t), torch.sin(t / 100), torch.cos(t / 100)], dim=-1)
    torch.testing.assert_close(table, expected)
    model = GPT(micro_config(positions="sinusoidal", max_positions=5))
    assert model(tokens(query=23)).shape == (BATCH, 23, VOCAB)


def test_learned_positions_refuse_sequences_beyond_max_positions() -> None:
    with pytest.raises(ShapeError, match="max_positions=17"):
        GPT(micro_config())(tokens(query=18))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_model": 16}, "divisible by n_head"),
        ({"norm": "sandwich"}, "norm must be one of"),
        ({"n_layer": 0}, "n_layer must be a positive integer"),
        ({"dropout": 1.0}, "dropout"),
        ({"positions": "rotary"}, "positions must be one of"),
    ],
)
def test_invalid_configs_raise_config_error(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        micro_config(**overrides)


def test_unknown_preset_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="tiny"):
        preset("huge")


def test_input_ids_must_be_integer_matrix() -> None:
    with pytest.raises(ShapeError, match=r"\[batch, query\]"):
        GPT(micro_config())(torch.zeros(3, 4))
