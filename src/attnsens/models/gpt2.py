"""GPT-2 (HF ``GPT2Model`` / ``GPT2LMHeadModel``): pre-LayerNorm, learned positions, Conv1D weights.

Conv1D computes ``x @ W + b`` with ``W: [d_in, d_out]``, so each normalized matrix is a transpose
(docs/math.md A4):
``c_attn.weight[:, 0:d]ᵀ`` = W_Q, ``[:, d:2d]ᵀ`` = W_K, ``[:, 2d:3d]ᵀ`` = W_V, ``c_proj.weightᵀ`` = W_O.
"""

from __future__ import annotations

from typing import Any

import torch

from attnsens.models.adapter import ModelSpec
from attnsens.models.hf import HFAdapter, HFModule, HookPoint, activation_of, copied, split_bias, split_heads
from attnsens.weights import AttentionWeights, LayerWeights, MLPWeights, NormWeights


class GPT2Adapter(HFAdapter):
    family = "gpt2"

    @classmethod
    def spec_of(cls, config: Any) -> ModelSpec:
        return ModelSpec(
            n_layer=config.n_layer,
            n_head=config.n_head,
            n_kv_head=config.n_head,
            d_model=config.n_embd,
            d_head=config.n_embd // config.n_head,
            max_positions=config.n_positions,
            vocab_size=config.vocab_size,
            placement="pre",
            norm="layernorm",
            causal=True,
        )

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.base.h)

    def attention_modules(self) -> list[torch.nn.Module]:
        return [block.attn for block in self.base.h]

    def hook_points(self, layer: int) -> list[HookPoint]:
        block = self.base.h[layer]
        return [
            (block, "input", "block_input"),
            (block.ln_1, "output", "attention_input"),
            (block.ln_2, "output", "mlp_input"),
        ]

    def output_modules(self, layer: int) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
        block = self.base.h[layer]
        return block.attn, block.mlp, block

    def read_layers(self) -> list[LayerWeights]:
        return [self._layer(i, block) for i, block in enumerate(self.base.h)]

    def _layer(self, index: int, block: HFModule) -> LayerWeights:
        n_head, d = self.spec.n_head, self.spec.d_model
        w_qkv = block.attn.c_attn.weight.detach().T  # [3d, d]
        b_qkv = block.attn.c_attn.bias.detach()
        w_q, w_k, w_v = (split_heads(w_qkv[i * d : (i + 1) * d], n_head) for i in range(3))
        b_q, b_k, b_v = (split_bias(b_qkv[i * d : (i + 1) * d], n_head) for i in range(3))
        attention = AttentionWeights(
            w_q=w_q.clone(),
            w_k=w_k.clone(),
            w_v=w_v.clone(),
            w_o=block.attn.c_proj.weight.detach().T.clone(),
            b_q=b_q.clone(),
            b_k=b_k.clone(),
            b_v=b_v.clone(),
            b_o=block.attn.c_proj.bias.detach().clone(),
            tau=1.0 / block.attn.scaling,
            causal=True,
        )
        mlp = MLPWeights(
            kind="mlp",
            activation=activation_of(self.base.config.activation_function),
            w_in=block.mlp.c_fc.weight.detach().T.clone(),
            b_in=block.mlp.c_fc.bias.detach().clone(),
            w_out=block.mlp.c_proj.weight.detach().T.clone(),
            b_out=block.mlp.c_proj.bias.detach().clone(),
        )
        return LayerWeights(
            index=index,
            placement="pre",
            attention=attention,
            mlp=mlp,
            attn_norm=layer_norm(block.ln_1),
            mlp_norm=layer_norm(block.ln_2),
        )


def layer_norm(module: HFModule) -> NormWeights:
    """NormWeights of a ``torch.nn.LayerNorm`` (bias may be absent) or of a LayerNorm module that keeps its ε as
    ``variance_epsilon`` (Cohere)."""
    bias = getattr(module, "bias", None)
    eps = getattr(module, "eps", None)
    return NormWeights(
        kind="layernorm",
        gamma=module.weight.detach().clone(),
        beta=copied(bias),
        eps=float(module.variance_epsilon if eps is None else eps),
    )
