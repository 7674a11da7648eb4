"""BLOOM: the layout table's adapter (``layouts.LAYOUTS["bloom"]``) with a tap of its own for the audit.

BLOOM's attention computes its scores itself, ``alibi.baddbmm(q, kᵀ, beta, alpha=1/√d_head)`` plus the additive
causal/padding mask, and never calls transformers' attention-function interface. While a tap is active, a
pre-hook on every attention module recomputes exactly those scores from the inputs the module receives (the
normalized hidden states, the ALiBi tensor and the mask) and reports them as ``AttentionCall.scores``; the rows
are their softmax, as in the model (which also takes it in float32). The bounds read the same ALiBi as slopes
m_h·(j − i) (``AttentionWeights.alibi_slopes``), which give the same rows by softmax's shift invariance.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from attnsens.models.adapter import QueryKeyCallback
from attnsens.models.attention import AttentionCall
from attnsens.models.hf_tap import input_taps
from attnsens.models.layouts import LayoutAdapter


class BloomAdapter(LayoutAdapter):
    """BLOOM (``model_type`` "bloom"): the layout adapter, audited through its own score computation."""

    def query_key_tap(self, on_query_key: QueryKeyCallback) -> contextlib.AbstractContextManager[None]:
        return input_taps(self.attention_modules(), lambda layer, module: _scores_reporter(layer, module, on_query_key))


def _scores_reporter(layer: int, module: torch.nn.Module, on_query_key: QueryKeyCallback) -> Any:
    def hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        alibi, mask = kwargs["alibi"], kwargs.get("attention_mask")
        scores = bloom_scores(module, hidden, alibi, mask)
        on_query_key(layer, scores, scores, AttentionCall(tau=1.0, scores=scores))

    return hook


def bloom_scores(module: Any, hidden: Tensor, alibi: Tensor, mask: Tensor | None) -> Tensor:
    """BloomAttention's scores [batch, head, n, n] on its input: ALiBi + q·kᵀ/√d_head (+ the additive mask)."""
    with torch.no_grad():
        batch, n, _ = hidden.shape
        fused = module.query_key_value(hidden).view(batch, n, module.num_heads, 3, module.head_dim)
        query = fused[..., 0, :].transpose(1, 2).reshape(batch * module.num_heads, n, module.head_dim)
        key = fused[..., 1, :].transpose(1, 2).reshape(batch * module.num_heads, n, module.head_dim)
        scores = alibi.baddbmm(
            batch1=query, batch2=key.transpose(-1, -2), beta=module.beta, alpha=module.inv_norm_factor
        )
        scores = scores.view(batch, module.num_heads, n, n)
        return scores if mask is None else scores + mask
