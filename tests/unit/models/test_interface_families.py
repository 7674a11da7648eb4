"""Rows of every family audited through the attention-function interface agree with eager ``output_attentions``
(≤ 1e-5), under the model's own causal, padding and sliding-window masks and softcaps; families whose eager
attention bypasses the interface are refused by name, and audit-only families refuse bounds by name."""

from __future__ import annotations

import pytest
import torch

import attnsens.models as M
from attnsens.capture import capture_row_statistics
from attnsens.errors import UnsupportedModelError
from attnsens.study.bounds import bound_model
from tests.unit.models.tiny_models import (
    AUDIT_ONLY_FAMILIES,
    BYPASS_FAMILIES,
    DECODER_FAMILIES,
    ENCODER_FAMILIES,
    FAMILIES,
    INTERFACE_FAMILIES,
    VISION_FAMILIES,
    VOCAB,
    eager_attentions,
    tiny_model,
)

IDS = torch.randint(2, VOCAB, (2, 13), generator=torch.Generator().manual_seed(11))
LEFT_PADDED = torch.ones(2, 13, dtype=torch.long)
LEFT_PADDED[1, :4] = 0
RIGHT_PADDED = torch.ones(2, 13, dtype=torch.long)
RIGHT_PADDED[0, 9:] = 0
EVERY_FAMILY = (*FAMILIES, *DECODER_FAMILIES, *ENCODER_FAMILIES, *INTERFACE_FAMILIES)
SOFTCAPPED = {"gemma2": {"attn_logit_softcapping": 2.0}}


def _assert_rows_match(model: torch.nn.Module, mask: torch.Tensor | None) -> M.ModelAdapter:
    adapter = M.load(model)
    reference = eager_attentions(model, IDS, attention_mask=mask)
    real = torch.ones_like(IDS, dtype=torch.bool) if mask is None else mask.bool()
    chunks = list(adapter.stream_attention(IDS, attention_mask=mask, chunk_size=5))
    assert sorted({chunk.layer for chunk in chunks}) == [0, 1]
    for chunk in chunks:
        expected = torch.gather(
            reference[chunk.layer], 2, chunk.query_positions[:, None, :, None].expand(-1, len(chunk.heads), -1, 13)
        )
        rows = real.gather(1, chunk.query_positions)[:, None, :].expand(-1, len(chunk.heads), -1)  # padded rows
        torch.testing.assert_close(chunk.probs[rows], expected[rows], rtol=1e-5, atol=1e-5)
        keys = real[:, None, None, :].expand_as(chunk.probs)
        assert torch.all(chunk.probs[rows[..., None].expand_as(keys) & ~keys] == 0)  # padded keys get exactly 0
    return adapter


@pytest.mark.parametrize("mask", [None, LEFT_PADDED, RIGHT_PADDED], ids=["no padding", "left", "right"])
@pytest.mark.parametrize("family", EVERY_FAMILY)
def test_rows_match_eager_attention_under_the_models_own_masks(family: str, mask: torch.Tensor | None) -> None:
    implementation = "eager" if family in (*SOFTCAPPED, "vaultgemma", "bloom", "mpt") else "sdpa"  # no sdpa path
    _assert_rows_match(tiny_model(family, attn_implementation=implementation, **SOFTCAPPED.get(family, {})), mask)


@pytest.mark.parametrize("family", ["mixtral", "starcoder2", "gemma3_text", "modernbert"])
def test_sliding_windows_are_read_from_the_mask_of_each_layer(family: str) -> None:
    adapter = _assert_rows_match(tiny_model(family, attn_implementation="eager"), None)
    widest = {layer: 0 for layer in range(2)}
    for chunk in adapter.stream_attention(IDS):
        widest[chunk.layer] = max(widest[chunk.layer], int(chunk.n_keys.max()))
    expected = {"mixtral": [5, 5], "starcoder2": [5, 5], "gemma3_text": [5, 13], "modernbert": [13, 7]}
    assert [widest[0], widest[1]] == expected[family]


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("family", INTERFACE_FAMILIES)
def test_the_spec_says_causal_exactly_when_the_rows_are(family: str, implementation: str) -> None:
    """The CLIP text tower's layers say ``is_causal = False`` and are called with a causal mask: the spec follows
    the calls, not the attribute."""
    adapter = M.load(tiny_model(family, attn_implementation=implementation))
    first_layer = [chunk for chunk in adapter.stream_attention(IDS) if chunk.layer == 0]
    # No row sees a later key (Mixtral's tiny config also has a window).
    rows_causal = all(bool((chunk.n_keys <= chunk.query_positions + 1).all()) for chunk in first_layer)
    assert adapter.spec.causal == rows_causal
    assert adapter.spec.causal == (family != "modernbert")


