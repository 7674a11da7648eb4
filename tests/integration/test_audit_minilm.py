"""Smoke test on a real shipped model (all-MiniLM-L6-v2, BERT, post-LN): streamed rows equal eager attention."""

from __future__ import annotations

import torch

import attnsens.models as M


def test_minilm_rows_and_weights_match_the_model() -> None:
    adapter = M.load("minilm")
    assert (adapter.family, adapter.spec.placement, adapter.spec.causal) == ("bert", "post", False)
    assert (adapter.spec.n_layer, adapter.spec.n_head, adapter.spec.d_model) == (6, 12, 384)
    ids = adapter.encode("Whether 'tis nobler in the mind to suffer the slings and arrows of outrageous fortune")
    chunks = list(adapter.stream_attention(ids, layers=[0, 5], chunk_size=8))
    model = adapter.module
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            reference = model(input_ids=ids, output_attentions=True).attentions
    finally:
        model.set_attn_implementation("sdpa")
    for chunk in chunks:
        expected = reference[chunk.layer][:, :, chunk.query_positions[0]]
        torch.testing.assert_close(chunk.probs, expected, rtol=1e-5, atol=1e-6)
    inputs = adapter.layer_inputs(ids)
    out = adapter.layers[0].attention
    q = torch.einsum("hed,bnd->bhne", out.w_q, inputs[0].attention_input) + out.b_q[None, :, None, :]
    seen = {}
    with adapter.query_key_tap(lambda layer, query, key, tau: seen.setdefault(layer, query)), torch.no_grad():
        adapter.forward(ids)
    torch.testing.assert_close(q, seen[0], rtol=1e-4, atol=1e-4)


def test_minilm_weights_pass_the_fidelity_gate() -> None:
    adapter = M.load("minilm")
    _, results = M.weights_fidelity(adapter, adapter.encode("Though this be madness, yet there is method in't"))
    # five fields on the text and two identification fields on random inputs per layer
    assert len(results) == 6 * (5 + 2) and max(r.relative_error for r in results) < 1e-5  # measured 7.2e-7


def test_the_default_seq_len_is_the_text_up_to_the_context_without_tokenizing_all_of_a_long_text(monkeypatch) -> None:
    from attnsens.study.inputs import split_sequences, text_seq_len
    from attnsens.train.data import read_documents

    adapter = M.load("minilm")
    short = "To be, or not to be, that is the question."
    assert text_seq_len(adapter, short) == split_sequences(adapter, short).shape[1] == adapter.encode(short).shape[1]
    corpus = "\n\n".join(read_documents(None))
    encoded = []
    encode = adapter.encode

    def recording(text, *args, **kwargs):
        encoded.append(len(text))
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(adapter, "encode", recording)
    assert text_seq_len(adapter, corpus) == adapter.spec.max_positions == 512
    assert max(encoded) < len(corpus) // 100  # a prefix of the 5 MB corpus, not all of it


def test_a_window_beyond_the_context_is_refused_as_such_whatever_the_text() -> None:
    """A seq_len beyond MiniLM's 512 positions is named as that, not as a text too short for the window."""
    import pytest

    from attnsens.errors import InputError
    from attnsens.study.inputs import split_sequences

    adapter = M.load("minilm")
    for text in ("a few words", "word " * 5000):
        with pytest.raises(InputError, match=r"seq_len 4096 exceeds the context of 'minilm' \(512 positions\)"):
            split_sequences(adapter, text, seq_len=4096)
