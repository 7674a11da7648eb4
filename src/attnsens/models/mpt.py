"""MPT: the layout table's adapter (``layouts.LAYOUTS["mpt"]``) with a tap of its own for the audit.

MPT's attention computes its scores itself: (q·kᵀ)·softmax_scale plus its ALiBi ``position_bias`` (MPT's slopes
times the key offsets, a row shift of m_h·(j − i)), then the boolean mask as the float minimum. It never calls the
attention interface. While a tap is active, a pre-hook on every attention module recomputes those scores from the
module's inputs and reports them as ``AttentionCall.scores``. ``clip_qkv`` (clamping the fused projection) is not
a linear map: such models are audited but their bounds are refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from attnsens.errors import UnsupportedModelError
from attnsens.models.adapter import QueryKeyCallback
from attnsens.models.attention import AttentionCall
from attnsens.models.hf_tap import input_taps
from attnsens.models.layouts import LayoutAdapter
from attnsens.weights import LayerWeights


class MptAdapter(LayoutAdapter):
    """MPT (``model_type`` "mpt"): the layout adapter, audited through its own score computation."""

    def read_layers(self) -> Sequence[LayerWeights]:
        clip = self.base.config.attn_config.clip_qkv
        if clip:
            raise UnsupportedModelError(
                f"mpt clamps its fused q, k, v projection to ±{clip} (attn_config.clip_qkv), which is not linear; "
                "attnsens audits its rows but refuses to bound it"
            )
        return super().read_layers()

    def query_key_tap(self, on_query_key: QueryKeyCallback) -> contextlib.AbstractContextManager[None]:
        return input_taps(self.attention_modules(), lambda layer, module: _scores_reporter(layer, module, on_query_key))


def _scores_reporter(layer: int, module: torch.nn.Module, on_query_key: QueryKeyCallback) -> Any:
    def hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        bias = args[1] if len(args) > 1 else kwargs.get("position_bias")
        scores = mpt_scores(module, hidden, bias, kwargs.get("attention_mask"))
        on_query_key(layer, scores, scores, AttentionCall(tau=1.0, scores=scores))

    return hook


def mpt_scores(module: Any, hidden: Tensor, position_bias: Tensor | None, mask: Tensor | None) -> Tensor:
    """MptAttention's scores [batch, head, n, n] on its input, as its forward computes them before the softmax."""
    with torch.no_grad():
        batch, n = hidden.shape[:2]
        mixed = module.Wqkv(hidden)
        if module.clip_qkv:
            mixed = mixed.clamp(min=-module.clip_qkv, max=module.clip_qkv)
        query, key, _ = mixed.chunk(3, dim=2)
        query = query.reshape(batch, n, module.n_heads, module.head_dim).transpose(1, 2)
        key = key.reshape(batch, n, module.n_heads, module.head_dim).transpose(1, 2)
        scores = torch.matmul(query, key.transpose(-1, -2)) * module.softmax_scale
        if position_bias is not None:
            scores = scores + position_bias[:, max(0, position_bias.size(1) - n) :, max(0, position_bias.size(2) - n) :]
        if mask is not None:
            scores = scores.masked_fill(mask, torch.finfo(query.dtype).min)
        return scores
