"""Models: adapters from model objects to normalized weights, layer inputs and streamed attention rows.

    import attnsens.models as M
    model = M.load("smollm2")                  # or "minilm", a transformers model, a path, attnsens' GPT
    model.layers[0].attention.w_q.shape        # [head, d_head, d_model]
    M.check_weights_fidelity(model)            # the gate: raises WeightsFidelityError unless they reproduce it
    for chunk in model.stream_attention(model.encode("To be, or not to be")):
        chunk.probs                            # [batch, head, query, key] float32

Importing this package loads torch only; transformers is imported when a model is loaded.
"""

from __future__ import annotations

from attnsens.models.adapter import AttentionChunk, LayerInputs, ModelAdapter, ModelSpec
from attnsens.models.fidelity import FieldFidelity, check_weights_fidelity, weights_fidelity
from attnsens.models.loading import ALIASES, FAMILIES, load, register_alias, supported_families
from attnsens.weights import (
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
    "FieldFidelity",
    "LayerInputs",
    "LayerWeights",
    "MLPWeights",
    "ModelAdapter",
    "ModelSpec",
    "NormWeights",
    "RotaryConfig",
    "check_weights_fidelity",
    "load",
    "register_alias",
    "supported_families",
    "weights_fidelity",
]
