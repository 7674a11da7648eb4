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


@pytest.mark.parametrize(
    ("family", "config"),
    [("jamba", {"expert_layer_offset": 1}), ("granitemoehybrid", {"num_local_experts": 2})],
)
def test_an_attention_block_with_a_mixture_of_experts_is_audited_but_not_bounded(family: str, config: dict) -> None:
    model = tiny_model(family, **config)
    adapter = M.load(model)
    reference = [a for a in eager_attentions(model, IDS) if a is not None]
    for chunk in adapter.stream_attention(IDS):
        torch.testing.assert_close(chunk.probs, reference[chunk.layer], rtol=0, atol=1e-4)
    with pytest.raises(UnsupportedModelError, match=f"{family}: block 1's feed-forward is a mixture of experts"):
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
