"""Llama family (HF ``LlamaModel``; SmolLM2): pre-RMSNorm, rotate-half RoPE (every
transformers RoPE type of ``RotaryConfig``), grouped-query attention, gated SiLU MLP (optional biases).

The normalized weights are read from the loaded HF module. A GGUF checkpoint stores q/k rows permuted for
llama.cpp's interleaved rotary; transformers undoes that permutation while loading, so the module's
``q_proj``/``k_proj`` are already in the rotate-half layout the forward pass (and RotaryConfig) uses.
"""

from __future__ import annotations

from typing import Any

import torch

from attnsens.models.adapter import ModelSpec
from attnsens.models.hf import (
    HFAdapter,
    HookPoint,
    activation_of,
    copied,
    rotary_of,
    rotary_temperature,
    spec_rotary,
    split_bias,
    split_heads,
)
from attnsens.models.weights import AttentionWeights, LayerWeights, MLPWeights, NormWeights


class LlamaAdapter(HFAdapter):
    family = "llama"

    @classmethod
    def spec_of(cls, config: Any) -> ModelSpec:
        d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return ModelSpec(
            n_layer=config.num_hidden_layers,
            n_head=config.num_attention_heads,
            n_kv_head=config.num_key_value_heads,
            d_model=config.hidden_size,
            d_head=d_head,
            max_positions=config.max_position_embeddings,
            vocab_size=config.vocab_size,
            placement="pre",
            norm="rmsnorm",
            causal=True,
            rotary=spec_rotary(config, d_head),
        )

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.base.layers)

    def attention_modules(self) -> list[torch.nn.Module]:
        return [block.self_attn for block in self.base.layers]

    def hook_points(self, layer: int) -> list[HookPoint]:
        block = self.base.layers[layer]
        return [
            (block, "input", "block_input"),
            (block.input_layernorm, "output", "attention_input"),
            (block.post_attention_layernorm, "output", "mlp_input"),
        ]

    def output_modules(self, layer: int) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
        block = self.base.layers[layer]
        return block.self_attn, block.mlp, block

    def read_layers(self) -> list[LayerWeights]:
        return [self._layer(i, block) for i, block in enumerate(self.base.layers)]

    def _layer(self, index: int, block: torch.nn.Module) -> LayerWeights:
        s, attn, mlp = self.spec, block.self_attn, block.mlp
        rotary = rotary_of(self.base.config, s.d_head)

        def bias(linear: torch.nn.Linear, n: int) -> torch.Tensor | None:
            return split_bias(copied(linear.bias), n)

        attention = AttentionWeights(
            w_q=split_heads(attn.q_proj.weight.detach(), s.n_head).clone(),
            w_k=split_heads(attn.k_proj.weight.detach(), s.n_kv_head).clone(),
            w_v=split_heads(attn.v_proj.weight.detach(), s.n_kv_head).clone(),
            w_o=attn.o_proj.weight.detach().clone(),
            b_q=bias(attn.q_proj, s.n_head),
            b_k=bias(attn.k_proj, s.n_kv_head),
            b_v=bias(attn.v_proj, s.n_kv_head),
            b_o=copied(attn.o_proj.bias),
            tau=rotary_temperature(attn.scaling, rotary, self.base.rotary_emb, s.d_head),
            causal=True,
            rotary=rotary,
        )
        gated = MLPWeights(
            kind="gated",
            activation=activation_of(self.base.config.hidden_act),
            w_in=mlp.up_proj.weight.detach().clone(),
            w_gate=mlp.gate_proj.weight.detach().clone(),
            w_out=mlp.down_proj.weight.detach().clone(),
            b_in=copied(mlp.up_proj.bias),
            b_out=copied(mlp.down_proj.bias),
            b_gate=copied(mlp.gate_proj.bias),
        )
        return LayerWeights(
            index=index,
            placement="pre",
            attention=attention,
            mlp=gated,
            attn_norm=rms_norm(block.input_layernorm),
            mlp_norm=rms_norm(block.post_attention_layernorm),
        )


def rms_norm(module: torch.nn.Module) -> NormWeights:
    """NormWeights of an HF RMSNorm (``weight``, ``variance_epsilon``)."""
    return NormWeights(
        kind="rmsnorm", gamma=module.weight.detach().clone(), beta=None, eps=float(module.variance_epsilon)
    )
