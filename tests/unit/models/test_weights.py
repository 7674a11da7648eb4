"""Normalized weights (attnsens/weights.py) reproduce each family's block exactly, checked by a float64 oracle."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import attnsens.models as M
from tests.helpers.oracle_blocks import _as_oracle_block
from tests.reference.model_oracles import block_plain, norm_plain
from tests.unit.models.tiny_models import FAMILIES, VOCAB, tiny_model


@pytest.fixture(scope="module", params=FAMILIES)
def family_run(request):
    torch.manual_seed(1)
    model = tiny_model(request.param)
    adapter = M.load(model)
    ids = torch.randint(0, VOCAB, (1, 11))
    return adapter, adapter.layer_inputs(ids)


def test_layer_zero_weights_reproduce_the_block(family_run) -> None:
    adapter, inputs = family_run
    block = _as_oracle_block(adapter.layers[0])
    expected = inputs[1].block_input[0].double()
    torch.testing.assert_close(block_plain(inputs[0].block_input[0].double(), block), expected, rtol=1e-4, atol=1e-4)


def test_norm_weights_reproduce_the_sublayer_inputs(family_run) -> None:
    """Pre-LN: attention_input = N1(block_input). Post-LN: mlp_input = N1(attention_residual_sum)."""
    adapter, inputs = family_run
    for layer, seen in zip(adapter.layers, inputs, strict=True):
        n1 = layer.attn_norm
        if layer.placement == "pre":
            source, target = seen.block_input, seen.attention_input
        else:
            source, target = seen.attention_residual_sum, seen.mlp_input
            torch.testing.assert_close(seen.attention_input, seen.block_input)
        got = norm_plain(n1.kind, source[0].double(), n1.gamma.double(), _d(n1.beta), n1.eps)
        torch.testing.assert_close(got, target[0].double(), rtol=1e-5, atol=1e-5)


def test_oracle_rejects_a_wrong_head_layout(family_run) -> None:
    """Meta-test: the block oracle notices when two query heads are swapped (a wrong split of fused weights)."""
    adapter, inputs = family_run
    layer = adapter.layers[0]
    w_q = layer.attention.w_q.clone()
    w_q[[0, 1]] = w_q[[1, 0]]
    wrong = replace(layer, attention=replace(layer.attention, w_q=w_q))
    got = block_plain(inputs[0].block_input[0].double(), _as_oracle_block(wrong))
    assert not torch.allclose(got, inputs[1].block_input[0].double(), rtol=1e-4, atol=1e-4)


def test_spec_and_shapes_follow_the_config() -> None:
    adapter = M.load(tiny_model("llama"))
    spec = adapter.spec
    assert (spec.n_layer, spec.n_head, spec.n_kv_head, spec.d_head, spec.d_model) == (2, 6, 2, 6, 36)
    assert (spec.placement, spec.norm, spec.causal, spec.rotary.rotary_dim) == ("pre", "rmsnorm", True, 6)
    attention = adapter.layers[1].attention
    assert attention.w_q.shape == (6, 6, 36) and attention.w_k.shape == (2, 6, 36)
    assert [attention.kv_head_of(h) for h in range(6)] == [0, 0, 0, 1, 1, 1]
    bert = M.load(tiny_model("bert")).spec
    assert (bert.placement, bert.causal, bert.rotary) == ("post", False, None)
    neox = M.load(tiny_model("gpt_neox"))
    assert neox.spec.rotary.rotary_dim == 4 and neox.layers[0].parallel_residual


def _d(t):
    return None if t is None else t.double()
