"""gpt_layer_weights: the own GPT's normalized layout rebuilds its forward pass (docs/math.md §2.6–2.9)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from attnsens.models.own_gpt import gpt_layer_weights
from attnsens.train.model import GPT, GPTConfig
from attnsens.weights import LayerWeights, NormWeights

BATCH, QUERY, VOCAB, HEAD, D_HEAD = 2, 7, 13, 3, 5


def layer_norm(x: torch.Tensor, norm: NormWeights) -> torch.Tensor:
    centered = x - x.mean(-1, keepdim=True)
    sigma = torch.sqrt((centered**2).mean(-1, keepdim=True) + norm.eps)
    out = norm.gamma.double() * centered / sigma
    return out + norm.beta.double() if norm.beta is not None else out


def attention_from_weights(x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
    """MHA(X) from the normalized layout, one head and one query row at a time, in float64."""
    a = layer.attention
    out = torch.zeros_like(x)
    n_query = x.shape[1]
    for b in range(x.shape[0]):
        for h in range(a.n_head):

            def proj(w: torch.Tensor, bias: torch.Tensor | None, h: int = h, b: int = b) -> torch.Tensor:
                y = x[b] @ w[h].double().T
                return y + bias[h].double() if bias is not None else y

            q, k, v = proj(a.w_q, a.b_q), proj(a.w_k, a.b_k), proj(a.w_v, a.b_v)
            for i in range(n_query):
                keys = i + 1 if a.causal else n_query
                p = torch.softmax(k[:keys] @ q[i] / a.tau, dim=0)
                y = p @ v[:keys]
                out[b, i] += a.w_o[:, h * a.d_head : (h + 1) * a.d_head].double() @ y
    return out + a.b_o.double() if a.b_o is not None else out


def mlp_from_weights(x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
    m = layer.mlp
    hidden = x @ m.w_in.double().T + (m.b_in.double() if m.b_in is not None else 0.0)
    act = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[m.activation]
    return act(hidden) @ m.w_out.double().T + (m.b_out.double() if m.b_out is not None else 0.0)


def block_from_weights(x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
    if layer.placement == "pre":
        x = x + attention_from_weights(layer_norm(x, layer.attn_norm), layer)
        return x + mlp_from_weights(layer_norm(x, layer.mlp_norm), layer)
    if layer.placement == "none":
        x = x + attention_from_weights(x, layer)
        return x + mlp_from_weights(x, layer)
    alpha = layer.residual_scale
    x = layer_norm(alpha * x + attention_from_weights(x, layer), layer.attn_norm)
    return layer_norm(alpha * x + mlp_from_weights(x, layer), layer.mlp_norm)


@pytest.mark.parametrize(
    ("norm", "causal", "bias", "activation"),
    [
        ("pre", True, True, "gelu_tanh"),
        ("post", True, True, "gelu"),
        ("deepnorm", True, False, "relu"),
        ("none", False, True, "relu"),
        ("pre", False, False, "gelu"),
    ],
)
def test_layer_weights_rebuild_every_block(norm: str, causal: bool, bias: bool, activation: str) -> None:
    config = GPTConfig(
        vocab_size=VOCAB,
        n_layer=3,
        n_head=HEAD,
        d_model=HEAD * D_HEAD,
        d_ff=11,
        max_positions=QUERY,
        norm=norm,
        causal=causal,
        bias=bias,
        activation=activation,
    )
    model = GPT(config).double().eval()
    with torch.no_grad():  # move every parameter off its structured init so that swapped roles show
        for name, param in model.named_parameters():
            base = 1.0 if "ln_" in name and name.endswith("weight") else 0.0
            param.copy_(base + 0.3 * torch.randn_like(param))
    seen: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if name.endswith(("hook_resid_pre", "hook_resid_post", "hook_attn_out")) or name == "hook_final":
            module.register_forward_hook(lambda _m, _i, out, name=name: seen.__setitem__(name, out.detach()))
    ids = torch.randint(0, VOCAB, (BATCH, QUERY), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids)
    layers = gpt_layer_weights(model)
    assert [layer.index for layer in layers] == [0, 1, 2]
    assert layers[0].attention.w_q.shape == (HEAD, D_HEAD, HEAD * D_HEAD)
    assert layers[0].attention.tau == pytest.approx(D_HEAD**0.5)
    for i, layer in enumerate(layers):
        rebuilt = block_from_weights(seen[f"blocks.{i}.hook_resid_pre"], layer)
        torch.testing.assert_close(rebuilt, seen[f"blocks.{i}.hook_resid_post"].double(), rtol=1e-5, atol=1e-5)
    if norm == "pre":
        x = seen[f"blocks.{config.n_layer - 1}.hook_resid_post"]
        ln_f = NormWeights(
            kind="layernorm",
            gamma=model.ln_f.weight.detach(),
            beta=None if model.ln_f.bias is None else model.ln_f.bias.detach(),
            eps=config.layer_norm_eps,
        )
        torch.testing.assert_close(layer_norm(x, ln_f), seen["hook_final"], rtol=1e-5, atol=1e-5)


def test_layer_weights_are_copies() -> None:
    model = GPT(GPTConfig(vocab_size=VOCAB, n_layer=1, n_head=HEAD, d_model=HEAD * D_HEAD, max_positions=QUERY))
    before = gpt_layer_weights(model)[0].attention.w_q.clone()
    with torch.no_grad():
        model.blocks[0].attn.c_attn.weight.add_(1.0)
    torch.testing.assert_close(gpt_layer_weights(model)[0].attention.w_q, before + 1.0)
    assert not torch.equal(gpt_layer_weights(model)[0].attention.w_q, before)


def test_reference_block_catches_a_swapped_head_layout() -> None:
    """Meta-test: the rebuild fails when W_Q's heads are permuted, so the comparison above can fail."""
    config = GPTConfig(vocab_size=VOCAB, n_layer=1, n_head=HEAD, d_model=HEAD * D_HEAD, max_positions=QUERY)
    model = GPT(config).double().eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(0.3 * torch.randn_like(param) + (1.0 if param.ndim == 1 and param.shape[0] == 15 else 0.0))
    x = torch.randn(BATCH, QUERY, HEAD * D_HEAD, dtype=torch.float64)
    layer = gpt_layer_weights(model)[0]
    good = block_from_weights(x, layer)
    wrong_attention = type(layer.attention)(**{**layer.attention.__dict__, "w_q": layer.attention.w_q.flip(0)})
    wrong = block_from_weights(x, type(layer)(**{**layer.__dict__, "attention": wrong_attention}))
    with torch.no_grad():
        actual = model.blocks[0](x)
    torch.testing.assert_close(good, actual, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(wrong, actual, rtol=1e-3, atol=1e-3)
