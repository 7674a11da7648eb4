"""Families whose layers are not one module each, or whose models hold two stacks, on stock configs: ALBERT's one
shared layer audited once per call, T5's relative-position bias, the encoder and the decoder of BART and T5 each
passed alone, and whole encoder-decoders (encoder and decoder self-attention and cross-attention), every row equal
to eager ``output_attentions`` to 1e-5; Whisper's audio encoder is refused with advice that works."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AlbertConfig,
    AlbertModel,
    BartConfig,
    BartModel,
    T5Config,
    T5EncoderModel,
    T5Model,
)

import attnsens.models as M
from attnsens.capture import capture_row_statistics
from attnsens.errors import UnsupportedModelError
from attnsens.models.interface import decoder_inputs
from tests.unit.models.tiny_models import VOCAB, spread_weights, stock_config

IDS = torch.randint(2, VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))
RIGHT_PADDED = torch.ones(2, 11, dtype=torch.long)
RIGHT_PADDED[1, 7:] = 0
LEFT_PADDED = torch.ones(2, 11, dtype=torch.long)
LEFT_PADDED[0, :3] = 0


def _random(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    spread_weights(model)
    return model.eval()


def _albert(**fields: object) -> torch.nn.Module:
    sizes = {"num_hidden_layers": 4, "num_attention_heads": 3, "hidden_size": 24, "intermediate_size": 37,
             "embedding_size": 13, **fields}  # fmt: skip
    return _random(AlbertModel(stock_config(AlbertConfig, **sizes), add_pooling_layer=False))


def _t5_config() -> T5Config:
    sizes = {"num_layers": 2, "num_decoder_layers": 3, "num_heads": 3, "d_model": 24, "d_kv": 8, "d_ff": 37}
    # t5-small's config.json starts the decoder at 0 (the pad token), a field T5Config itself does not define
    return stock_config(T5Config, **sizes, checkpoint_fields={"decoder_start_token_id": 0})


def _bart(**fields: object) -> torch.nn.Module:
    sizes = {"encoder_layers": 2, "decoder_layers": 3, "encoder_attention_heads": 3, "decoder_attention_heads": 4,
             "d_model": 24, "encoder_ffn_dim": 37, "decoder_ffn_dim": 37, "max_position_embeddings": 40,
             **fields}  # fmt: skip
    return _random(BartModel(stock_config(BartConfig, **sizes)))


def _assert_rows_match(stack: torch.nn.Module, mask: torch.Tensor | None, n_layer: int) -> M.ModelAdapter:
    """Rows of every layer against the stack's own eager attention weights."""
    adapter = M.load(stack)
    implementation = stack.config._attn_implementation
    stack.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            reference = stack(input_ids=IDS, attention_mask=mask, output_attentions=True).attentions
    finally:
        stack.set_attn_implementation(implementation)
    assert adapter.spec.n_layer == len(reference) == n_layer
    real = torch.ones_like(IDS, dtype=torch.bool) if mask is None else mask.bool()
    chunks = list(adapter.stream_attention(IDS, attention_mask=mask, chunk_size=4))
    assert sorted({chunk.layer for chunk in chunks}) == list(range(n_layer))
    for chunk in chunks:
        index = chunk.query_positions[:, None, :, None].expand(-1, len(chunk.heads), -1, IDS.shape[1])
        expected = torch.gather(reference[chunk.layer], 2, index)
        rows = real.gather(1, chunk.query_positions)[:, None, :].expand(-1, len(chunk.heads), -1)
        torch.testing.assert_close(chunk.probs[rows], expected[rows], rtol=1e-5, atol=1e-5)
    return adapter


@pytest.mark.parametrize("groups", [1, 2])
def test_every_call_of_albert_s_shared_layer_is_a_layer_of_its_own(groups: int) -> None:
    """ALBERT runs one layer (or one per group) ``num_hidden_layers`` times; each call has its own inputs, so its
    own rows: 4 audited layers, where one module would give 1."""
    model = _albert(num_hidden_groups=groups)
    adapter = _assert_rows_match(model, RIGHT_PADDED, n_layer=4)
    blocks = capture_row_statistics(adapter, IDS)
    rows = {layer: sum(b.stats.p_max.numel() for b in blocks if b.layer == layer) for layer in range(4)}
    assert rows == {layer: 2 * 3 * 11 for layer in range(4)}
    distinct = [b.stats.p_max.mean().item() for b in blocks if b.query_positions.min() == 0 and 0 in b.heads]
    assert len(set(distinct)) == len(distinct)  # each call's rows are its own, not the first call's again
    again = list(adapter.stream_attention(IDS, layers=[2]))  # a pass stopped early starts its count afresh
    assert {chunk.layer for chunk in again} == {2}


