"""Falcon in its block arrangements (multi-query + parallel as Falcon-7B, the new decoder architecture of
Falcon-40B with one or two LayerNorms, sequential multi-head), with RoPE or ALiBi: rows, gate, bounds."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import attnsens.models as M
from attnsens.errors import WeightsFidelityError
from attnsens.geometry.attention import mha_forward
from attnsens.study.bounds import bound_model
from tests.unit.models.tiny_models import VOCAB, spread_weights

IDS = torch.randint(2, VOCAB, (2, 11), generator=torch.Generator().manual_seed(5))
VARIANTS = {
    "7b": {"multi_query": True, "parallel_attn": True, "bias": False},
    "40b": {"new_decoder_architecture": True, "num_kv_heads": 2, "num_ln_in_parallel_attn": 2, "parallel_attn": True,
            "bias": False},
    "40b_one_norm": {"new_decoder_architecture": True, "num_kv_heads": 2, "num_ln_in_parallel_attn": 1,
                     "parallel_attn": True, "bias": False},
    "sequential": {"multi_query": False, "parallel_attn": False, "bias": True},
    "alibi": {"multi_query": False, "parallel_attn": False, "bias": True, "alibi": True},
}  # fmt: skip


def _falcon(variant: str, implementation: str) -> torch.nn.Module:
    from transformers import FalconConfig, FalconForCausalLM

    torch.manual_seed(0)
    config = FalconConfig(
        num_hidden_layers=2, num_attention_heads=4, hidden_size=32, vocab_size=VOCAB, max_position_embeddings=41,
        attn_implementation=implementation, **VARIANTS[variant],
    )  # fmt: skip
    model = FalconForCausalLM(config).eval()
    spread_weights(model)
    return model


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("variant", ["7b", "40b", "40b_one_norm", "sequential"])
def test_rotary_falcon_rows_match_eager_attention_and_the_gate_passes(variant: str, implementation: str) -> None:
    """The reference is an eager twin built with the same weights: transformers' Falcon keeps the sdpa-built mask
    when switched to eager afterwards, which its eager path would misread."""
    with torch.no_grad():
        reference = _falcon(variant, "eager")(IDS, output_attentions=True).attentions
    adapter = M.load(_falcon(variant, implementation))
    for chunk in adapter.stream_attention(IDS, chunk_size=4):
        index = chunk.query_positions[:, None, :, None].expand(-1, len(chunk.heads), -1, IDS.shape[1])
        torch.testing.assert_close(chunk.probs, torch.gather(reference[chunk.layer], 2, index), rtol=1e-5, atol=1e-6)
    _, results = M.weights_fidelity(adapter, IDS)
    assert max(r.relative_error for r in results) < 1e-5


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_alibi_falcon_rows_follow_the_implementation_the_model_runs(implementation: str) -> None:
    """Falcon up to transformers 5.24 adds ALiBi twice under eager attention and once under sdpa, from 5.25 once
    under both: the audit reports the rows the model computes, and the bounds use the slopes that reproduce its
    blocks (2m/√d or m/√d)."""
    model = _falcon("alibi", implementation)
    adapter = M.load(model)
    rows = {chunk.layer: chunk.probs for chunk in adapter.stream_attention(IDS)}
    inputs = adapter.layer_inputs(IDS)
    for layer, weights in enumerate(adapter.layers):
        own = mha_forward(inputs[layer].attention_input.double(), weights.attention).probabilities
        torch.testing.assert_close(rows[layer], own.float(), rtol=1e-5, atol=1e-6)
    if implementation == "eager":
        with torch.no_grad():
            reference = model(IDS, output_attentions=True).attentions
        for layer, probs in rows.items():
            torch.testing.assert_close(probs, reference[layer], rtol=1e-5, atol=1e-6)
    M.check_weights_fidelity(adapter, IDS)
    halved = replace(adapter.layers[0].attention, alibi_slopes=adapter.layers[0].attention.alibi_slopes / 2)
    adapter.layers[0] = replace(adapter.layers[0], attention=halved)
    with pytest.raises(WeightsFidelityError, match="layer 0 attention"):
        M.check_weights_fidelity(adapter, IDS)


@pytest.mark.parametrize("variant", ["7b", "40b", "alibi"])
def test_bounds_of_falcon_hold(variant: str) -> None:
    table = bound_model(M.load(_falcon(variant, "sdpa")), IDS[:1], n_queries=4, iterations=8)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["mha_jacobian_estimate"] <= layer_rows["mha_local_jacobian_upper_bound"]).all()
    assert (layer_rows["block_jacobian_estimate"] <= layer_rows["residual_jacobian_upper_bound"]).all()


def test_the_gate_refuses_falcon_read_with_the_wrong_qkv_order() -> None:
    adapter = M.load(_falcon("40b", "sdpa"))
    attention = adapter.layers[1].attention
    swapped = replace(attention, w_q=attention.w_q.flip(0))  # query heads read in the wrong order within the groups
    adapter.layers[1] = replace(adapter.layers[1], attention=swapped)
    with pytest.raises(WeightsFidelityError, match="layer 1 attention"):
        M.check_weights_fidelity(adapter, IDS)
