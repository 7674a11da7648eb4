"""The reference forward of a stack of normalized layers, keeping what the bounds evaluate at each block: its input,
the attention and MLP sublayer inputs and, for post-LN blocks, the residual sums the norms read
(the per-block maps are those of ``attnsens.geometry.layers``, norms after a sublayer's output included).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from attnsens.geometry.layers import (
    attention_branch,
    attention_input,
    attention_sublayer,
    block_forward,
    mlp_forward,
    norm_forward,
)
from attnsens.weights import LayerWeights


def layer_inputs_from_stream(layers: Sequence[LayerWeights], x: Tensor) -> list[dict[str, Tensor]]:
    """Block, attention and MLP inputs (and post-LN residual sums) from the reference forward."""
    found = []
    for layer in layers:
        entry = {"block_input": x}
        if layer.placement == "pre":
            entry["attention_input"] = attention_input(x, layer)
            mid = x if layer.parallel_residual else x + attention_branch(entry["attention_input"], layer)
            entry["mlp_input"] = norm_forward(mid, layer.mlp_pre_norm())
        else:
            entry["attention_input"] = x
            if layer.placement == "none":
                mid = layer.residual_scale * x + attention_branch(x, layer)
            else:
                mid = layer.residual_scale * x + attention_sublayer(x, layer.attention)
                entry["attention_residual_sum"] = mid
                mid = norm_forward(mid, layer.norms()[0])
            entry["mlp_input"] = mid
        found.append(entry)
        x = block_forward(x, layer)
    return found


def with_residual_sums(layer: LayerWeights, entry: dict[str, Tensor]) -> dict[str, Tensor]:
    """``entry`` with the post-LN MLP residual sum αY + F(Y) added when it is missing (other placements: as is)."""
    if layer.placement == "post" and entry.get("mlp_residual_sum") is None:
        y = entry["mlp_input"]
        entry = {**entry, "mlp_residual_sum": layer.residual_scale * y + mlp_forward(y, layer.mlp)}
    return entry
