"""The gate identifies each sublayer's weights, not only its outputs on the probe tokens (issue 66, deliverable 1).

A weight wrong only in directions the probe tokens do not span agrees with the model on those tokens, yet a local
bound uses every direction. The identification pass (models/fidelity.py) feeds each attention and MLP sublayer
random inputs that span its input space; parameters edited after the adapter read them are refused at bound time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import attnsens.models as M
from attnsens.errors import WeightsChangedError, WeightsFidelityError
from attnsens.influence import certified_constant
from attnsens.models.fidelity import FIELDS, IDENTIFICATION_FIELDS
from attnsens.study.bounds import bound_model
from attnsens.train.model import GPT, GPTConfig
from attnsens.weights import LayerWeights
from tests.unit.models.tiny_models import spread_weights

D_MODEL, VOCAB = 32, 96
IDS = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(11))
"""Ten probe tokens: their attention inputs span 10 of the 32 input directions."""


def _llama() -> LlamaForCausalLM:
    """A float64 Llama from the stock config, only its sizes set, weights at realistic (structured) scales."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    spread_weights(model)
    return model


def _off_span(points: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis [k, d] of the directions orthogonal to every row of ``points`` [n, d]."""
    _, singular, vh = torch.linalg.svd(points.to(torch.float64), full_matrices=True)
    rank = int((singular > singular[0] * 1e-10).sum())
    return vh[rank:]


def _attention_inputs(adapter: M.ModelAdapter, layer: int) -> torch.Tensor:
    inputs, results = M.weights_fidelity(adapter, IDS)
    assert all(r.passed for r in results)
    return inputs[layer].attention_input[0]


def _mlp_hidden(model: LlamaForCausalLM, layer: int) -> torch.Tensor:
    """What layer ``layer``'s down projection reads on the probe tokens: [n, d_ff]."""
    seen: list[torch.Tensor] = []
    handle = model.model.layers[layer].mlp.down_proj.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    try:
        with torch.no_grad():
            model(IDS)
    finally:
        handle.remove()
    return seen[0][0]


def _head_bound(table: pd.DataFrame, layer: int, column: str) -> float:
    return float(table[(table["layer"] == layer) & (table["head"] == -1)][column].iloc[0])


def test_an_edit_in_the_null_space_of_the_probe_tokens_is_refused_by_the_identification_pass() -> None:
    model = _llama()
    adapter = M.load(model)
    stale = _head_bound(bound_model(adapter, IDS), 0, "mha_local_jacobian_upper_bound")
    basis = _off_span(_attention_inputs(adapter, 0))
    assert basis.shape[0] == D_MODEL - IDS.shape[1]
    v = basis[0]
    u = torch.randn(D_MODEL, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    u /= torch.linalg.vector_norm(u)
    # Through .data: the parameter's version counter does not move, so only what the weights compute can tell.
    model.model.layers[0].self_attn.v_proj.weight.data.add_(300.0 * torch.outer(u, v))

    _, results = M.weights_fidelity(adapter, IDS)
    real = [r for r in results if r.field in FIELDS]
    assert real and all(r.passed for r in real), "the probe tokens must not see an edit off their span"
    failed = {(r.layer, r.field) for r in results if not r.passed}
    assert failed == {(0, "attention_identification")}
    with pytest.raises(WeightsFidelityError, match="layer 0 attention_identification"):
        M.check_weights_fidelity(adapter, IDS)
    with pytest.raises(WeightsFidelityError, match="attention_identification"):
        bound_model(adapter, IDS)

    # Read again, the weights pass, and the bound covers what the edited model does: the stale one did not.
    adapter.reread_layers()
    table = bound_model(adapter, IDS)
    estimate = _head_bound(table, 0, "mha_jacobian_estimate")
    assert estimate > 2 * stale
    assert _head_bound(table, 0, "mha_local_jacobian_upper_bound") >= estimate


def _misread(
    monkeypatch: pytest.MonkeyPatch, adapter: M.ModelAdapter, layer: int, change: Callable[[LayerWeights], LayerWeights]
) -> None:
    """Make the adapter read layer ``layer``'s normalized weights through ``change`` (a misreading adapter), and
    read them again."""
    read = adapter.read_layers

    def misread() -> list[LayerWeights]:
        layers = read()
        layers[layer] = change(layers[layer])
        return layers

    monkeypatch.setattr(adapter, "read_layers", misread)
    adapter.reread_layers()


def test_a_misread_of_w_v_confined_to_directions_off_the_probe_span_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = M.load(_llama())
    basis = _off_span(_attention_inputs(adapter, 1))
    keep = torch.eye(D_MODEL, dtype=torch.float64) - basis.T @ basis  # projector onto the probe tokens' span
    _misread(monkeypatch, adapter, 1, lambda w: replace(w, attention=replace(w.attention, w_v=w.attention.w_v @ keep)))
    _, results = M.weights_fidelity(adapter, IDS)
    assert all(r.passed for r in results if r.field in FIELDS)
    assert {(r.layer, r.field) for r in results if not r.passed} == {(1, "attention_identification")}
    with pytest.raises(WeightsFidelityError, match="layer 1 attention_identification"):
        bound_model(adapter, IDS)


def test_a_misread_of_w_out_confined_to_hidden_units_off_the_probe_tokens_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _llama()
    adapter = M.load(model)
    basis = _off_span(_mlp_hidden(model, 0))
    assert basis.shape[0] > 0
    keep = torch.eye(basis.shape[1], dtype=torch.float64) - basis.T @ basis
    _misread(monkeypatch, adapter, 0, lambda w: replace(w, mlp=replace(w.mlp, w_out=w.mlp.w_out @ keep)))
    _, results = M.weights_fidelity(adapter, IDS)
    assert all(r.passed for r in results if r.field in FIELDS)
    assert {(r.layer, r.field) for r in results if not r.passed} == {(0, "mlp_identification")}


def test_every_layer_gets_both_identification_fields() -> None:
    adapter = M.load(_llama())
    _, results = M.weights_fidelity(adapter, IDS)
    identified = [(r.layer, r.field) for r in results if r.field in IDENTIFICATION_FIELDS]
    assert identified == [(layer, field) for layer in range(2) for field in IDENTIFICATION_FIELDS]
    assert all(r.passed for r in results)


def _one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_an_in_place_edit_after_loading_is_refused_in_one_line_and_a_reread_accepts_it() -> None:
    model = _llama()
    adapter = M.load(model)
    adapter.layers  # noqa: B018 - the read that records the parameters' versions
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.add_(1e-3)
    with pytest.raises(WeightsChangedError) as error:
        adapter.check_weights_unchanged()
    assert "model.layers.1.mlp.up_proj.weight" in _one_line(error) and "reread_layers" in str(error.value)
    with pytest.raises(WeightsChangedError) as error:
        M.check_weights_fidelity(adapter, IDS)
    _one_line(error)
    with pytest.raises(WeightsChangedError) as error:
        bound_model(adapter, IDS)
    _one_line(error)

    adapter.reread_layers()
    adapter.check_weights_unchanged()
    M.check_weights_fidelity(adapter, IDS)


@pytest.mark.parametrize("how", ["assigned .data", "replaced parameter"])
def test_new_storage_or_a_new_parameter_is_refused(how: str) -> None:
    model = _llama()
    adapter = M.load(model)
    adapter.layers  # noqa: B018
    projection = model.model.layers[0].self_attn.q_proj
    if how == "assigned .data":
        projection.weight.data = projection.weight.data.clone()  # same values, new storage
    else:
        projection.weight = torch.nn.Parameter(projection.weight.detach().clone())
    with pytest.raises(WeightsChangedError, match=r"q_proj\.weight"):
        bound_model(adapter, IDS)


def test_the_influence_constant_refuses_an_own_gpt_edited_after_loading() -> None:
    torch.manual_seed(3)
    gpt = GPT(GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=2, d_model=8, max_positions=16, norm="pre")).eval()
    adapter = M.load(gpt)
    certified_constant(adapter)
    with torch.no_grad():
        gpt.blocks[1].attn.c_attn.weight.mul_(2.0)
    with pytest.raises(WeightsChangedError) as error:
        certified_constant(adapter)
    assert "blocks.1.attn.c_attn.weight" in _one_line(error)
