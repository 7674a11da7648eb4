"""Reference forward passes of norms, positionwise maps and whole residual blocks from ``LayerWeights``.

These are the functions the block bounds (``blocks``) and the residual-Jacobian expansions (``residual``) are
about; they follow ``attnsens.weights`` exactly (placements "pre", "post", "none", and "pre" without a norm before
the attention; DeepNorm's residual scale α in the post placement; the optional norms after each sublayer,
``attn_out_norm`` and ``mlp_out_norm``, applied to the sublayer's output before the residual sum).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnsens.errors import ConfigError
from attnsens.geometry.attention import mha_forward, rms_norm_forward
from attnsens.weights import AttentionWeights, LayerWeights, MLPWeights, MoEWeights, NormWeights, XIELUParameters


def activation(name: str, x: Tensor, xielu: XIELUParameters | None = None) -> Tensor:
    """gelu (erf), gelu_tanh, relu, silu, quick_gelu z·σ(1.702 z) (CLIP), relu2 relu(z)² (Nemotron, Arcee) or
    xielu (Apertus; ``xielu_forward`` with its parameters ``xielu``) applied elementwise."""
    if name == "gelu":
        return torch.nn.functional.gelu(x)
    if name == "gelu_tanh":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if name == "relu":
        return torch.relu(x)
    if name == "silu":
        return torch.nn.functional.silu(x)
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    if name == "relu2":
        return torch.relu(x).square()
    if name == "xielu":
        if xielu is None:
            raise ConfigError("the activation xielu needs its parameters (MLPWeights.xielu)")
        return xielu_forward(x, xielu)
    raise ConfigError(f"unknown activation {name!r}; expected gelu, gelu_tanh, relu, silu, quick_gelu, relu2 or xielu")


def xielu_forward(x: Tensor, xielu: XIELUParameters) -> Tensor:
    """xIELU elementwise: α_p z² + β z for z > 0, α_n (expm1(min(z, ε)) − z) + β z for z ≤ 0, in the operations and
    order of transformers' ``XIELUActivation`` (``attnsens.weights.XIELUParameters``).

    >>> from attnsens.weights import XIELUParameters
    >>> xielu_forward(torch.tensor([2.0, 0.0]), XIELUParameters(alpha_p=0.5, alpha_n=1.0, beta=0.5, eps=0.0))
    tensor([3., 0.])
    """
    negative = (torch.expm1(torch.clamp_max(x, xielu.eps)) - x) * xielu.alpha_n + xielu.beta * x
    return torch.where(x > 0, xielu.alpha_p * x * x + xielu.beta * x, negative)


def norm_forward(x: Tensor, norm: NormWeights) -> Tensor:
    """LayerNorm γ ⊙ (x − μ)/σ + β or RMSNorm γ ⊙ x/r, tokenwise over the last axis (docs/math.md §2.8)."""
    if norm.kind != "layernorm":
        return rms_norm_forward(x, norm)
    centered = x - x.mean(dim=-1, keepdim=True)
    y = centered / torch.sqrt(centered.square().mean(dim=-1, keepdim=True) + norm.eps) * norm.gamma.to(x.dtype)
    return y if norm.beta is None else y + norm.beta.to(x.dtype)


def mlp_forward(x: Tensor, mlp: MLPWeights | MoEWeights) -> Tensor:
    """W_out act(W_in x + b_in) + b_out, or gated W_out (act(W_gate x + b_gate) ⊙ (W_in x + b_in)) + b_out
    (docs/math.md §2.7); a mixture of experts as ``moe_forward``."""
    if isinstance(mlp, MoEWeights):
        return moe_forward(x, mlp)
    hidden = x @ mlp.w_in.to(x.dtype).T
    if mlp.b_in is not None:
        hidden = hidden + mlp.b_in.to(x.dtype)
    if mlp.kind == "gated":
        gate = x @ mlp.gate.to(x.dtype).T
        if mlp.b_gate is not None:
            gate = gate + mlp.b_gate.to(x.dtype)
        hidden = activation(mlp.activation, gate, mlp.xielu) * hidden
    else:
        hidden = activation(mlp.activation, hidden, mlp.xielu)
    out = hidden @ mlp.w_out.to(x.dtype).T
    return out if mlp.b_out is None else out + mlp.b_out.to(x.dtype)


def moe_routing(x: Tensor, moe: MoEWeights) -> tuple[Tensor, Tensor, Tensor]:
    """The router of a mixture of experts on ``x`` ``[..., d_model]``: logits ℓ = W_r x ``[..., expert]``, the
    selected experts S (the ``top_k`` largest logits, in decreasing order) ``[..., top_k]`` and their gate weights
    g ``[..., top_k]``: softmax(ℓ_S) ("topk_softmax") or softmax(ℓ) on S ("softmax"; ``MoEWeights``).

    >>> from attnsens.weights import MLPWeights, MoEWeights
    >>> expert = MLPWeights(kind="mlp", activation="relu", w_in=torch.eye(1), w_out=torch.eye(1))
    >>> moe = MoEWeights(router=torch.tensor([[1.0], [-1.0]]), experts=(expert, expert), top_k=1,
    ...                  gate_mode="topk_softmax")
    >>> moe_routing(torch.tensor([2.0]), moe)
    (tensor([ 2., -2.]), tensor([0]), tensor([1.]))
    """
    logits = x @ moe.router.to(x.dtype).T
    selected = logits.topk(moe.top_k, dim=-1).indices
    if moe.gate_mode == "topk_softmax":
        return logits, selected, torch.softmax(logits.gather(-1, selected), dim=-1)
    return logits, selected, torch.softmax(logits, dim=-1).gather(-1, selected)


def moe_forward(x: Tensor, moe: MoEWeights) -> Tensor:
    """Σ_{e∈S(x)} g_e(x) E_e(x) + σ(w_s·x) E_s(x) tokenwise (``moe_routing``; the shared term only with a shared
    expert), each expert as ``mlp_forward``; experts that no token selects are not evaluated."""
    logits, selected, weights = moe_routing(x, moe)
    dense = torch.zeros_like(logits).scatter(-1, selected, weights)  # [..., expert], 0 off S
    out = torch.zeros_like(x)
    for index, expert in enumerate(moe.experts):
        if bool((selected == index).any()):
            out = out + dense[..., index : index + 1] * mlp_forward(x, expert)
    if moe.shared is not None and moe.shared_gate is not None:
        gate = torch.sigmoid(x @ moe.shared_gate.to(x.dtype))[..., None]
        out = out + gate * mlp_forward(x, moe.shared)
    return out


def attention_sublayer(x: Tensor, attention: AttentionWeights) -> Tensor:
    """MHA(x) for ``x: [batch, query, d_model]`` with the weights' mask, biases, rotary and temperature."""
    return mha_forward(x, attention).output


