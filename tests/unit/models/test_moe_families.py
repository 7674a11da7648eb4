"""Mixtures of experts (Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE with its shared expert, Granite-MoE): their rows are
eager's, the gate identifies the router, the routing and every expert and refuses each misreading, the local
bounds hold with the router's choice certified, and a tie is refused naming the layer (docs/math.md T7)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import attnsens.models as M
from attnsens.errors import RouterTieError, WeightsFidelityError
from attnsens.models.fidelity import MOE_IDENTIFICATION_FIELDS, identification_fields
from attnsens.study.bounds import bound_model
from attnsens.weights import MoEWeights
from tests.unit.models.tiny_models import MOE_FAMILIES, VOCAB, eager_attentions, tiny_model

IDS = torch.randint(2, VOCAB, (2, 13), generator=torch.Generator().manual_seed(7))


def _moe(adapter: M.ModelAdapter, layer: int) -> MoEWeights:
    mlp = adapter.layers[layer].mlp
    assert isinstance(mlp, MoEWeights)
    return mlp


def _set_moe(adapter: M.ModelAdapter, layer: int, **changes: object) -> None:
    adapter.layers[layer] = replace(adapter.layers[layer], mlp=replace(_moe(adapter, layer), **changes))


def _failed(adapter: M.ModelAdapter) -> set[tuple[int, str]]:
    _, results = M.weights_fidelity(adapter, IDS)
    return {(r.layer, r.field) for r in results if not r.passed}


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_families_pass_the_gate_and_audit_the_eager_rows(family: str) -> None:
    model = tiny_model(family)
    adapter = M.load(model)
    reference = eager_attentions(model, IDS)
    for chunk in adapter.stream_attention(IDS):
        torch.testing.assert_close(chunk.probs, reference[chunk.layer], rtol=0, atol=1e-4)
    _, results = M.weights_fidelity(adapter, IDS)
    fields = {r.field for r in results}
    assert set(MOE_IDENTIFICATION_FIELDS[:3]) <= fields and "mlp_identification" not in fields
    assert ("shared_expert_identification" in fields) == (family == "qwen2_moe")
    assert max(r.relative_error for r in results) < 1e-5, [r for r in results if r.relative_error >= 1e-5]
    moe = _moe(adapter, 0)
    renormalized = family in ("mixtral", "granitemoe")  # the others keep norm_topk_prob False
    assert (moe.top_k, moe.gate_mode) == (2, "topk_softmax" if renormalized else "softmax")


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_the_gate_refuses_swapped_experts_and_a_permuted_router(family: str) -> None:
    adapter = M.load(tiny_model(family))
    moe = _moe(adapter, 1)
    _set_moe(adapter, 1, experts=(moe.experts[1], moe.experts[0], *moe.experts[2:]))
    assert (1, "expert_identification") in _failed(adapter)
    with pytest.raises(WeightsFidelityError, match="layer 1"):
        M.check_weights_fidelity(adapter, IDS)
    adapter = M.load(tiny_model(family))
    moe = _moe(adapter, 0)
    _set_moe(adapter, 0, router=moe.router.roll(1, dims=0))
    assert (0, "router_identification") in _failed(adapter)


@pytest.mark.parametrize("family", ["mixtral", "olmoe"])
def test_the_gate_refuses_top_k_read_as_one(family: str) -> None:
    adapter = M.load(tiny_model(family))
    _set_moe(adapter, 0, top_k=1)
    failed = _failed(adapter)
    assert {(0, "mlp"), (0, "routing_identification")} <= failed, failed


@pytest.mark.parametrize(("family", "wrong"), [("qwen3_moe", "topk_softmax"), ("mixtral", "softmax")])
def test_the_gate_refuses_the_other_gate_weights(family: str, wrong: str) -> None:
    """Renormalizing the top-k weights where the family does not (and the converse) is seen by the routing."""
    adapter = M.load(tiny_model(family))
    _set_moe(adapter, 1, gate_mode=wrong)
    failed = _failed(adapter)
    assert {(1, "mlp"), (1, "routing_identification")} <= failed, failed


def test_the_gate_refuses_a_wrong_shared_expert_gate() -> None:
    adapter = M.load(tiny_model("qwen2_moe"))
    moe = _moe(adapter, 0)
    assert moe.shared_gate is not None
    _set_moe(adapter, 0, shared_gate=-moe.shared_gate)
    assert (0, "shared_expert_identification") in _failed(adapter)
    assert identification_fields(adapter.layers[0])[-1] == "shared_expert_identification"


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_bounds_are_local_only(family: str) -> None:
    """The local columns are finite and hold their estimates; the columns that need a bound over a ball are
    infinite, the MoE having no Lipschitz constant."""
    table = bound_model(M.load(tiny_model(family)), IDS[:1], n_queries=4, iterations=8)
    layers = table[table["head"] == -1]
    assert (layers["mha_jacobian_estimate"] <= layers["mha_local_jacobian_upper_bound"]).all()
    assert (layers["block_jacobian_estimate"] <= layers["residual_jacobian_upper_bound"]).all()
    assert layers["residual_jacobian_upper_bound"].map(math.isfinite).all()
    assert layers["ffn_lipschitz_upper_bound"].map(math.isinf).all()
    assert layers["block_lipschitz_upper_bound"].map(math.isinf).all()


def test_a_router_tie_is_refused_by_the_gate_and_by_the_bound_naming_the_layer() -> None:
    """Every router row of layer 1 equal: all logits tie at every token, so the top 2 of 3 experts are not
    certified. The gate finds no random token whose routing is apart and refuses; the bound of the same weights
    (past the gate, as bare LayerWeights) refuses in one line naming the layer and the tie."""
    model = tiny_model("mixtral")
    with torch.no_grad():
        router = model.model.layers[1].mlp.gate.weight
        router.copy_(router[:1].expand_as(router))
    adapter = M.load(model)
    assert (1, "routing_identification") in _failed(adapter)
    with pytest.raises(RouterTieError, match=r"^layer 1 of layers: router tie at token 0 of sequence 0: the logits"):
        bound_model(list(adapter.layers), seq_len=8, iterations=2)


def test_the_weights_file_the_influence_certificate_and_the_finite_check_name_the_experts(tmp_path) -> None:
    from attnsens.errors import InputError, UnsupportedModelError
    from attnsens.influence import certified_constant
    from attnsens.store.layer_weights import save_layer_weights
    from attnsens.study.finite import check_finite_layers

    adapter = M.load(tiny_model("mixtral"))
    with pytest.raises(UnsupportedModelError, match="layer 0 holds a mixture of experts, which the weights file"):
        save_layer_weights(adapter.layers, tmp_path / "w.safetensors")
    certificate = certified_constant(adapter)
    assert not certificate.applicable
    assert any(reason.startswith("mixture of experts in layer(s) [0, 1]") for reason in certificate.reasons)
    moe = _moe(adapter, 1)
    broken = moe.experts[2].w_in.clone()
    broken[0, 0] = math.nan
    _set_moe(adapter, 1, experts=(*moe.experts[:2], replace(moe.experts[2], w_in=broken)))
    with pytest.raises(InputError, match=r"'layers\.1\.mlp\.experts\.2\.w_in'"):
        check_finite_layers(adapter.layers, name="mixtral")


def test_the_bounds_command_says_which_layers_are_bounded_locally_only(tmp_path) -> None:
    from typer.testing import CliRunner

    from attnsens.cli import app
    from tests.unit.study.test_bounds import _saved_with_tokenizer

    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{i % 50}" for i in range(3, 40)), encoding="utf-8")
    saved = _saved_with_tokenizer(tiny_model("qwen3_moe"), tmp_path / "m")
    args = ["--text", str(text), "--seq-len", "12", "--queries", "2", "--iterations", "3"]
    result = CliRunner().invoke(app, ["bounds", saved, *args])
    assert result.exit_code == 0, result.output
    assert "layer(s) [0, 1] hold a mixture of experts: their bounds are local" in " ".join(result.output.split())


def test_dense_layers_beside_expert_layers_are_read_as_dense_mlps() -> None:
    """Qwen3-MoE's ``mlp_only_layers`` keep a dense MLP: read, identified and bounded as one, beside the experts."""
    adapter = M.load(tiny_model("qwen3_moe", mlp_only_layers=[0]))
    assert not isinstance(adapter.layers[0].mlp, MoEWeights) and isinstance(adapter.layers[1].mlp, MoEWeights)
    assert adapter.moe_modules(0) is None and adapter.moe_modules(1) is not None
    _, results = M.weights_fidelity(adapter, IDS)
    assert {r.field for r in results if r.layer == 0} >= {"mlp", "mlp_identification"}
    assert max(r.relative_error for r in results) < 1e-5
    table = bound_model(adapter, IDS[:1], n_queries=4, iterations=4)
    lipschitz = table[table["head"] == -1]["ffn_lipschitz_upper_bound"].tolist()
    assert math.isfinite(lipschitz[0]) and math.isinf(lipschitz[1])
