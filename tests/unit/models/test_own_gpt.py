"""The own-GPT adapter: rows from hook_q/hook_k equal the model's hook_pattern; layer inputs and sums."""

from __future__ import annotations

import pytest
import torch

import attnsens.models as M
from attnsens.errors import InputError
from attnsens.train.model import GPT, GPTConfig


def _gpt(norm: str, causal: bool = True) -> GPT:
    torch.manual_seed(3)
    config = GPTConfig(vocab_size=31, n_layer=2, n_head=3, d_model=21, max_positions=19, norm=norm, causal=causal)
    return GPT(config).eval()


@pytest.mark.parametrize(("norm", "causal"), [("pre", True), ("post", True), ("deepnorm", True), ("none", False)])
def test_rows_match_hook_pattern(norm: str, causal: bool) -> None:
    model = _gpt(norm, causal)
    adapter = M.load(model)
    ids = torch.randint(0, 31, (2, 17))
    patterns = {}
    handles = [
        block.attn.hook_pattern.register_forward_hook(lambda m, a, out, i=i: patterns.__setitem__(i, out))
        for i, block in enumerate(model.blocks)
    ]
    with torch.no_grad():
        model(ids)
    for handle in handles:
        handle.remove()
    for chunk in adapter.stream_attention(ids, chunk_size=5):
        index = chunk.query_positions[:, None, :, None].expand(-1, 3, -1, 17)
        expected = torch.gather(patterns[chunk.layer], 2, index)
        torch.testing.assert_close(chunk.probs, expected, rtol=1e-5, atol=1e-6)
    assert adapter.spec.causal is causal


@pytest.mark.parametrize("norm", ["post", "deepnorm"])
def test_post_ln_residual_sums_normalize_to_the_next_inputs(norm: str) -> None:
    model = _gpt(norm)
    adapter = M.load(model)
    inputs = adapter.layer_inputs(torch.randint(0, 31, (1, 9)))
    layer = adapter.layers[0]
    ln = torch.nn.functional.layer_norm
    n1, n2 = layer.attn_norm, layer.mlp_norm
    torch.testing.assert_close(
        ln(inputs[0].attention_residual_sum, (21,), n1.gamma, n1.beta, n1.eps), inputs[0].mlp_input
    )
    torch.testing.assert_close(ln(inputs[0].mlp_residual_sum, (21,), n2.gamma, n2.beta, n2.eps), inputs[1].block_input)
    assert adapter.spec.placement == "post"


def test_encode_accepts_a_trained_tokenizers_tokenizer() -> None:
    from attnsens.train.data import train_tokenizer

    tokenizer = train_tokenizer(["to be or not to be, that is the question"] * 4, 300)
    adapter = M.load(_gpt("pre"), tokenizer=tokenizer)
    ids = adapter.encode("to be or not", max_length=3)
    expected = tokenizer.encode("to be or not").ids[:3]
    assert ids.tolist() == [expected]
    with pytest.raises(InputError, match="no tokenizer"):
        M.load(_gpt("pre")).encode("to be")
