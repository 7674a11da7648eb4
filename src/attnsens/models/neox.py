"""GPT-NeoX / Pythia (HF ``GPTNeoXModel``): pre-LayerNorm, partial rotary, fused per-head QKV, parallel residual.

``query_key_value`` outputs ``[head, (q k v), d_head]`` per token — the three projections interleave head by
head, unlike GPT-2's ``[(q k v), head, d_head]``. Rotary rotates the first ``rotary_pct · d_head`` dimensions
of every head with the rotate-half convention.
"""

from __future__ import annotations

from typing import Any

import torch
from einops import rearrange

from attnsens.models.adapter import ModelSpec
from attnsens.models.gpt2 import layer_norm
from attnsens.models.hf import (
    HFAdapter,
    HFModule,
    HookPoint,
    activation_of,
    copied,
    linear_mlp,
    rotary_of,
    rotary_temperature,
    spec_rotary,
)
from attnsens.weights import AttentionWeights, LayerWeights


class NeoXAdapter(HFAdapter):
    family = "gpt_neox"

    @classmethod
    def spec_of(cls, config: Any) -> ModelSpec:
        d_head = config.hidden_size // config.num_attention_heads
        return ModelSpec(
            n_layer=config.num_hidden_layers,
            n_head=config.num_attention_heads,
            n_kv_head=config.num_attention_heads,
            d_model=config.hidden_size,
            d_head=d_head,
            max_positions=config.max_position_embeddings,
            vocab_size=config.vocab_size,
            placement="pre",
            norm="layernorm",
            causal=True,
            rotary=spec_rotary(config, d_head),
        )

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.base.layers)

    def attention_modules(self) -> list[torch.nn.Module]:
        return [block.attention for block in self.base.layers]

    def hook_points(self, layer: int) -> list[HookPoint]:
        block = self.base.layers[layer]
        return [
            (block, "input", "block_input"),
            (block.input_layernorm, "output", "attention_input"),
            (block.post_attention_layernorm, "output", "mlp_input"),
        ]

    def output_modules(self, layer: int) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
        block = self.base.layers[layer]
        return block.attention, block.mlp, block

    def read_layers(self) -> list[LayerWeights]:
        return [self._layer(i, block) for i, block in enumerate(self.base.layers)]

    def _layer(self, index: int, block: HFModule) -> LayerWeights:
        n_head = self.spec.n_head
        qkv = block.attention.query_key_value
        w_q, w_k, w_v = rearrange(
            qkv.weight.detach(), "(head three d_head) d_model -> three head d_head d_model", head=n_head, three=3
        ).clone()
        biases = (None, None, None)
        if qkv.bias is not None:
            biases = rearrange(qkv.bias.detach(), "(head three d_head) -> three head d_head", head=n_head, three=3)
        dense = block.attention.dense
        rotary = rotary_of(self.base.config, self.spec.d_head)
        attention = AttentionWeights(
            w_q=w_q,
            w_k=w_k,
            w_v=w_v,
            w_o=dense.weight.detach().clone(),
            b_q=copied(biases[0]),
            b_k=copied(biases[1]),
            b_v=copied(biases[2]),
            b_o=copied(dense.bias),
            tau=rotary_temperature(block.attention.scaling, rotary, self.base.rotary_emb, self.spec.d_head),
            causal=True,
            rotary=rotary,
        )
        mlp = linear_mlp(block.mlp.dense_h_to_4h, block.mlp.dense_4h_to_h, activation_of(self.base.config.hidden_act))
        return LayerWeights(
            index=index,
            placement="pre",
            attention=attention,
            mlp=mlp,
            attn_norm=layer_norm(block.input_layernorm),
            mlp_norm=layer_norm(block.post_attention_layernorm),
            parallel_residual=bool(block.use_parallel_residual),
        )
