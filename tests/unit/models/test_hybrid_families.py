"""Hybrids: the attention blocks of Bamba, Jamba, LFM2 and Granite 4 are read, audited and bounded, their Mamba and
convolution blocks named as not covered, and an attention block whose MLP is a mixture of experts refused."""

from __future__ import annotations

import pytest
import torch

import attnsens.models as M
from attnsens.errors import UnsupportedModelError, WeightsFidelityError
from attnsens.study.bounds import bound_model
from tests.unit.models.tiny_models import HYBRID_FAMILIES, VOCAB, eager_attentions, tiny_model

IDS = torch.randint(2, VOCAB, (2, 17), generator=torch.Generator().manual_seed(5))
IDENTIFICATION = ("attention_identification", "mlp_identification")
ATTENTION_BLOCKS = [1, 3]  # of the tests' 4 blocks (tiny_models.HYBRID_FAMILIES)


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_the_attention_blocks_are_the_layers_and_their_rows_are_the_eager_ones(family: str) -> None:
    model = tiny_model(family)
    adapter = M.load(model)
    assert adapter.family == family and adapter.spec.n_layer == 2
    assert adapter.block_indices() == ATTENTION_BLOCKS
    reference = [a for a in eager_attentions(model, IDS) if a is not None]
    assert len(reference) == 2
    chunks = list(adapter.stream_attention(IDS))
    assert sorted({chunk.layer for chunk in chunks}) == [0, 1]
    for chunk in chunks:
        torch.testing.assert_close(chunk.probs, reference[chunk.layer], rtol=0, atol=1e-4)
    _, results = M.weights_fidelity(adapter, IDS)
    assert max(r.relative_error for r in results) < 1e-5


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_bounds_cover_the_attention_blocks_and_name_the_others(family: str) -> None:
    adapter = M.load(tiny_model(family))
    note = adapter.not_bounded
    assert note is not None and "0 = block 1, 1 = block 3" in note and "other 2 blocks" in note
    table = bound_model(adapter, IDS[:1], n_queries=4, iterations=6)
    layers = table[table["head"] == -1]
    assert list(layers["layer"]) == [0, 1]
    assert (layers["mha_jacobian_estimate"] <= layers["mha_local_jacobian_upper_bound"]).all()
    assert (layers["block_jacobian_estimate"] <= layers["residual_jacobian_upper_bound"]).all()
    # No product of the chain rule runs across blocks it does not cover.
    assert layers["ln_only_product_upper_bound"].isna().all()
    assert layers["expansion_remainder_upper_bound"].isna().all()


def test_a_dense_model_names_no_block_as_not_covered() -> None:
    assert M.load(tiny_model("llama")).not_bounded is None


def test_the_gate_refuses_a_hybrid_read_at_the_wrong_blocks() -> None:
    """LFM2's attention blocks read with the MLP of the block before each (a convolution block's): a reading off
    by one block fails the gate at the first layer."""
    model = tiny_model("lfm2")
    adapter = M.load(model)
    blocks, read_mlp = list(model.model.layers), adapter._mlp
    adapter._mlp = lambda block: read_mlp(blocks[blocks.index(block) - 1])  # type: ignore[method-assign]
    adapter.reread_layers()
    with pytest.raises(WeightsFidelityError, match="layer 0 mlp"):
        M.check_weights_fidelity(adapter, IDS)


def test_jamba_s_attention_blocks_with_a_mixture_of_experts_are_bounded_locally() -> None:
    """Jamba's expert layers (here its attention blocks 1 and 3): the softmax over all experts, its top-k weights
    not renormalized; identified by the gate part by part, bounded at the audited input (docs/math.md T7)."""
    model = tiny_model("jamba", expert_layer_offset=1)
    adapter = M.load(model)
    assert all(type(layer.mlp).__name__ == "MoEWeights" for layer in adapter.layers)
    assert {layer.mlp.gate_mode for layer in adapter.layers} == {"softmax"}
    reference = [a for a in eager_attentions(model, IDS) if a is not None]
    for chunk in adapter.stream_attention(IDS):
        torch.testing.assert_close(chunk.probs, reference[chunk.layer], rtol=0, atol=1e-4)
    _, results = M.weights_fidelity(adapter, IDS)
    assert max(r.relative_error for r in results) < 1e-5
    table = bound_model(adapter, IDS[:1], n_queries=4, iterations=8)
    layers = table[table["head"] == -1]
    assert (layers["block_jacobian_estimate"] <= layers["residual_jacobian_upper_bound"]).all()
    assert (layers["block_lipschitz_upper_bound"] == float("inf")).all()


