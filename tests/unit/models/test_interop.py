"""TransformerLens and nnsight wrappers: ``attnsens.models.load`` audits the transformers module inside them, with
the wrapper's own rows (TransformerLens' ``hook_pattern``) and the weights-fidelity gate before any bound."""

from __future__ import annotations

import warnings

import pytest
import torch

import attnsens.models as M
from attnsens.capture import RowSelection, capture_row_statistics
from attnsens.errors import UnsupportedModelError, WeightsFidelityError
from attnsens.study.bounds import bound_model
from tests.unit.models.tiny_models import VOCAB, eager_attentions, tiny_model

IDS = torch.randint(2, VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))


def _tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0")


def _bridge(model: torch.nn.Module):
    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    return bridge_module.TransformerBridge.boot_transformers(
        "tiny", hf_model=model, tokenizer=_tokenizer(model.config.vocab_size)
    )


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "gemma2"])
def test_a_transformer_bridge_is_audited_with_its_own_rows(family: str) -> None:
    """gpt2 (fused qkv), llama (RoPE, GQA), mistral (sliding window), gemma2 (softcap, eager)."""
    model = tiny_model(family, attn_implementation="eager")
    reference = eager_attentions(model, IDS)
    bridge = _bridge(model)
    _, cache = bridge.run_with_cache(IDS)
    adapter = M.load(bridge)
    assert adapter.module is model and adapter.tokenizer is bridge.tokenizer
    for chunk in adapter.stream_attention(IDS, chunk_size=4):
        pattern = cache[f"blocks.{chunk.layer}.attn.hook_pattern"]
        index = chunk.query_positions[:, None, :, None].expand(-1, len(chunk.heads), -1, IDS.shape[1])
        torch.testing.assert_close(chunk.probs, torch.gather(pattern, 2, index), rtol=0, atol=1e-6)
        torch.testing.assert_close(chunk.probs, torch.gather(reference[chunk.layer], 2, index), rtol=1e-5, atol=1e-6)
    assert adapter.tokenwise_modules() == []  # the bridge's components run the blocks, MLPs included
    blocks = capture_row_statistics(adapter, IDS, selection=RowSelection(chunk_size=4))
    assert {block.layer for block in blocks} == {0, 1}
    _, results = M.weights_fidelity(adapter, IDS)
    assert max(r.relative_error for r in results) < 1e-5
    table = bound_model(adapter, IDS[:1], n_queries=3, iterations=4)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["mha_jacobian_estimate"] <= layer_rows["mha_local_jacobian_upper_bound"]).all()


def test_compatibility_mode_keeps_the_rows_and_the_gate_judges_the_rewritten_weights() -> None:
    """enable_compatibility_mode() folds and centres GPT-2's weights in place: the bridge's rows stay the model's,
    while the blocks no longer match what the adapter reads, so the gate refuses to bound them."""
    model = tiny_model("gpt2", attn_implementation="eager")
    reference = eager_attentions(model, IDS)
    bridge = _bridge(model)
    bridge.enable_compatibility_mode()
    adapter = M.load(bridge)
    for chunk in adapter.stream_attention(IDS):
        torch.testing.assert_close(chunk.probs, reference[chunk.layer], rtol=1e-5, atol=1e-6)
    with pytest.raises(WeightsFidelityError):
        M.check_weights_fidelity(adapter, IDS)


def test_a_hooked_transformer_is_refused_with_the_way_forward() -> None:
    HookedTransformer = type(
        "HookedTransformer", (torch.nn.Module,), {"__module__": "transformer_lens.HookedTransformer"}
    )
    with pytest.raises(UnsupportedModelError, match="TransformerBridge"):
        M.load(HookedTransformer())


@pytest.mark.parametrize("wrapper", ["TransformersModel", "LanguageModel"])
def test_an_nnsight_model_is_audited_through_its_module(wrapper: str) -> None:
    nnsight = pytest.importorskip("nnsight")
    model = tiny_model("qwen3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nnsight 0.8 deprecates LanguageModel in favour of TransformersModel
        wrapped = getattr(nnsight, wrapper)(model, tokenizer=_tokenizer(VOCAB))
    adapter = M.load(wrapped)
    assert adapter.module is model
    reference = eager_attentions(model, IDS)
    for chunk in adapter.stream_attention(IDS):
        torch.testing.assert_close(chunk.probs, reference[chunk.layer], rtol=1e-5, atol=1e-6)
    M.check_weights_fidelity(adapter, IDS)
    assert adapter.encode("w3 w4 w5").tolist() == [[3, 4, 5]]


def test_an_audit_only_family_inside_a_bridge_is_audited_through_the_bridge_components() -> None:
    """DeepSeek-V3 is audit-only (its latent attention): its attention layers are found as the bridge's components
    (the original modules they wrap are never called), its rows are the bridge's own, causal."""
    model = tiny_model("deepseek_v3", attn_implementation="eager")
    model.config.architectures = ["DeepseekV3ForCausalLM"]  # how the bridge finds its adapter
    reference = eager_attentions(model, IDS)
    adapter = M.load(_bridge(model))
    assert adapter.spec.causal and adapter.spec.n_layer == 2
    assert (adapter.spec.n_head, adapter.spec.n_kv_head, adapter.spec.d_head) == (6, 6, 8)  # the config's head_dim
    chunks = list(adapter.stream_attention(IDS, chunk_size=4))
    assert sorted({chunk.layer for chunk in chunks}) == [0, 1]
    for chunk in chunks:
        index = chunk.query_positions[:, None, :, None].expand(-1, len(chunk.heads), -1, IDS.shape[1])
        torch.testing.assert_close(chunk.probs, torch.gather(reference[chunk.layer], 2, index), rtol=1e-5, atol=1e-6)
    with pytest.raises(UnsupportedModelError, match="no block layout"):
        bound_model(adapter, IDS[:1])