def attention_branch(x: Tensor, layer: LayerWeights) -> Tensor:
    """What the attention sublayer adds to the residual stream, from its input ``x`` (N1's output for pre-LN):
    N_ao(A(x)) with the layer's ``attn_out_norm``, A(x) without one."""
    out = attention_sublayer(x, layer.attention)
    return out if layer.attn_out_norm is None else norm_forward(out, layer.attn_out_norm)


def mlp_branch(x: Tensor, layer: LayerWeights) -> Tensor:
    """What the MLP adds to the residual stream, from its input ``x``: N_mo(F(x)) with ``mlp_out_norm``, else F(x)."""
    out = mlp_forward(x, layer.mlp)
    return out if layer.mlp_out_norm is None else norm_forward(out, layer.mlp_out_norm)


def attention_input(x: Tensor, layer: LayerWeights) -> Tensor:
    """What the attention sublayer reads from the block input ``x``: N1(x) in a "pre" layer with ``attn_norm``,
    ``x`` itself otherwise (``LayerWeights.attention_reads_stream``)."""
    return x if layer.attn_norm is None or layer.placement != "pre" else norm_forward(x, layer.attn_norm)


def attention_half(x: Tensor, layer: LayerWeights) -> Tensor:
    """The attention residual sublayer of a block: x + A(N1(x)), N1(αx + A(x)) or x + A(x) (placement "none", or a
    "pre" layer without N1), with A followed by ``attn_out_norm`` when the layer has one (pre: x + N_ao(A(N1(x)));
    none: x + N_ao(A(x)))."""
    if layer.placement != "post":
        return x + attention_branch(attention_input(x, layer), layer)
    attn_norm, _ = layer.norms()
    return norm_forward(layer.residual_scale * x + attention_sublayer(x, layer.attention), attn_norm)


def mlp_half(x: Tensor, layer: LayerWeights) -> Tensor:
    """The positionwise residual sublayer of a block: x + F(N2(x)), N2(αx + F(x)) or x + F(x), with F followed by
    ``mlp_out_norm`` when the layer has one."""
    if layer.placement == "none":
        return x + mlp_branch(x, layer)
    mlp_norm = layer.mlp_pre_norm()
    if layer.placement == "pre":
        return x + mlp_branch(norm_forward(x, mlp_norm), layer)
    return norm_forward(layer.residual_scale * x + mlp_forward(x, layer.mlp), mlp_norm)


def block_forward(x: Tensor, layer: LayerWeights) -> Tensor:
    """One transformer block (``LayerWeights`` docstring): ``[batch, query, d_model]`` → same shape.

    Raises:
        ConfigError: a layer with a branch beside its attention (``LayerWeights.beside_attention``), whose block
            these weights do not define.
    """
    check_whole_block(layer)
    if layer.parallel_residual:
        attn_norm, mlp_norm = layer.norms()
        attn = attention_sublayer(norm_forward(x, attn_norm), layer.attention)
        return x + attn + mlp_forward(norm_forward(x, mlp_norm), layer.mlp)
    return mlp_half(attention_half(x, layer), layer)


def check_whole_block(layer: LayerWeights) -> None:
    """ConfigError unless ``layer``'s weights define its whole block (no ``beside_attention`` branch)."""
    if layer.beside_attention is not None:
        raise ConfigError(
            f"layer {layer.index}: its block adds {layer.beside_attention} beside the attention, which attnsens does "
            "not model; its attention and MLP are bounded each on its own, and no block forward or bound exists"
        )


def residual_stream(x: Tensor, layers: list[LayerWeights]) -> list[Tensor]:
    """Block inputs X_0 = x, X_{ℓ+1} = block_ℓ(X_ℓ); returns [X_0, …, X_N] (N + 1 tensors)."""
    stream = [x]
    for layer in layers:
        stream.append(block_forward(stream[-1], layer))
    return stream


def synthetic_block_input(
    d_model: int, n_query: int, *, batch: int = 1, rms: float = 1.0, seed: int = 0, dtype: torch.dtype = torch.float64
) -> Tensor:
    """Seeded Gaussian residual stream ``[batch, query, d_model]`` with every token's RMS equal to ``rms``."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n_query, d_model, generator=generator, dtype=dtype)
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True) * (rms * math.sqrt(d_model))