def test_granite_4_with_a_mixture_of_experts_beside_its_dense_mlp_is_audited_but_not_bounded() -> None:
    model = tiny_model("granitemoehybrid", num_local_experts=2)
    adapter = M.load(model)
    reference = [a for a in eager_attentions(model, IDS) if a is not None]
    for chunk in adapter.stream_attention(IDS):
        torch.testing.assert_close(chunk.probs, reference[chunk.layer], rtol=0, atol=1e-4)
    with pytest.raises(UnsupportedModelError, match="granitemoehybrid: block 1's feed-forward is a mixture of experts"):
        bound_model(adapter, IDS[:1])


def test_granite_4_without_rope_is_read_without_it() -> None:
    adapter = M.load(tiny_model("granitemoehybrid", position_embedding_type=None))
    assert all(layer.attention.rotary is None for layer in adapter.layers)
    M.check_weights_fidelity(adapter, IDS)


def test_bounds_and_audit_of_a_hybrid_name_the_blocks_they_leave_out(tmp_path) -> None:
    from typer.testing import CliRunner

    from attnsens.cli import app

    runner = CliRunner()
    tiny_model("lfm2").save_pretrained(tmp_path / "lfm2")
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str(i) for i in range(3, 19)))
    note = "its 2 attention blocks (0 = block 1, 1 = block 3); its other 2 blocks hold gated short convolutions"
    bounds = runner.invoke(app, ["bounds", str(tmp_path / "lfm2"), "--ids", str(ids), "--seq-len", "12",
                                 "--queries", "1", "--iterations", "1"])  # fmt: skip
    assert bounds.exit_code == 0, bounds.output
    assert note in " ".join(bounds.output.split())
    audit = runner.invoke(app, ["audit", str(tmp_path / "lfm2"), "--ids", str(ids), "--out", str(tmp_path / "out")])
    assert audit.exit_code == 0, audit.output
    assert note in " ".join(audit.output.split())


def test_falcon_h1_bounds_its_attention_and_mlp_beside_the_mixer_and_no_block() -> None:
    """Falcon-H1 runs a Mamba-2 mixer beside the attention in every block: its attention (μP multipliers folded
    in) and MLP pass the gate and are bounded, the block columns stay empty, and the adapter says why."""
    model = tiny_model("falcon_h1")
    adapter = M.load(model)
    assert type(adapter).__name__ == "FalconH1Adapter" and adapter.spec.n_layer == 4
    assert (
        adapter.not_bounded is not None and "Mamba-2 mixer beside the attention in every block" in adapter.not_bounded
    )
    reference = eager_attentions(model, IDS)
    for chunk in adapter.stream_attention(IDS):
        torch.testing.assert_close(chunk.probs, reference[chunk.layer], rtol=0, atol=1e-4)
    _, results = M.weights_fidelity(adapter, IDS)
    assert {r.field for r in results if r.layer == 0} == {"attn_norm", "attention", "mlp", *IDENTIFICATION}
    assert max(r.relative_error for r in results) < 1e-5
    table = bound_model(adapter, IDS[:1], n_queries=4, iterations=8)
    layers = table[table["head"] == -1]
    assert (layers["mha_jacobian_estimate"] <= layers["mha_local_jacobian_upper_bound"]).all()
    assert (layers["mha_local_jacobian_upper_bound"] <= layers["mha_lipschitz_upper_bound"]).all()
    assert layers["ffn_lipschitz_upper_bound"].notna().all()
    for column in ("residual_jacobian_upper_bound", "block_lipschitz_upper_bound", "block_jacobian_estimate"):
        assert layers[column].isna().all(), column