def test_t5_encoder_rows_carry_its_relative_position_bias() -> None:
    """T5 adds a learned bias per head and relative position to its scores; no max_position_embeddings."""
    encoder = _random(T5EncoderModel(_t5_config()))
    for mask in (None, RIGHT_PADDED):
        adapter = _assert_rows_match(encoder, mask, n_layer=2)
    assert not adapter.spec.causal


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_each_stack_of_an_encoder_decoder_is_audited_alone(stack: str) -> None:
    """BART's and T5's encoder (bidirectional) and decoder (causal; its cross-attention runs only on an encoder's
    states, so a decoder alone runs its self-attention) as the refusal of the whole model advises."""
    for model, layers in ((_bart(), {"encoder": 2, "decoder": 3}), (_random(T5Model(_t5_config())), None)):
        part = model.get_encoder() if stack == "encoder" else model.get_decoder()
        n_layer = layers[stack] if layers else {"encoder": 2, "decoder": 3}[stack]
        adapter = _assert_rows_match(part, RIGHT_PADDED if stack == "encoder" else None, n_layer=n_layer)
        assert adapter.spec.causal == (stack == "decoder")


@pytest.mark.parametrize("mask", [None, RIGHT_PADDED, LEFT_PADDED], ids=["no padding", "right", "left"])
@pytest.mark.parametrize("family", ["bart", "t5"])
def test_an_encoder_decoder_audits_both_self_attentions_and_the_cross_attention(family: str, mask) -> None:
    """The encoder reads the text, the decoder the same text teacher-forced; its layers are the encoder's, then
    each decoder layer's self- and cross-attention, in call order, marked in ``spec.attention``."""
    model = _bart(decoder_attention_heads=3) if family == "bart" else _random(T5Model(_t5_config()))
    adapter = M.load(model)
    assert adapter.spec.attention == ("encoder",) * 2 + ("decoder", "cross") * 3
    start = model.config.decoder_start_token_id
    decoder_ids = decoder_inputs(IDS, mask, start)
    real = torch.ones_like(IDS, dtype=torch.bool) if mask is None else mask.bool()
    for sequence in range(2):  # the start token at the first real position, then the text one place later
        positions = real[sequence].nonzero().flatten()
        expected_ids = torch.cat([torch.tensor([start]), IDS[sequence, positions[:-1]]])
        assert torch.equal(decoder_ids[sequence, positions], expected_ids)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(input_ids=IDS, attention_mask=mask, decoder_input_ids=decoder_ids,
                    decoder_attention_mask=mask, output_attentions=True)  # fmt: skip
    model.set_attn_implementation("sdpa")
    decoder = [rows for pair in zip(out.decoder_attentions, out.cross_attentions, strict=True) for rows in pair]
    reference = [*out.encoder_attentions, *decoder]
    chunks = list(adapter.stream_attention(IDS, attention_mask=mask, chunk_size=4))
    assert sorted({chunk.layer for chunk in chunks}) == list(range(8))
    for chunk in chunks:
        index = chunk.query_positions[:, None, :, None].expand(-1, 3, -1, IDS.shape[1])
        expected = torch.gather(reference[chunk.layer], 2, index)
        rows = real.gather(1, chunk.query_positions)[:, None, :].expand(-1, 3, -1)
        torch.testing.assert_close(chunk.probs[rows], expected[rows], rtol=1e-5, atol=1e-5)
        causal = adapter.spec.attention[chunk.layer] == "decoder"
        keys = real.sum(dim=1, keepdim=True).expand_as(chunk.n_keys)
        if causal:  # teacher-forced rows see the start token and the tokens before their own
            keys = torch.minimum(keys, (real.cumsum(dim=1)).gather(1, chunk.query_positions))
        assert torch.equal(chunk.n_keys[rows[:, 0]], keys[rows[:, 0]])


def test_an_encoder_decoder_whose_heads_differ_between_its_stacks_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedModelError, match=r"its layers differ in their query heads.*each stack alone"):
        M.load(_bart())
    assert M.load(_bart().get_encoder()).spec.n_head == 3
    assert M.load(_bart().get_decoder()).spec.n_head == 4


