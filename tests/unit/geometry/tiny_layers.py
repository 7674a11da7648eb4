"""Tiny random ``LayerWeights`` stacks built in code for geometry, study and CLI tests."""

from __future__ import annotations

import math

import torch

from attnsens.weights import AttentionWeights, LayerWeights, MLPWeights, NormWeights, RotaryConfig


def tiny_layers(
    placement: str = "pre",
    *,
    n_layer: int = 2,
    d_model: int = 10,
    n_head: int = 2,
    n_kv_head: int = 2,
    d_head: int = 3,
    d_ff: int = 14,
    gated: bool = False,
    norm: str = "layernorm",
    rotary: bool = False,
    biases: bool = True,
    gate_bias: bool = False,
    out_norms: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> list[LayerWeights]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype) * scale

    s = 1 / math.sqrt(d_model)
    layers = []
    for index in range(n_layer):
        attention = AttentionWeights(
            w_q=r(n_head, d_head, d_model, scale=2 * s), w_k=r(n_kv_head, d_head, d_model, scale=2 * s),
            w_v=r(n_kv_head, d_head, d_model, scale=s), w_o=r(d_model, n_head * d_head, scale=s),
            b_q=r(n_head, d_head, scale=0.1) if biases else None,
            b_k=r(n_kv_head, d_head, scale=0.1) if biases else None,
            b_v=r(n_kv_head, d_head, scale=0.1) if biases else None,
            b_o=r(d_model, scale=0.1) if biases else None,
            tau=math.sqrt(d_head), causal=True,
            rotary=RotaryConfig(base=100.0, rotary_dim=2) if rotary else None,
        )  # fmt: skip
        mlp = MLPWeights(
            kind="gated" if gated else "mlp", activation="silu" if gated else "gelu_tanh",
            w_in=r(d_ff, d_model, scale=s), w_out=r(d_model, d_ff, scale=1 / math.sqrt(d_ff)),
            b_in=r(d_ff, scale=0.1) if biases and (gate_bias or not gated) else None,
            b_out=r(d_model, scale=0.1) if biases else None,
            w_gate=r(d_ff, d_model, scale=s) if gated else None,
            b_gate=r(d_ff, scale=0.5) if gated and gate_bias else None,
        )  # fmt: skip

        def make_norm(always: bool = False) -> NormWeights | None:
            if placement == "none" and not always:
                return None
            beta = r(d_model, scale=0.1) if norm == "layernorm" else None
            return NormWeights(kind=norm, gamma=1 + r(d_model, scale=0.2), beta=beta, eps=1e-5)

        layers.append(LayerWeights(
            index=index, placement=placement, attention=attention, mlp=mlp, attn_norm=make_norm(),
            mlp_norm=make_norm(), attn_out_norm=make_norm(True) if out_norms else None,
            mlp_out_norm=make_norm(True) if out_norms else None,
        ))  # fmt: skip
    return layers