@pytest.mark.parametrize(
    ("name", "field", "mutate"),
    [
        (
            "attention_in_multiplier",
            "attention",
            lambda a: _scaled(a, "attention", w_q=1 / 0.7, w_k=1 / 0.7, w_v=1 / 0.7),
        ),
        ("key_multiplier", "attention", lambda a: _scaled(a, "attention", w_k=1 / 1.3)),
        ("attention_out_multiplier", "attention", lambda a: _scaled(a, "attention", w_o=1 / 0.8)),
        ("mlp gate multiplier", "mlp", lambda a: _scaled(a, "mlp", w_gate=1 / 1.2)),
        ("mlp down multiplier", "mlp", lambda a: _scaled(a, "mlp", w_out=1 / 0.9)),
    ],
)
def test_the_gate_refuses_falcon_h1_read_without_one_of_its_multipliers(name: str, field: str, mutate) -> None:
    adapter = M.load(tiny_model("falcon_h1"))
    mutate(adapter)
    with pytest.raises(WeightsFidelityError) as caught:
        M.check_weights_fidelity(adapter, IDS)
    assert (caught.value.layer, caught.value.field) == (0, field), name


def test_a_block_with_a_branch_beside_its_attention_has_no_forward_or_block_bound() -> None:
    from attnsens.errors import ConfigError
    from attnsens.geometry import block_lipschitz_upper_bound, block_local_jacobian_bounds
    from attnsens.geometry.layers import block_forward

    layer = M.load(tiny_model("falcon_h1")).layers[0]
    x = torch.randn(1, 5, layer.attention.d_model, dtype=torch.float64)
    for call in (lambda: block_forward(x, layer), lambda: block_local_jacobian_bounds(x, layer),
                 lambda: block_lipschitz_upper_bound(layer)):  # fmt: skip
        with pytest.raises(ConfigError, match="Mamba-2 mixer beside the attention"):
            call()


def _scaled(adapter: M.ModelAdapter, part: str, **factors: float) -> None:
    """Layer 0's ``part`` (attention or mlp) with each named weight times its factor: a multiplier undone."""
    from dataclasses import replace

    layers = list(adapter.layers)
    old = getattr(layers[0], part)
    layers[0] = replace(layers[0], **{part: replace(old, **{k: getattr(old, k) * f for k, f in factors.items()})})
    adapter._layers = layers


def test_the_weights_file_keeps_the_branch_beside_the_attention(tmp_path) -> None:
    """A Falcon-H1 layer read back from the weights file still names its Mamba-2 mixer: a file that dropped it would
    bound blocks (and propagate a stream through them) whose mixer it never saw. Weights alone cannot give the
    layers' inputs, so bounding them is refused in one line."""
    from attnsens.errors import ConfigError
    from attnsens.store.layer_weights import load_layer_weights, save_layer_weights

    layers = M.load(tiny_model("falcon_h1")).layers
    back = load_layer_weights(save_layer_weights(layers, tmp_path / "w.safetensors"))
    assert [layer.beside_attention for layer in back] == ["a Mamba-2 mixer"] * 4
    with pytest.raises(ConfigError, match="layer 0: its block adds a Mamba-2 mixer beside the attention"):
        bound_model(back, seq_len=9, n_queries=2, iterations=3)


def test_a_hybrid_whose_blocks_hold_no_attention_is_refused_by_name() -> None:
    """Jamba's first attention block is block 4 by default: a model of 2 blocks has none."""
    model = tiny_model("jamba", num_hidden_layers=2, attn_layer_period=8, attn_layer_offset=4)
    with pytest.raises(UnsupportedModelError, match=r"jamba: none of its 2 blocks holds attention .*Mamba mixers"):
        M.load(model)


def test_a_model_without_any_attention_layer_is_refused_as_such() -> None:
    from transformers import MambaConfig, MambaForCausalLM

    from tests.unit.models.tiny_models import stock_config

    sizes = {"num_hidden_layers": 2, "hidden_size": 16, "state_size": 4, "intermediate_size": 32}
    config = stock_config(MambaConfig, attn_implementation="eager", **sizes)
    with pytest.raises(UnsupportedModelError, match="mamba: attnsens finds no attention layer in it"):
        M.load(MambaForCausalLM(config).eval())