def test_whisper_is_audited_through_its_decoder_and_its_audio_encoder_is_refused_by_name() -> None:
    """Whisper's encoder takes audio features, not token ids: the whole model's advice names the decoder alone."""
    from transformers import WhisperConfig, WhisperModel

    sizes = {"encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2, "decoder_attention_heads": 3,
             "d_model": 24, "encoder_ffn_dim": 37, "decoder_ffn_dim": 37, "num_mel_bins": 8,
             "max_source_positions": 8, "max_target_positions": 20, "pad_token_id": 0, "bos_token_id": 1,
             "eos_token_id": 1, "decoder_start_token_id": 1}  # fmt: skip
    model = _random(WhisperModel(stock_config(WhisperConfig, **sizes)))
    advice = r"encoder takes input_features.*A\.models\.load\(model\.get_decoder"
    with pytest.raises(UnsupportedModelError, match=advice):
        M.load(model)
    with pytest.raises(UnsupportedModelError, match="WhisperEncoder takes input_features, not token ids"):
        M.load(model.get_encoder())
    _assert_rows_match(model.get_decoder(), None, n_layer=2)


def test_the_rows_table_marks_each_layer_of_an_encoder_decoder(tmp_path) -> None:
    """The ``attention`` column of the rows table names each layer's attention, in memory and in a run folder; it
    is null for a model of one stack."""
    import attnsens
    from attnsens.store.parquet import read_table

    model = _bart(decoder_attention_heads=3)
    kinds = ("encoder",) * 2 + ("decoder", "cross") * 3
    result = attnsens.study.audit(model, IDS)
    by_layer = result.rows.groupby("layer")["attention"].unique()
    assert {layer: tuple(values) for layer, values in by_layer.items()} == {i: (k,) for i, k in enumerate(kinds)}
    attnsens.study.audit(model, IDS, out_dir=tmp_path / "audit")
    stored = read_table(tmp_path / "audit" / "rows")
    assert stored.groupby("layer")["attention"].first().tolist() == list(kinds)
    assert attnsens.study.audit(model.get_encoder(), IDS).rows["attention"].isna().all()


def test_the_audit_command_names_each_layer_of_an_encoder_decoder(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from attnsens.cli import app

    _random(T5Model(_t5_config())).save_pretrained(tmp_path / "t5")
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str(int(t)) for t in IDS[0]))
    done = CliRunner().invoke(app, ["audit", str(tmp_path / "t5"), "--ids", str(ids), "--out", str(tmp_path / "a"),
                                    "--json"])  # fmt: skip
    assert done.exit_code == 0, done.output
    layers = json.loads(done.stdout)["layers"]
    assert [(layer["layer"], layer["attention"]) for layer in layers] == list(
        enumerate(("encoder",) * 2 + ("decoder", "cross") * 3)
    )


@pytest.mark.parametrize("mask", [None, RIGHT_PADDED], ids=["no padding", "right"])
def test_mbart_starts_its_decoder_with_each_sequence_s_last_token_as_its_own_forward_does(mask) -> None:
    """mBART's config names no decoder_start_token_id: its forward shifts the text right behind its last real token
    (the language id). The audit builds the same decoder input, so every real row equals the model's own."""
    from transformers import MBartConfig, MBartModel

    sizes = {"encoder_layers": 1, "decoder_layers": 2, "encoder_attention_heads": 3, "decoder_attention_heads": 3,
             "d_model": 24, "encoder_ffn_dim": 37, "decoder_ffn_dim": 37, "max_position_embeddings": 40}  # fmt: skip
    model = _random(MBartModel(stock_config(MBartConfig, **sizes)))
    assert getattr(model.config, "decoder_start_token_id", None) is None
    adapter = M.load(model)
    real = torch.ones_like(IDS, dtype=torch.bool) if mask is None else mask.bool()
    pad = model.config.pad_token_id  # mBART finds the last real token by counting the tokens that are not padding
    ids = IDS.masked_fill(IDS == pad, pad + 2).masked_fill(~real, pad)
    last = ids.gather(1, (real.sum(dim=1, keepdim=True) - 1))
    assert torch.equal(decoder_inputs(ids, mask, None)[:, :1], last)
    model.set_attn_implementation("eager")
    with torch.no_grad():  # no decoder_input_ids: mBART builds them itself
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    model.set_attn_implementation("sdpa")
    decoder = [rows for pair in zip(out.decoder_attentions, out.cross_attentions, strict=True) for rows in pair]
    reference = [*out.encoder_attentions, *decoder]
    chunks = list(adapter.stream_attention(ids, attention_mask=mask))
    assert sorted({chunk.layer for chunk in chunks}) == list(range(5))
    for chunk in chunks:
        index = chunk.query_positions[:, None, :, None].expand(-1, 3, -1, IDS.shape[1])
        expected = torch.gather(reference[chunk.layer], 2, index)
        rows = real.gather(1, chunk.query_positions)[:, None, :].expand(-1, 3, -1)
        torch.testing.assert_close(chunk.probs[rows], expected[rows], rtol=1e-5, atol=1e-5)
