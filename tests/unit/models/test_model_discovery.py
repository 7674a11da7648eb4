"""Models whose config does not describe the stack that runs: a vision-language model (audited through its language
model), a decoder whose config names other heads than it calls, a family with an attention-function registry of
its own; and the checks that refuse an audit whose calls disagree with the spec instead of leaving rows out."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import (
    BartConfig,
    BartForCausalLM,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    LlavaConfig,
    LlavaForConditionalGeneration,
)

import attnsens.models as M
from attnsens.capture import capture_row_statistics
from attnsens.errors import UnsupportedModelError
from attnsens.models import hf_tap
from attnsens.study.bounds import bound_model
from tests.unit.models.tiny_models import eager_attentions, spread_weights, tiny_model

VOCAB = 61
IDS = torch.randint(3, 50, (2, 11), generator=torch.Generator().manual_seed(5))
_TEXT = {"num_hidden_layers": 2, "hidden_size": 24, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 37, "vocab_size": VOCAB, "max_position_embeddings": 41}  # fmt: skip
_VISION = {"num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 23,
           "image_size": 28, "patch_size": 14}  # fmt: skip


def _gemma3_vlm() -> torch.nn.Module:
    config = Gemma3Config(
        text_config={**_TEXT, "head_dim": 8, "sliding_window": 5},
        vision_config=_VISION,
        mm_tokens_per_image=4,
        image_token_index=VOCAB - 1,
        boi_token_index=VOCAB - 2,
        eoi_token_index=VOCAB - 3,
        attn_implementation="eager",
    )
    return _spread(Gemma3ForConditionalGeneration(config))


def _llava() -> torch.nn.Module:
    config = LlavaConfig(
        text_config={"model_type": "llama", **_TEXT},
        vision_config={"model_type": "clip_vision_model", **_VISION},
        image_token_index=VOCAB - 1,
        attn_implementation="eager",
    )
    return _spread(LlavaForConditionalGeneration(config))


def _spread(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    spread_weights(model)
    return model.eval()


def _assert_rows_are_the_models(adapter: M.ModelAdapter, reference: tuple[torch.Tensor, ...]) -> None:
    """Every streamed row equals the model's own eager attention (``reference``, one tensor per layer)."""
    assert adapter.spec.n_layer == len(reference)
    seen = set()
    for chunk in adapter.stream_attention(IDS, chunk_size=4):
        expected = reference[chunk.layer].gather(
            2, chunk.query_positions[:, None, :, None].expand(-1, len(chunk.heads), -1, IDS.shape[1])
        )
        torch.testing.assert_close(chunk.probs, expected, rtol=1e-5, atol=1e-5)
        seen.add(chunk.layer)
    assert seen == set(range(len(reference)))


@pytest.mark.parametrize(("build", "family"), [(_gemma3_vlm, "gemma3_text"), (_llava, "llama")])
def test_a_vision_language_model_is_audited_through_its_language_model(build, family: str) -> None:
    model = build()
    adapter = M.load(model)
    assert adapter.family == family
    assert adapter.module is model.get_decoder()
    with torch.no_grad():
        reference = model(input_ids=IDS, output_attentions=True).attentions  # the whole model, on text
    _assert_rows_are_the_models(adapter, reference)
    table = bound_model(adapter, IDS[:1], iterations=2)  # its family's layout: the gate passes and bounds exist
    assert len(table) > 0


def test_clip_is_audited_through_its_text_tower() -> None:
    from transformers import CLIPConfig, CLIPModel

    text = {"num_hidden_layers": 2, "hidden_size": 24, "num_attention_heads": 4, "intermediate_size": 37,
            "vocab_size": VOCAB, "max_position_embeddings": 41}  # fmt: skip
    model = _spread(CLIPModel(CLIPConfig(text_config=text, vision_config=_VISION, attn_implementation="eager")))
    adapter = M.load(model)
    assert adapter.family == "clip_text_model" and adapter.module is model.text_model
    with torch.no_grad():
        reference = model.text_model(input_ids=IDS, output_attentions=True).attentions
    _assert_rows_are_the_models(adapter, reference)