@pytest.mark.parametrize("family", BYPASS_FAMILIES)
def test_families_whose_attention_bypasses_the_interface_are_refused_by_name(family: str) -> None:
    with pytest.raises(UnsupportedModelError, match=f"'{family}' is not supported: its eager attention computes"):
        M.load(tiny_model(family, attn_implementation="eager"))


def test_a_model_without_interface_calls_is_refused_naming_its_attention_class() -> None:
    from attnsens.models.interface import InterfaceAdapter

    model = tiny_model("gpt_neo", attn_implementation="eager")
    with pytest.raises(UnsupportedModelError, match=r"gpt_neo: its attention .*GPTNeoSelfAttention.* computes"):
        InterfaceAdapter(model, name="gpt-neo")


@pytest.mark.parametrize("family", AUDIT_ONLY_FAMILIES)
def test_audit_only_families_refuse_bounds_by_name(family: str) -> None:
    adapter = M.load(tiny_model(family, attn_implementation="eager"))  # gpt_oss has no sdpa path
    with pytest.raises(UnsupportedModelError, match=f"{family}: attnsens audits its attention rows but has no block"):
        bound_model(adapter, IDS[:1])


@pytest.mark.parametrize(
    ("family", "reason"),
    [("deepseek_v3", "multi-head latent attention")],
)
def test_bounds_are_refused_with_the_reason_of_the_family(family: str, reason: str) -> None:
    """Mixtures of experts, hybrids and the dense families attnsens cannot read are refused in one line that says
    why, while their rows stay auditable."""
    adapter = M.load(tiny_model(family))
    assert capture_row_statistics(adapter, IDS[:1])
    with pytest.raises(UnsupportedModelError, match=f"{family}: .*no block layout for it \\(.*{reason}"):
        bound_model(adapter, IDS[:1])


def test_every_family_refused_bounds_is_a_transformers_family_without_a_layout() -> None:
    from transformers import CONFIG_MAPPING

    from attnsens.models.interface import NO_BOUNDS
    from attnsens.models.loading import FAMILIES as BOUNDED

    assert all(family in CONFIG_MAPPING and family not in BOUNDED for family in NO_BOUNDS)
    assert all("\n" not in why for why in NO_BOUNDS.values())


