"""BERT (HF ``BertModel``; all-MiniLM-L6-v2) and the encoders with its block layout (RoBERTa, XLM-RoBERTa,
CamemBERT, ELECTRA): post-LayerNorm, bidirectional, learned positions.

Block: A = LN1(X + Attn(X)), Y = LN2(A + MLP(A)). The sums entering the norms are read as the inputs of
``attention.output.LayerNorm`` and ``output.LayerNorm``. The embedding LayerNorm before layer 0 is not part
of any block.
"""

from __future__ import annotations

from typing import Any

import torch

from attnsens.models.adapter import ModelSpec
from attnsens.models.hf import (
    HFAdapter,
    HFModule,
    HookPoint,
    activation_of,
    copied,
    layer_norm,
    linear_mlp,
    split_bias,
    split_heads,
)
from attnsens.weights import AttentionWeights, LayerWeights


class BertAdapter(HFAdapter):
    family = "bert"

    @classmethod
    def spec_of(cls, config: Any) -> ModelSpec:
        return ModelSpec(
            n_layer=config.num_hidden_layers,
            n_head=config.num_attention_heads,
            n_kv_head=config.num_attention_heads,
            d_model=config.hidden_size,
            d_head=config.hidden_size // config.num_attention_heads,
            max_positions=config.max_position_embeddings,
            vocab_size=config.vocab_size,
            placement="post",
            norm="layernorm",
            causal=bool(config.is_decoder),
        )

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.base.encoder.layer)

    def attention_modules(self) -> list[torch.nn.Module]:
        return [block.attention.self for block in self.base.encoder.layer]

    def hook_points(self, layer: int) -> list[HookPoint]:
        block = self.base.encoder.layer[layer]
        return [
            (block, "input", "block_input"),
            (block.attention, "input", "attention_input"),
            (block.attention.output.LayerNorm, "input", "attention_residual_sum"),
            (block.intermediate, "input", "mlp_input"),
            (block.output.LayerNorm, "input", "mlp_residual_sum"),
        ]

    def output_modules(self, layer: int) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
        block = self.base.encoder.layer[layer]
        return block.attention.output.dense, block.output.dense, block

    def read_layers(self) -> list[LayerWeights]:
        return [self._layer(i, block) for i, block in enumerate(self.base.encoder.layer)]

    def _layer(self, index: int, block: HFModule) -> LayerWeights:
        n_head = self.spec.n_head
        attn = block.attention.self

        def weight(linear: torch.nn.Linear) -> torch.Tensor:
            return split_heads(linear.weight.detach(), n_head).clone()

        def bias(linear: torch.nn.Linear) -> torch.Tensor | None:
            return split_bias(copied(linear.bias), n_head)

        out = block.attention.output.dense
        attention = AttentionWeights(
            w_q=weight(attn.query),
            w_k=weight(attn.key),
            w_v=weight(attn.value),
            w_o=out.weight.detach().clone(),
            b_q=bias(attn.query),
            b_k=bias(attn.key),
            b_v=bias(attn.value),
            b_o=copied(out.bias),
            tau=1.0 / attn.scaling,
            causal=self.spec.causal,
        )
        mlp = linear_mlp(block.intermediate.dense, block.output.dense, activation_of(self.base.config.hidden_act))
        return LayerWeights(
            index=index,
            placement="post",
            attention=attention,
            mlp=mlp,
            attn_norm=layer_norm(block.attention.output.LayerNorm),
            mlp_norm=layer_norm(block.output.LayerNorm),
        )
