"""Falcon: a layout chosen from the config, and a tap of its own for the audit.

Falcon's blocks come in three arrangements, read from its config: the first architecture with multi-query
attention and one LayerNorm shared by the parallel attention and MLP (Falcon-7B); the same with one key/value
head per query head, sequential or parallel; and the "new decoder architecture" (Falcon-40B/180B) with grouped
keys and values and one or two LayerNorms in parallel. The fused ``query_key_value`` rows are [q; k; v] blocks
under multi-query, [head, (q, k, v), d_head] without it and [kv_head, (q × group, k, v), d_head] in the new
architecture. Positions are RoPE or ALiBi. Falcon's ALiBi slopes are BLOOM's rounded to bfloat16; the model adds
them divided by √d_head through its mask, and its eager path adds them once more before the 1/√d_head scaling,
so up to transformers 5.24 the slopes attnsens bounds are m/√d_head under sdpa and 2m/√d_head under eager
attention (the gate checks both against the model).

Up to transformers 5.24 Falcon's attention computes its scores itself (or calls sdpa directly) and never calls
transformers' attention interface. There, while a tap is active, a pre-hook on every attention module recomputes
its queries and keys from the inputs it receives, exactly as its forward does (fused projection, head split, RoPE
from the position embeddings it is handed), and reports them with the mask it was given; under ALiBi it reports
the scores themselves. From 5.25 on Falcon calls the attention interface like the other families, with ALiBi
(divided by √d_head, once, under every implementation) folded into the mask it passes; the generic tap reads
that mask, and the slopes attnsens bounds are m/√d_head whatever the implementation. Which of the two a model
runs is read off its attention modules (:func:`calls_attention_interface`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from attnsens.models.adapter import QueryKeyCallback
from attnsens.models.attention import AttentionCall
from attnsens.models.hf_tap import input_taps
from attnsens.models.layouts import LAYOUTS, BlockLayout, LayoutAdapter, alibi_slopes
from attnsens.models.offload import LayerSequence
from attnsens.weights import LayerWeights

LAYOUTS["falcon"] = BlockLayout(
    blocks="h",
    attention="self_attention",
    qkv="query_key_value",
    o="dense",
    mlp="mlp",
    up="mlp.dense_h_to_4h",
    gate=None,
    down="mlp.dense_4h_to_h",
    norm="layernorm",
    activation="activation",
)
"""Falcon's names; :meth:`FalconAdapter.layout_for` fills in the arrangement of a given config."""


class FalconAdapter(LayoutAdapter):
    """Falcon (``model_type`` "falcon") in any of its three block arrangements, RoPE or ALiBi."""

    @classmethod
    def layout_for(cls, config: Any) -> BlockLayout:
        base = LAYOUTS["falcon"]
        rotary: Literal["rope_parameters", "none"] = "none" if config.alibi else "rope_parameters"
        if config.new_decoder_architecture:
            two = config.num_ln_in_parallel_attn == 2
            norms = ("ln_attn", "ln_mlp") if two else ("input_layernorm", "input_layernorm")
            return dataclasses.replace(
                base, qkv_order="groups", attn_norm=norms[0], mlp_norm=norms[1], parallel_residual=True, rotary=rotary
            )
        order: Literal["blocks", "heads"] = "blocks" if config.multi_query else "heads"
        if config.parallel_attn:
            return dataclasses.replace(
                base, qkv_order=order, attn_norm="input_layernorm", mlp_norm="input_layernorm",
                parallel_residual=True, rotary=rotary,
            )  # fmt: skip
        return dataclasses.replace(base, qkv_order=order, rotary=rotary)

    @classmethod
    def kv_heads_of(cls, config: Any) -> int:
        if config.new_decoder_architecture:
            return config.num_kv_heads
        return 1 if config.multi_query else config.num_attention_heads

    def read_layers(self) -> Sequence[LayerWeights]:
        layers = super().read_layers()
        if not self.base.config.alibi:
            return layers
        # Falcon rounds the slopes to bfloat16 and adds its ALiBi scaled by 1/√d_head through the mask; before
        # transformers 5.25 its eager path added the unscaled ALiBi to the scores before the scaling as well, so
        # there it counted twice.
        own_eager = not calls_attention_interface(self.attention_modules()) and (
            self.base.config._attn_implementation != "sdpa"
        )
        counted = 2.0 if own_eager else 1.0
        slopes = alibi_slopes(self.spec.n_head).bfloat16().float() * (counted / math.sqrt(self.spec.d_head))

        def with_slopes(layer: LayerWeights) -> LayerWeights:
            return dataclasses.replace(layer, attention=dataclasses.replace(layer.attention, alibi_slopes=slopes))

        if isinstance(layers, LayerSequence):  # an offloaded model's layers, read as they are asked for
            return layers.mapped(with_slopes)
        return [with_slopes(layer) for layer in layers]

    def query_key_tap(self, on_query_key: QueryKeyCallback) -> contextlib.AbstractContextManager[None]:
        modules = self.attention_modules()
        if calls_attention_interface(modules):
            return super().query_key_tap(_scores_under_head_masks(on_query_key))
        return input_taps(modules, lambda layer, module: _reporter(layer, module, on_query_key))