@pytest.mark.parametrize("family", VISION_FAMILIES)
def test_vision_rows_match_eager_attention(family: str) -> None:
    """Every token a vision encoder runs is audited: DeiT's distillation token beside [CLS], SigLIP's patches
    alone."""
    model, n = tiny_model(family), VISION_FAMILIES[family]
    pixels = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(5))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        reference = model(pixel_values=pixels, output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    adapter = M.load(model)
    assert adapter.sequence_shape(pixels) == (2, n)
    chunks = list(adapter.stream_attention(pixels, chunk_size=4))
    assert [chunk.layer for chunk in chunks] == [0] * -(-n // 4) + [1] * -(-n // 4)
    for chunk in chunks:
        index = chunk.query_positions[:, None, :, None].expand(-1, 3, -1, n)
        torch.testing.assert_close(chunk.probs, torch.gather(reference[chunk.layer], 2, index), rtol=1e-5, atol=1e-5)
        assert torch.equal(chunk.n_keys, torch.full_like(chunk.n_keys, n))


def test_attention_sinks_take_their_mass_and_are_not_reported() -> None:
    """GPT-OSS passes one sink logit per head (``s_aux``): rows sum to less than 1, as in eager attention; the row
    statistics, which assume rows summing to 1, refuse them by name."""
    model = tiny_model("gpt_oss", attn_implementation="eager")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
    adapter = _assert_rows_match(model, LEFT_PADDED)
    rows = torch.cat([chunk.probs[0].sum(dim=-1).flatten() for chunk in adapter.stream_attention(IDS)])
    assert float(rows.min()) < 0.9 and float(rows.max()) <= 1.0 + 1e-6
    with pytest.raises(UnsupportedModelError, match=r"layer 0 of .* has attention sinks: its rows sum to less than 1"):
        capture_row_statistics(adapter, IDS)


def test_call_arguments_of_unknown_effect_are_refused_by_name() -> None:
    from attnsens.models.hf_tap import attention_call

    module, query = torch.nn.Linear(2, 2), torch.zeros(1, 3, 5, 4)
    value, mask = torch.zeros(1, 3, 5, 4), torch.zeros(1, 1, 5, 5)
    call = attention_call(module, "sdpa", query, query, (value, mask), {"scaling": 0.25, "dropout": 0.0})
    assert (call.tau, call.mask is mask, call.softcap, call.sinks) == (4.0, True, None, None)
    with pytest.raises(UnsupportedModelError, match="Linear passes head_mask to its attention function"):
        attention_call(module, "sdpa", query, query, (value, mask), {"head_mask": torch.ones(3)})
    with pytest.raises(UnsupportedModelError, match="passes a dict attention mask"):
        attention_call(module, "flex_attention", query, query, (value, {"block": 1}), {})


def test_a_per_head_position_bias_gives_the_calls_scores_as_eager_attention_computes_them() -> None:
    """T5's relative-position bias [1, head, query, key] differs per head: the call carries q·kᵀ·scaling + bias +
    mask, and its rows are eager's softmax of those."""
    from attnsens.models.attention import call_rows
    from attnsens.models.hf_tap import attention_call

    generator = torch.Generator().manual_seed(5)
    query, key = torch.randn(2, 4, 6, 3, generator=generator), torch.randn(2, 2, 6, 3, generator=generator)
    bias = torch.randn(1, 4, 6, 6, generator=generator) * 3
    mask = torch.zeros(2, 1, 6, 6)
    mask[1, ..., :2] = torch.finfo(torch.float32).min  # two padded keys in the second sequence
    arguments = {"scaling": 0.5, "position_bias": bias}
    call = attention_call(torch.nn.Linear(2, 2), "eager", query, key, (key, mask), arguments)
    assert call.scores is not None and call.mask is None and call.value is None
    positions = torch.arange(6).expand(2, -1)
    probs, n_keys = call_rows(query, key, call, query_positions=positions)
    eager = torch.softmax(query @ key.repeat_interleave(2, dim=1).transpose(-1, -2) * 0.5 + bias + mask, dim=-1)
    torch.testing.assert_close(probs, eager, rtol=1e-6, atol=1e-7)
    assert n_keys[0].tolist() == [6] * 6 and n_keys[1].tolist() == [4] * 6


def test_an_additive_bias_in_the_mask_is_added_to_the_scores_like_eager_attention() -> None:
    """A float mask carrying a bias (ALiBi: −slope·(t − j)) besides −∞ for masked keys, against eager's formula."""
    from attnsens.models.attention import AttentionCall, call_rows

    generator = torch.Generator().manual_seed(13)
    query, key = torch.randn(2, 4, 7, 5, generator=generator), torch.randn(2, 2, 7, 5, generator=generator)
    distance = torch.arange(7).view(7, 1) - torch.arange(7).view(1, 7)
    bias = -0.5 * distance.float()
    mask = torch.where(distance >= 0, bias, torch.finfo(torch.float32).min).expand(2, 1, 7, 7).clone()
    mask[1, :, :, :2] = torch.finfo(torch.float32).min  # left padding of two keys in the second sequence
    positions = torch.arange(2, 7).expand(2, -1)
    probs, n_keys = call_rows(query, key, AttentionCall(tau=5**0.5, mask=mask), query_positions=positions)
    scores = query @ key.repeat_interleave(2, dim=1).transpose(-1, -2) * 5**-0.5 + mask
    torch.testing.assert_close(probs, torch.softmax(scores, dim=-1)[:, :, 2:], rtol=1e-6, atol=1e-7)
    assert n_keys.tolist() == [[3, 4, 5, 6, 7], [1, 2, 3, 4, 5]]


@pytest.mark.parametrize("mask", [None, LEFT_PADDED, RIGHT_PADDED], ids=["no padding", "left", "right"])
def test_a_mask_with_one_row_for_every_query_is_read_for_each_query(mask: torch.Tensor | None) -> None:
    """LayoutLM hands its attention function the old [batch, 1, 1, n] padding mask, broadcast over the queries."""
    from transformers import LayoutLMConfig, LayoutLMModel

    from tests.unit.models.tiny_models import spread_weights

    torch.manual_seed(0)
    config = LayoutLMConfig(
        vocab_size=VOCAB, hidden_size=21, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
        max_position_embeddings=41, attn_implementation="eager",
    )  # fmt: skip
    model = LayoutLMModel(config)
    spread_weights(model)
    _assert_rows_match(model.eval(), mask)
