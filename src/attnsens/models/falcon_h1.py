"""Falcon-H1: a Mamba-2 mixer beside the attention in every block, its attention and MLP bounded each on its own.

Each block computes X + m_out·Attn(m_in·N1(X)) + s_out·Mamba(N1(X)), then + MLP(N2(·)), with the μP multipliers of
its config: ``attention_in_multiplier`` m_in on the attention's input, ``key_multiplier`` on its keys (after the
key bias), ``attention_out_multiplier`` m_out on its output, and ``mlp_multipliers`` (g, d) on the MLP's gate
pre-activation and its output. attnsens folds them into the normalized weights: m_in into W_Q, W_K and W_V, the
key multiplier into W_K and b_K, m_out into W_O and b_O, g into W_gate and b_gate and d into W_out and b_out, so
that each sublayer's weights compute what it adds to the residual stream from the output of N1 or N2.

The Mamba-2 mixer is not modelled (``LayerWeights.beside_attention``): the gate compares the norms, the attention
and the MLP (``models/fidelity.py``), and bounds cover the attention sublayer and the MLP's Lipschitz constant, never
the block (``BlockLayout.beside_attention``; ``LayoutAdapter.not_bounded`` says so in one line).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

from torch import Tensor

from attnsens.models.hf import HFModule
from attnsens.models.layouts import LAYOUTS, BlockLayout, LayoutAdapter
from attnsens.weights import MLPWeights

LAYOUTS["falcon_h1"] = BlockLayout(
    mlp="feed_forward",
    up="feed_forward.up_proj",
    gate="feed_forward.gate_proj",
    down="feed_forward.down_proj",
    mlp_norm="pre_ff_layernorm",
    beside_attention="a Mamba-2 mixer",
)
"""Llama's attention and MLP under Falcon-H1's names; :class:`FalconH1Adapter` folds the multipliers in."""


class FalconH1Adapter(LayoutAdapter):
    """Falcon-H1 (``model_type`` "falcon_h1"): its attention and MLP, with the Mamba-2 mixer beside the attention
    named as not covered."""

    def _multiplier(self, name: str) -> float:
        return float(getattr(self.base.config, name))

    def _projections(self, attn: HFModule) -> tuple[Tensor, ...]:
        w_q, w_k, w_v, b_q, b_k, b_v = super()._projections(attn)
        scale, key = self._multiplier("attention_in_multiplier"), float(attn.key_multiplier)
        return w_q * scale, w_k * (scale * key), w_v * scale, b_q, None if b_k is None else b_k * key, b_v

    def _mlp(self, block: HFModule) -> MLPWeights:
        mlp = super()._mlp(block)
        gate = float(_feed_forward(block).gate_multiplier)
        assert mlp.w_gate is not None  # the layout's MLP is gated
        b_gate = None if mlp.b_gate is None else mlp.b_gate * gate
        return dataclasses.replace(mlp, w_gate=mlp.w_gate * gate, b_gate=b_gate)

    def output_scales(self, block: HFModule) -> tuple[float | Tensor, float | Tensor]:
        """m_out on the attention's output (applied by the block) and d on the MLP's (inside the MLP module)."""
        return self._multiplier("attention_out_multiplier"), float(_feed_forward(block).down_multiplier)

    def layer_output_taps(self, record: Callable[[int, str, Tensor], None]) -> contextlib.AbstractContextManager[None]:
        """The attention module's output times m_out, which the block applies outside it: what the attention adds
        to the stream, as its normalized weights compute (the MLP module applies its own d)."""
        scale = self._multiplier("attention_out_multiplier")

        def scaled(layer: int, field: str, tensor: Tensor) -> None:
            record(layer, field, tensor * scale if field == "attention_output" else tensor)

        return super().layer_output_taps(scaled)


def _feed_forward(block: HFModule) -> HFModule:
    return block.feed_forward