def test_a_vision_language_model_folder_loads_its_language_model(tmp_path) -> None:
    model = _gemma3_vlm()
    model.save_pretrained(tmp_path)
    adapter = M.load(str(tmp_path))
    assert adapter.family == "gemma3_text"
    assert capture_row_statistics(adapter, IDS)


def test_a_composite_model_without_a_language_model_of_its_own_is_refused_naming_its_parts(monkeypatch) -> None:
    model = _llava()
    monkeypatch.setattr(model, "get_decoder", lambda: model)
    with pytest.raises(UnsupportedModelError, match=r"composite model \(text_config, vision_config\)"):
        M.load(model)


def test_a_composite_model_with_several_text_models_is_refused(monkeypatch) -> None:
    model = _llava()

    def ambiguous(**_: object) -> None:
        raise ValueError("Multiple valid text configs were found in the model config")

    monkeypatch.setattr(model.config, "get_text_config", ambiguous)
    with pytest.raises(UnsupportedModelError, match="with more than one text model"):
        M.load(model)


def test_a_decoder_whose_config_names_other_heads_is_audited_with_the_heads_it_calls() -> None:
    # A BART decoder alone: its config's num_attention_heads is the encoder's (2); the decoder calls 4 heads, and a
    # cross-attention module beside each self-attention, which no text input calls, is no layer.
    config = BartConfig(
        vocab_size=VOCAB, d_model=24, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=41,
        attn_implementation="eager",
    )  # fmt: skip
    model = _spread(BartForCausalLM(config))
    adapter = M.load(model)
    assert (adapter.spec.n_layer, adapter.spec.n_head, adapter.spec.n_kv_head, adapter.spec.d_head) == (2, 4, 4, 6)
    assert adapter.spec.causal
    with torch.no_grad():  # transformers' BART decoder alone fails with its cache on
        reference = model(input_ids=IDS, output_attentions=True, use_cache=False).attentions
    _assert_rows_are_the_models(adapter, reference)


def test_a_family_with_an_attention_registry_of_its_own_is_tapped(monkeypatch) -> None:
    # Doge keeps an AttentionInterface of its own in its modeling module; Mixtral is given one here.
    import transformers.models.mixtral.modeling_mixtral as mixtral
    from transformers.modeling_utils import AttentionInterface

    monkeypatch.setattr(mixtral, "ALL_ATTENTION_FUNCTIONS", AttentionInterface())
    model = tiny_model("mixtral", attn_implementation="eager")
    _assert_rows_are_the_models(M.load(model), eager_attentions(model, IDS))


def test_an_audit_whose_layers_never_reach_the_tap_is_refused(monkeypatch) -> None:
    import transformers.models.mixtral.modeling_mixtral as mixtral
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    adapter = M.load(tiny_model("mixtral"))
    monkeypatch.setattr(mixtral, "ALL_ATTENTION_FUNCTIONS", AttentionInterface())
    monkeypatch.setattr(hf_tap, "_registries", lambda modules: [ALL_ATTENTION_FUNCTIONS])  # the global one only
    with pytest.raises(UnsupportedModelError, match=r"layers \[0, 1\] of .* never called the attention function"):
        capture_row_statistics(adapter, IDS)
    with pytest.raises(UnsupportedModelError, match=r"layers \[0, 1\] of .* never called the attention function"):
        list(adapter.stream_attention(IDS))


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_calls_with_other_heads_than_the_spec_are_refused(family: str) -> None:
    adapter = M.load(tiny_model(family))
    adapter.spec = replace(adapter.spec, n_head=4)  # of the 6 heads it calls, a spec that leaves 2 out
    with pytest.raises(UnsupportedModelError, match="calls its attention with 6 query heads and 2 key heads"):
        capture_row_statistics(adapter, IDS)
    with pytest.raises(UnsupportedModelError, match="calls its attention with 6 query heads"):
        list(adapter.stream_attention(IDS))


def test_a_fused_projection_that_the_spec_does_not_describe_is_refused_for_bounds() -> None:
    adapter = M.load(tiny_model("gpt2"))
    adapter.spec = replace(adapter.spec, n_head=1, n_kv_head=1)  # its c_attn holds 3 heads of 7
    with pytest.raises(UnsupportedModelError, match=r"fused qkv projection has 63 rows where .* give 21"):
        bound_model(adapter, IDS[:1])