def calls_attention_interface(modules: Sequence[torch.nn.Module]) -> bool:
    """Whether these Falcon attention modules call transformers' attention interface (transformers ≥ 5.25) rather
    than computing their scores themselves: the older forward splits its fused projection with ``_split_heads``,
    which the newer one no longer has."""
    return not any(hasattr(module, "_split_heads") for module in modules)


def _scores_under_head_masks(on_query_key: QueryKeyCallback) -> QueryKeyCallback:
    """Under ALiBi, Falcon's attention interface gets a mask of one bias per head, [batch, head, query, key]; the
    rows are recomputed from its scores, q·kᵀ/τ + mask, as the interface's eager path forms them. Other calls pass
    through unchanged."""

    def report(layer: int, query: Tensor, key: Tensor, call: AttentionCall) -> Any:
        mask = call.mask
        if mask is None or mask.ndim != 4 or mask.shape[1] == 1:
            return on_query_key(layer, query, key, call)
        with torch.no_grad():
            keys = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
            scores = (query @ keys.transpose(-1, -2)) * (1.0 / call.tau) + mask
        return on_query_key(layer, scores, scores, AttentionCall(tau=1.0, scores=scores))

    return report


def _reporter(layer: int, module: Any, on_query_key: QueryKeyCallback) -> Any:
    def hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        alibi, mask = kwargs.get("alibi"), kwargs.get("attention_mask")
        query, key = falcon_queries_keys(module, hidden, kwargs.get("position_embeddings"), rotate=alibi is None)
        if alibi is None:
            call = AttentionCall(tau=math.sqrt(module.head_dim), mask=mask, causal=mask is None and query.shape[2] > 1)
            on_query_key(layer, query, key, call)
            return
        batch, n_head = query.shape[:2]
        with torch.no_grad():  # the model's two ALiBi branches: sdpa reads it from the mask alone
            scores = query @ key.transpose(-1, -2)
            if module.config._attn_implementation != "sdpa" or kwargs.get("output_attentions"):
                scores = scores + alibi.view(batch, n_head, 1, -1)
            scores = scores * module.inv_norm_factor
            scores = scores if mask is None else scores + mask
        on_query_key(layer, scores, scores, AttentionCall(tau=1.0, scores=scores))

    return hook


def falcon_queries_keys(
    module: Any, hidden: Tensor, position_embeddings: Any, *, rotate: bool
) -> tuple[Tensor, Tensor]:
    """FalconAttention's queries [batch, head, n, d_head] and keys [batch, kv_head, n, d_head] on its input."""
    from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb

    with torch.no_grad():
        query, key, _ = module._split_heads(module.query_key_value(hidden))
        batch, n = query.shape[0], query.shape[1]
        n_kv = module.num_heads if module.new_decoder_architecture else module.num_kv_heads
        query = query.transpose(1, 2).reshape(batch, module.num_heads, n, module.head_dim)
        key = key.transpose(1, 2).reshape(batch, n_kv, n, module.head_dim)
        if rotate:
            cos, sin = position_embeddings
            query, key = apply_rotary_pos_emb(query, key, cos, sin)
        return query, key
