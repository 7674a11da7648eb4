"""Weight norms that enter the influence recursion: per head ‖G‖, ‖g‖, ‖V‖ and per block Λ_k, ‖f_k(0)‖.

One LN-free residual block (docs/math.md §10.4) maps the layer input y and the head outputs b_1…b_H to

    f(y, b) = z + W₂ act(W₁ z + c₁) + c₂,   z = y + Σ_h O_h b_h + c_O,

where O_h = W_O[:, h·d_head:(h+1)·d_head] is head h's block of the output projection. Two readings of the proof's
"value matrix V_{k,h} and Lipschitz f_k" are valid, and both are implemented:

* ``"ov"`` (default): V_h = O_h W_V^{(h)} (the OV circuit, d_model × d_model), b_h = Σ_r â_r V_h y_r, the value
  biases folded into c_O ← b_O + Σ_h O_h b_V^{(h)}. Then ‖z − z'‖ ≤ ‖y − y'‖ + Σ_h ‖b_h − b'_h‖, so
  Λ = 1 + ‖W₂‖ Lip(act) ‖W₁‖.
* ``"split"``: V_h = W_V^{(h)}, b_h = Σ_r â_r (V_h y_r + b_V^{(h)}), f as in docs/math.md §10.4. Then
  ‖z − z'‖ ≤ ‖y − y'‖ + Σ_h ‖O_h‖ ‖b_h − b'_h‖ ≤ max(1, max_h ‖O_h‖)(‖y − y'‖ + Σ_h ‖b_h − b'_h‖), so
  Λ = (1 + ‖W₂‖ Lip(act) ‖W₁‖) · max(1, max_h ‖O_h‖). docs/math.md §10.4 writes ‖W_O‖ for max_h ‖O_h‖; that is
  valid (a column block never has a larger spectral norm) but looser.

Since ‖O_h W_V‖ ≤ ‖O_h‖‖W_V‖ and every quantity of the recursion is increasing in ‖V‖ and Λ, ``"ov"`` is never
looser than ``"split"``.

Scores with biases: s_jr = (W_Q y_j + b_Q)·(W_K y_r + b_K)/τ = y_jᵀ G y_r + gᵀ y_r + (terms constant in r), with
G = W_Qᵀ W_K/τ and g = W_Kᵀ b_Q/τ. Softmax ignores terms constant along a row, so the key bias never matters and
the query bias enters through ‖g‖ (docs/math.md §10.3 step 2 with biases).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from attnsens._rounding import (
    add_up,
    div_up,
    mul_up,
    norm2_upper_bound,
    product_error_factor,
    product_spectral_norm_upper_bound,
    spectral_norm_upper_bound,
)
from attnsens.errors import ConfigError
from attnsens.geometry.blocks import ffn_lipschitz_upper_bound, mlp_enclosure
from attnsens.geometry.enclosures import Enclosure, residual_sum
from attnsens.weights import LayerWeights, MLPWeights, MoEWeights

HeadOutput = Literal["ov", "split"]


@dataclass(frozen=True, kw_only=True)
class HeadConstants:
    """One head: ‖G‖ (score matrix incl. 1/τ), ‖g‖ (query-bias score vector), ‖V‖ and the constant ‖b_V‖ part."""

    score_norm: float
    query_bias_score_norm: float
    value_norm: float
    value_offset_norm: float


@dataclass(frozen=True, kw_only=True)
class BlockConstants:
    """One block: Λ_k, ‖f_k(0)‖, whether attention is causal, and its heads."""

    index: int
    lipschitz: float
    f_zero_norm: float
    causal: bool
    heads: tuple[HeadConstants, ...]


def _f_zero_norm_upper_bound(c_o: Tensor, c_o_radius: Tensor, mlp: MLPWeights) -> float:
    """≥ ‖f_k(0)‖ = ‖c + φ(c)‖ for the real constant c within ``c_o_radius`` of the float ``c_o``: the MLP's and
    the sum's forward enclosures (``geometry.enclosures``, ``geometry.blocks.mlp_enclosure``)."""
    c = Enclosure(c_o[None, None], c_o_radius.reshape(1, 1))
    total = residual_sum(c, mlp_enclosure(c, mlp))
    return float(add_up(norm2_upper_bound(total.value[0, 0]), total.radius[0, 0]))


