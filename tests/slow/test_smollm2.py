"""SmolLM2-135M (GGUF, Llama family, GQA 9:3, RoPE, RMSNorm): rows, weights and an audit on the real model."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import attnsens.models as M
from tests.helpers.oracle_blocks import _as_oracle_block
from tests.reference.model_oracles import block_plain

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2() -> M.ModelAdapter:
    return M.load("smollm2")


def test_spec_of_the_shipped_model(smollm2) -> None:
    spec = smollm2.spec
    assert smollm2.family == "llama"
    assert (spec.n_layer, spec.n_head, spec.n_kv_head, spec.d_head, spec.d_model) == (30, 9, 3, 64, 576)
    assert (spec.placement, spec.norm, spec.rotary.base) == ("pre", "rmsnorm", 100000.0)


def test_rows_match_eager_attention(smollm2) -> None:
    ids = smollm2.encode("Now is the winter of our discontent made glorious summer by this sun of York; " * 3)
    layers = [0, 13, 29]
    chunks = list(smollm2.stream_attention(ids, layers=layers, chunk_size=16))
    model = smollm2.module
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            reference = model(input_ids=ids, output_attentions=True).attentions
    finally:
        model.set_attn_implementation("sdpa")
    for chunk in chunks:
        expected = reference[chunk.layer][:, :, chunk.query_positions[0]]
        torch.testing.assert_close(chunk.probs, expected, rtol=1e-5, atol=1e-6)


def test_the_audits_entropy_from_logits_agrees_with_its_rows(smollm2, monkeypatch) -> None:
    """On the real model's rows the entropy the audit takes from the logits and −Σ p log p of the same rows are
    within the rows' own rounding of each other (docs/math.md §2.4), in every chunk of every layer."""
    import attnsens.capture.stream as stream
    from attnsens.capture import row_statistics
    from attnsens.study import audit

    gaps = []

    def checked(probs, *, n_keys=None, exact_support=None, logits=None):
        stats = row_statistics(probs, n_keys=n_keys, exact_support=exact_support, logits=logits)
        assert logits is not None
        plain = row_statistics(probs, n_keys=n_keys, exact_support=exact_support)
        gaps.append(float(((stats.entropy - plain.entropy).abs() / stats.row_sum).max()))
        return stats

    monkeypatch.setattr(stream, "row_statistics", checked)
    ids = smollm2.encode("Shall I compare thee to a summer's day? Thou art more lovely and more temperate. " * 12)
    audit(smollm2, ids)
    assert len(gaps) >= smollm2.spec.n_layer and max(gaps) <= 2 * 8 * 2.0**-24


def test_weights_reproduce_block_zero_including_gguf_rope_layout(smollm2) -> None:
    """The q/k rows of a GGUF file are permuted for interleaved RoPE; the adapter's weights with rotate-half
    RoPE must still reproduce the block."""
    ids = smollm2.encode("To be, or not to be")
    inputs = smollm2.layer_inputs(ids)
    got = block_plain(inputs[0].block_input[0].double(), _as_oracle_block(smollm2.layers[0]))
    torch.testing.assert_close(got, inputs[1].block_input[0].double(), rtol=1e-3, atol=1e-3)


def test_cli_audit_on_smollm2(smollm2, tmp_path, monkeypatch) -> None:
    from attnsens.cli import app

    monkeypatch.setitem(M.ALIASES, "smollm2", lambda **kwargs: smollm2)  # reuse the loaded model

    text = tmp_path / "text.txt"
    text.write_text("Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him. " * 8)
    result = CliRunner().invoke(
        app,
        ["audit", "smollm2", "--text", str(text), "--seq-len", "64", "--out", str(tmp_path / "run")],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output
    assert "median θ lower bound" in result.output


def test_the_shipped_weights_pass_the_fidelity_gate(smollm2) -> None:
    ids = smollm2.encode("The quality of mercy is not strained; it droppeth as the gentle rain from heaven")
    _, results = M.weights_fidelity(smollm2, ids)
    assert len(results) == 30 * (5 + 2)  # five fields on the text, two identification fields on random inputs
    assert max(r.relative_error for r in results) < 1e-5  # measured 1.7e-6 (layer 8 attention); identification 8.3e-7


def test_the_converted_folder_reproduces_the_gguf_load(tmp_path, monkeypatch) -> None:
    """The first load converts the shipped GGUF file; the second reads the folder: same weights, tokens, output."""
    from attnsens.models import gguf_cache

    monkeypatch.setenv("ATTNSENS_MODEL_CACHE", str(tmp_path))
    direct, cached = M.load("smollm2"), M.load("smollm2")
    assert gguf_cache.cached_conversion(M.loading._smollm2_gguf()) is not None
    text = "Shall I compare thee to a summer's day? Thou art more lovely and more temperate. " * 4
    ids = direct.encode(text)
    assert torch.equal(ids, cached.encode(text))
    direct_weights, cached_weights = direct.module.state_dict(), cached.module.state_dict()
    assert direct_weights.keys() == cached_weights.keys()
    assert all(torch.equal(direct_weights[key], cached_weights[key]) for key in direct_weights)
    with torch.no_grad():
        assert torch.equal(direct.module(ids).last_hidden_state, cached.module(ids).last_hidden_state)
