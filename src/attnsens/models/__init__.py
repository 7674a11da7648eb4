"""Models: adapters from model objects to normalized weights, layer inputs and streamed attention rows.

    import attnsens as A
    model = A.models.load("smollm2")           # or "minilm", a transformers model, a path, attnsens' GPT
    model.layers[0].attention.w_q.shape        # [head, d_head, d_model]
    for chunk in model.stream_attention(model.encode("To be, or not to be")):
        chunk.probs                            # [batch, head, query, key] float32

Importing this package loads torch only; transformers is imported when a model is loaded.
"""

from __future__ import annotations

from attnsens.models.adapter import AttentionChunk, LayerInputs, ModelAdapter, ModelSpec
from attnsens.models.loading import ALIASES, FAMILIES, load, register_alias, supported_families
from attnsens.models.weights import (
    AttentionWeights,
    LayerWeights,
    MLPWeights,
    NormWeights,
    RotaryConfig,
)

__all__ = [
    "ALIASES",
    "FAMILIES",
    "AttentionChunk",
    "AttentionWeights",
    "LayerInputs",
    "LayerWeights",
    "MLPWeights",
    "ModelAdapter",
    "ModelSpec",
    "NormWeights",
    "RotaryConfig",
    "load",
    "register_alias",
    "supported_families",
]