def block_constants(
    layer: LayerWeights, *, head_output: HeadOutput = "ov", norm_lipschitz: float = 1.0
) -> BlockConstants:
    """Λ_k, ‖f_k(0)‖ and per-head ‖G‖, ‖g‖, ‖V‖ of one LN-free block (module docstring; docs/math.md §10.4).

    Args:
        layer: normalized weights; norms, if any, are not applied (see ``norm_lipschitz``).
        head_output: ``"ov"`` or ``"split"`` reading of the value map.
        norm_lipschitz: factor multiplied into Λ_k, for the indicative (non-certified) constant of models whose
            blocks contain norms (docs/math.md §10.1: norms counted inside f_k with their Lipschitz constants).

    Returns:
        Upper bounds of every constant in real arithmetic: operator norms through ``attnsens._rounding`` (the
        rounding of the products W_Qᵀ W_K and W_O W_V included), ‖f_k(0)‖ from the forward enclosures of the
        constant c (``b_O`` plus the value biases' image), the MLP and their sum.
    """
    attn = layer.attention
    if isinstance(layer.mlp, MoEWeights):
        raise ConfigError(
            f"layer {layer.index}: a mixture of experts is not Lipschitz (its router's choice jumps); the "
            "inverse-length constants (docs/math.md §10.4) do not cover it"
        )
    if attn.q_norm is not None or attn.k_norm is not None or attn.softcap or attn.alibi_slopes is not None:
        raise ConfigError(
            f"layer {layer.index}: QK-norm, softcapped or ALiBi scores are not the bilinear form W_Qᵀ W_K alone; the "
            "inverse-length constants (docs/math.md §10.4) do not cover them"
        )
    attention = layer.attention.per_query_head()
    f64 = torch.float64
    w_q, w_k, w_v, w_o = (t.detach().to(f64) for t in (attention.w_q, attention.w_k, attention.w_v, attention.w_o))
    n_head, d_head, d_model = w_q.shape
    out_blocks = w_o.reshape(d_model, n_head, d_head).permute(1, 0, 2)  # [head, d_model, d_head]
    if attention.rotary is None:  # ‖G_h‖, G_h = W_Qᵀ W_K / τ: [d_model, d_model]
        score_norms = div_up(product_spectral_norm_upper_bound(w_q.transpose(-2, -1), w_k), attention.tau)
    else:
        # Rotary scores y_jᵀ W_Qᵀ R_{r−j} W_K y_r have no fixed G; R is orthogonal, so ‖W_Q‖‖W_K‖/τ bounds them.
        score_norms = div_up(mul_up(spectral_norm_upper_bound(w_q), spectral_norm_upper_bound(w_k)), attention.tau)
    if attention.b_q is None:
        bias_norms = torch.zeros(n_head, dtype=f64)
    else:  # ‖g_h‖ = ‖W_Kᵀ b_Q‖ / τ, the norm of a one-column product
        b_q = attention.b_q.detach().to(f64).unsqueeze(-1)  # [head, d_head, 1]
        bias_norms = div_up(product_spectral_norm_upper_bound(w_k.transpose(-2, -1), b_q), attention.tau)
    b_v = torch.zeros(n_head, d_head, dtype=f64) if attention.b_v is None else attention.b_v.detach().to(f64)
    c_o = torch.zeros(d_model, dtype=f64) if attention.b_o is None else attention.b_o.detach().to(f64)
    mlp_lipschitz = float(ffn_lipschitz_upper_bound(layer.mlp))  # ‖W₂‖ Lip(act) ‖W₁‖, docs/math.md §2.7
    one = torch.ones((), dtype=f64)
    c_o_radius = torch.zeros((), dtype=f64)
    if head_output == "ov":
        value_norms = product_spectral_norm_upper_bound(out_blocks, w_v)
        offsets = torch.zeros(n_head, dtype=f64)
        # c = b_O + Σ_h W_O^(h) b_V^(h): one float product and sum, within γ_{H·d_head+1}(|W_O||b_V| + |b_O|)
        magnitude = torch.einsum("hdk,hk->d", out_blocks.abs(), b_v.abs()) + c_o.abs()
        c_o_radius = mul_up(norm2_upper_bound(magnitude), product_error_factor(n_head * d_head + 1))
        c_o = c_o + torch.einsum("hdk,hk->d", out_blocks, b_v)
        lipschitz = float(add_up(one, mlp_lipschitz))
    else:
        value_norms = spectral_norm_upper_bound(w_v)
        offsets = norm2_upper_bound(b_v)
        out_norm = max(1.0, float(spectral_norm_upper_bound(out_blocks).max()))
        lipschitz = float(mul_up(add_up(one, mlp_lipschitz), out_norm))
    heads = tuple(
        HeadConstants(
            score_norm=float(score_norms[h]),
            query_bias_score_norm=float(bias_norms[h]),
            value_norm=float(value_norms[h]),
            value_offset_norm=float(offsets[h]),
        )
        for h in range(n_head)
    )
    return BlockConstants(
        index=layer.index,
        lipschitz=float(mul_up(torch.tensor(lipschitz, dtype=f64), norm_lipschitz)),
        f_zero_norm=_f_zero_norm_upper_bound(c_o, c_o_radius, layer.mlp),
        causal=attention.causal,
        heads=heads,
    )
