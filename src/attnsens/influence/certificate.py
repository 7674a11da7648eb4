"""Certified inverse-length influence: ‖y_n^{(L)} − y'_n^{(L)}‖₂ ≤ C/n for a change at a nonfinal position.

:func:`certified_constant` computes C = E_L by the recursion of docs/math.md §10.3 (see ``influence/recursion.py`` for
the derivation, the bias handling and the causal variant) from a model's weights, and reports why it does not
apply where the theorem's assumptions fail:

* LayerNorm / RMSNorm anywhere (docs/math.md §10.1, §10.6): a norm's Lipschitz constant is ‖γ‖∞/√ε (the Jacobian of
  x ↦ γ ⊙ (x − μ)/σ has norm ≤ ‖γ‖∞/σ ≤ ‖γ‖∞/√ε, sharp up to 1 − 1/d at constant x), which enters every Λ_k and makes C
  vacuous; the certificate says so (``applicable=False``) and reports, as ``log10_constant``, what the recursion
  gives with the norms counted inside f_k — an indicative size, not a certificate (for pre-LN, attention reads
  LN(y), which the theorem's bilinear form does not cover).
* gated MLPs (x ↦ W_out(act(W_gate x) ⊙ W_in x)) are not globally Lipschitz; rotary positions are covered by the
  indicative number only (‖W_Q‖‖W_K‖/τ replaces ‖G‖, the rotation being orthogonal).
* norms after the sublayers (``LayerWeights.attn_out_norm``, ``mlp_out_norm``: Gemma 2/3, OLMo 2): f_k is then
  y + N(·) and the recursion's ‖f_k(0)‖ and Λ_k do not describe it, so, as for gated MLPs, no number is computed
  and asking for the constant raises UnsupportedModelError naming the reason.
* causal attention is certified by the polylogarithmic variant E_L(H_n)/n (``masking="causal"``).
* learned absolute positions: certified only for n ≤ n_ctx (``max_length``); sinusoidal or no positions: all n.

Prediction probabilities (docs/math.md §10.3, θ sharpening): with logits z = U y + c, ‖p − p'‖₁ ≤
∫ ‖J(z_t)‖_{∞→1} dt · osc(Δz)/2 ≤ max_{v,w} ‖u_v − u_w‖ · ‖Δy_n‖ / 2 (‖J‖_{∞→1} = θ ≤ 1 by T1; J1 = 0 allows
the half-oscillation), so ‖p − p'‖₁ ≤ spread · C/(2n) and TV = ‖p − p'‖₁/2 ≤ spread · C/(4n).

Differences from the influence proof's own recursion (docs/math.md §11, item 4; each checked against the proof,
none makes the proof's C invalid):

* biases: the proof's bilinear scores have none. A query bias adds ‖g‖B to A and ‖g‖D, ‖g‖E terms to K^in, K^out
  (g = W_Kᵀb_Q/τ); key biases cancel in the softmax; value biases cancel in head-output differences and only
  enter B_k (``influence/constants.py``, ``influence/recursion.py``).
* Λ_k: the proof's (1 + ‖W₂‖Lip‖W₁‖)·max(1, ‖W_O‖) is valid; max_h ‖O_h‖ may replace ‖W_O‖, and reading V_{k,h} as
  the OV circuit O_h W_V removes the max(1, ·) factor altogether (the default, never looser).
* n*(η): the proof's C‖U‖/η is valid; the θ-sharpened spread·C/(2η) is smaller.
* causal attention (the proof leaves it open): derived and certified, E_L(H_n)/n with E_L of degree L − 1 in H_n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import Tensor

from attnsens._rounding import add_up, gamma, mul_up, norm2_upper_bound, round_up, sqrt_up, square_up, sum_upper_bound
from attnsens._rounding import float_down as _down
from attnsens._rounding import float_up as _up
from attnsens.errors import ConfigError, UnsupportedModelError
from attnsens.geometry.blocks import norm_lipschitz_upper_bound
from attnsens.influence.constants import BlockConstants, HeadOutput, block_constants
from attnsens.influence.inputs import certificate_inputs
from attnsens.influence.recursion import LayerBounds, LogPolynomial, log_poly_at, run_recursion
from attnsens.models.adapter import ModelAdapter
from attnsens.models.fidelity import check_weights_fidelity
from attnsens.models.loading import load
from attnsens.train.model import GPT
from attnsens.weights import LayerWeights, MLPWeights, MoEWeights, NormWeights

_LN10 = math.log(10.0)
_EXACT_DISTANCE_VOCAB = 8192  # above this many rows, max pairwise distance is bounded by 2·max norm


@dataclass(frozen=True, kw_only=True)
class InfluenceCertificate:
    """C with ‖y_n^{(L)} − y'_n^{(L)}‖₂ ≤ C/n, or why no meaningful C exists (docs/math.md §10).

    ``log10_constant`` is log10 C (C itself may overflow float64: read it as C = 10^x); for causal attention
    it is log10 E_L(1) and the bound at n is E_L(H_n)/n ≤ 10^x · H_n^{L−1}/n. When ``applicable`` is False,
    ``reasons`` says which assumption fails and ``log10_constant`` is the indicative value (or None).
    """

    applicable: bool
    reasons: tuple[str, ...]
    masking: Literal["unmasked", "causal"]
    head_output: HeadOutput
    log10_constant: float | None
    log_polynomial: LogPolynomial  # natural-log coefficients of E_L(H); length 1 when unmasked
    layers: tuple[LayerBounds, ...]
    blocks: tuple[BlockConstants, ...]
    embedding_norm: float  # B_0
    embedding_diameter: float  # D_0
    unembedding_spread: float | None  # max_{v,w} ‖u_v − u_w‖₂
    max_length: int | None
    norm_lipschitz: float | None  # max ‖γ‖∞/√ε over the model's norms (None when LN-free)

    def __repr__(self) -> str:
        """One line: whether it applies, log10 C, the masking and the layers (the fields stay readable by name)."""
        constant = "None" if self.log10_constant is None else f"10^{self.log10_constant:.4g}"
        summary = f"applicable={self.applicable}, C={constant}, masking={self.masking!r}, layers={len(self.layers)}"
        if self.reasons:
            summary += f", reasons={list(self.reasons)!r}"
        return f"InfluenceCertificate({summary})"

    @property
    def constant(self) -> float:
        """C as a float (inf when it overflows float64; use ``log10_constant``)."""
        return _pow10(self._require())

    def log10_influence_upper_bound(self, n: int, *, tightened: bool = False) -> float:
        """log10 of the certified bound on ‖Δy_n‖₂ at length n: C/n, E_L(H_n)/n (causal), or the finite-n bound.

        ``tightened=True`` reruns the recursion with the weight bound e^{2A}/(e^{2A} + n − 1) (unmasked only;
        valid at this n only, never larger than C/n).
        """
        self._require()
        self._check_length(n)
        if tightened and self.masking == "unmasked":
            rows = run_recursion(
                self.blocks, embedding_norm=self.embedding_norm, embedding_diameter=self.embedding_diameter, length=n
            )
            return _up(_log10_of_exp(rows[-1].log_other_positions[0]) - _log10_down(n))
        return _up(_log10_of_exp(log_poly_at(self.log_polynomial, _harmonic(n))) - _log10_down(n))

    def influence_upper_bound(self, n: int, *, tightened: bool = False) -> float:
        """The certified bound on ‖Δy_n‖₂ at length n as a float (inf on overflow)."""
        return _pow10(self.log10_influence_upper_bound(n, tightened=tightened))

    @property
    def log10_probability_constant(self) -> float:
        """log10 of spread·C/2, the constant of ‖p − p'‖₁ ≤ spread·C/(2n) (unmasked; module docstring)."""
        log10_constant = self._require()
        if self.unembedding_spread is None:
            raise ConfigError("no unembedding was given, so no probability bound; pass unembedding=[vocab, d_model]")
        return _up(_log10(self.unembedding_spread / 2) + log10_constant)

    def log10_probability_change_upper_bound(self, n: int) -> float:
        """log10 of the bound on ‖p − p'‖₁ at length n: spread · ‖Δy_n‖/2 (module docstring)."""
        if self.unembedding_spread is None:
            raise ConfigError("no unembedding was given, so no probability bound; pass unembedding=[vocab, d_model]")
        return _up(_log10(self.unembedding_spread / 2) + self.log10_influence_upper_bound(n))

    def log10_length_for_probability_change(self, eta: float) -> float:
        """log10 ``n*(η)``: for every n ≥ ``n*``, ‖p − p'‖₁ ≤ η; ``n* = spread · C/(2η)`` (unmasked attention).

        docs/math.md §10.4 states ``n* = C‖U‖/η``; spread/2 ≤ ‖U‖/√2, so this ``n*`` is smaller and equally valid.
        """
        log10_constant = self._require()
        if self.masking != "unmasked":
            raise ConfigError("n*(η) is given for unmasked attention; for causal use log10_influence_upper_bound(n)")
        if not eta > 0:
            raise ConfigError(f"eta must be > 0, got {eta}")
        if self.unembedding_spread is None:
            raise ConfigError("no unembedding was given, so no probability bound; pass unembedding=[vocab, d_model]")
        return _up(_log10(_up(self.unembedding_spread / (2 * eta))) + log10_constant)

    def table(self) -> list[dict[str, Any]]:
        """Per-layer rows: Λ_k, ‖f_k(0)‖, B_k, A_k, log10 e^{2A_k}, log10 D_k, log10 E_k(1), degree of E_k in H_n."""
        return [
            {
                "layer": row.layer,
                "lipschitz": row.lipschitz,
                "f_zero_norm": row.f_zero_norm,
                "hidden_norm_upper_bound": row.hidden_norm_upper_bound,
                "score_upper_bound": row.score_upper_bound,
                "log10_weight_ratio": row.log_weight_ratio / _LN10,
                "log10_changed_position_upper_bound": row.log_changed_position / _LN10,
                "log10_other_positions_upper_bound": _log10_of_exp(log_poly_at(row.log_other_positions, 1.0)),
                "harmonic_degree": len(row.log_other_positions) - 1,
            }
            for row in self.layers
        ]

    def _require(self) -> float:
        """log10 C of an applicable certificate (which always has one); UnsupportedModelError otherwise."""
        if not self.applicable or self.log10_constant is None:
            raise UnsupportedModelError("no influence certificate: " + "; ".join(self.reasons))
        return self.log10_constant

    def _check_length(self, n: int) -> None:
        if n < 2:
            raise ConfigError(f"length n must be >= 2 (the changed position i < n), got {n}")
        if self.max_length is not None and n > self.max_length:
            raise ConfigError(
                f"length {n} exceeds the {self.max_length} learned positions the certificate covers; "
                "use n <= max_length or sinusoidal positions"
            )


def _log10(x: float) -> float:
    """≥ log10 x (``math.log10`` is within one ulp; two steps up cover it)."""
    return _up(_up(math.log10(x))) if x > 0 else -math.inf


def _log10_down(x: float) -> float:
    """≤ log10 x."""
    return _down(_down(math.log10(x))) if x > 0 else -math.inf


_LN10_LOW, _LN10_HIGH = _down(_down(_LN10)), _up(_up(_LN10))


def _log10_of_exp(log_value: float) -> float:
    """≥ log_value / ln 10, the log10 of e^log_value."""
    return _up(log_value / (_LN10_LOW if log_value >= 0 else _LN10_HIGH))


def _pow10(log10_value: float | None) -> float:
    """≥ 10^x (``float.__pow__`` is within one ulp; two steps up), inf on overflow."""
    if log10_value is None:
        return math.nan
    return math.inf if log10_value > 308 else _up(_up(10.0**log10_value))


def _harmonic(n: int) -> float:
    """≥ H_n = Σ_{r≤n} 1/r: each reciprocal rounded up, the sum bounded with its γ_{n−1} radius."""
    reciprocals = round_up(torch.arange(1, n + 1, dtype=torch.float64).reciprocal())
    return float(sum_upper_bound(reciprocals))


def _max_distance_upper_bound(rows: Tensor, *, chunk: int = 1024) -> float:
    """≥ max_{a,b} ‖r_a − r_b‖₂ in real arithmetic.

    ‖r_a − r_b‖² = ‖r_a‖² + ‖r_b‖² − 2 r_a·r_b, and the float Gram entry is within γ_d ‖r_a‖‖r_b‖ of r_a·r_b
    (Cauchy–Schwarz on Higham's |fl(xᵀy) − xᵀy| ≤ γ_d |x|ᵀ|y|), so n_a² + n_b² − 2 fl(r_a·r_b) + 2γ_d n_a n_b with
    n ≥ ‖r‖, every step rounded up, bounds the squared distance whatever cancellation the Gram form suffers. Above
    ``_EXACT_DISTANCE_VOCAB`` rows it is 2 max_a ‖r_a‖.
    """
    rows = rows.detach().to(torch.float64)
    norms = norm2_upper_bound(rows)
    if rows.shape[0] > _EXACT_DISTANCE_VOCAB:
        return float(mul_up(norms.max(), 2.0))
    squares = square_up(norms)
    slack = 2 * gamma(rows.shape[-1]) * (1 + 2.0**-40)
    best = 0.0
    for start in range(0, rows.shape[0], chunk):
        gram = rows[start : start + chunk] @ rows.T
        cross = add_up(mul_up(gram, -2.0), mul_up(mul_up(norms[start : start + chunk, None], norms[None]), slack))
        squared = add_up(add_up(squares[start : start + chunk, None], squares[None]), cross)
        best = max(best, float(squared.max()))
    return float(sqrt_up(torch.tensor(max(best, 0.0), dtype=torch.float64)))


def _norm_reasons(
    layers: Sequence[LayerWeights], final_norm: NormWeights | None
) -> tuple[list[str], list[float], float, float]:
    """Reasons naming the norms, per-block products of their Lipschitz constants, the final norm's, the worst."""
    reasons, per_block = [], []
    worst = 0.0
    for layer in layers:
        norms = [n for n in _layer_norms(layer) if n is not None]
        factor = 1.0
        for norm in norms:
            factor = _up(factor * float(norm_lipschitz_upper_bound(norm)))
        per_block.append(factor)
        worst = max([worst, *(float(norm_lipschitz_upper_bound(n)) for n in norms)])
    normed = [layer for layer in layers if layer.placement != "none"]
    if normed:
        kinds = sorted({n.kind for layer in normed for n in _layer_norms(layer) if n is not None})
        reasons.append(
            f"{normed[0].placement}-{'/'.join(kinds)} in {len(normed)} layer(s): Lipschitz constant ‖γ‖∞/√ε up to "
            f"{worst:.4g} enters every Λ_k, so C is vacuous (the theorem assumes LN-free blocks, docs/math.md §10.1)"
        )
    final = 1.0
    if final_norm is not None:
        final = float(norm_lipschitz_upper_bound(final_norm))
        worst = max(worst, final)
        reasons.append(f"final {final_norm.kind} (Lipschitz ‖γ‖∞/√ε = {final:.4g}) before the unembedding")
    return reasons, per_block, final, worst


def _layer_norms(layer: LayerWeights) -> tuple[NormWeights | None, ...]:
    return (layer.attn_norm, layer.mlp_norm, layer.attn_out_norm, layer.mlp_out_norm)


def _out_norm_layers(layers: Sequence[LayerWeights]) -> list[int]:
    return [layer.index for layer in layers if layer.has_out_norms]


def _bidirectional_window_layers(layers: Sequence[LayerWeights]) -> list[int]:
    return [layer.index for layer in layers if not layer.attention.causal and layer.attention.sliding_window]


def _is_gated(layer: LayerWeights) -> bool:
    return isinstance(layer.mlp, MLPWeights) and layer.mlp.kind == "gated"


def _structure_reasons(layers: Sequence[LayerWeights]) -> list[str]:
    reasons = []
    experts = [layer.index for layer in layers if isinstance(layer.mlp, MoEWeights)]
    if experts:
        reasons.append(f"mixture of experts in layer(s) {experts}: its router's choice jumps, so it is not Lipschitz")
    gated = [layer.index for layer in layers if _is_gated(layer)]
    if gated:
        reasons.append(f"gated MLP in layer(s) {gated}: x ↦ W_out(act(W_gate x) ⊙ W_in x) is not globally Lipschitz")
    qk_normed = [layer.index for layer in layers if layer.attention.q_norm or layer.attention.k_norm]
    if qk_normed:
        reasons.append(
            f"QK-norm in layer(s) {qk_normed}: the scores N_q(W_Q y_j)·N_k(W_K y_r) are not the theorem's bilinear form"
        )
    biased = [layer.index for layer in layers if layer.attention.alibi_slopes is not None]
    if biased:
        reasons.append(f"ALiBi in layer(s) {biased}: position biases m_h(j − i) are outside the theorem's scores")
    capped = [layer.index for layer in layers if layer.attention.softcap is not None]
    if capped:
        reasons.append(f"softcapped scores in layer(s) {capped}: c·tanh(u/c) is not the theorem's bilinear form")
    windowed = _bidirectional_window_layers(layers)
    if windowed:
        reasons.append(
            f"bidirectional sliding windows in layer(s) {windowed}: rows see fewer than n keys, where the unmasked "
            "recursion (docs/math.md §10.3) averages over all n, so no constant is computed"
        )
    out_normed = _out_norm_layers(layers)
    if out_normed:
        reasons.append(
            f"norms after the sublayers (x + N(F(x))) in layer(s) {out_normed}: the recursion's f_k(0) and Λ_k "
            "(docs/math.md §10.4) do not model them, so no constant is computed"
        )
    if any(layer.attention.rotary is not None for layer in layers):
        reasons.append(
            "rotary positions: scores y_jᵀW_QᵀR_{r−j}W_K y_r are not the theorem's fixed bilinear form (RoPE is "
            "orthogonal, so it keeps queries and keys bounded; it is not what makes C vacuous)"
        )
    return reasons


def not_applicable(*reasons: str) -> InfluenceCertificate:
    """A certificate that only says why no C exists (no numbers)."""
    return InfluenceCertificate(
        applicable=False,
        reasons=tuple(reasons),
        masking="unmasked",
        head_output="ov",
        log10_constant=None,
        log_polynomial=(math.nan,),
        layers=(),
        blocks=(),
        embedding_norm=math.nan,
        embedding_diameter=math.nan,
        unembedding_spread=None,
        max_length=None,
        norm_lipschitz=None,
    )


def _adapter_certificate(adapter: Any) -> InfluenceCertificate:
    """Reasons for a model attnsens cannot read embeddings from (transformers adapters): no numbers."""
    layers = adapter.layers
    reasons, _, _, worst = _norm_reasons(layers, None)
    reasons += _structure_reasons(layers)
    causal = any(layer.attention.causal for layer in layers)
    if causal:
        reasons.append("causal mask: the theorem's proof is for unmasked rows (the causal variant adds (log n)^{L−1})")
    spec = adapter.spec
    if spec.rotary is None:
        reasons.append(f"learned absolute positions exist only for n ≤ {spec.max_positions}")
    reasons.append(f"{adapter.family} embeddings are not read by the certificate; it covers attnsens' own GPT")
    return replace(not_applicable(*reasons), masking="causal" if causal else "unmasked", norm_lipschitz=worst or None)


def certified_constant(
    model: Any,
    *,
    head_output: HeadOutput = "ov",
    token_embedding: Tensor | None = None,
    positions: Any = None,
    unembedding: Tensor | None = None,
) -> InfluenceCertificate:
    """C = E_L of docs/math.md §10.3 with ‖y_n^{(L)} − y'_n^{(L)}‖₂ ≤ C/n for every n, inputs x, x' differing at i < n.

    Args:
        model: attnsens' own GPT, an adapter wrapping one, a CertificateInputs, or a list of LayerWeights
            (then pass ``token_embedding`` [vocab, d_model] and optionally ``positions`` / ``unembedding``).
        head_output: ``"ov"`` (V = O_h W_V, tighter) or ``"split"`` (docs/math.md §10.4 form); both certified.

    Returns:
        An InfluenceCertificate; ``applicable`` is False (with ``reasons``) for models outside the theorem's
        assumptions, whose ``log10_constant`` is then indicative only (docs/math.md §10, §10.6).

    Raises:
        WeightsFidelityError: a model's normalized weights do not reproduce its blocks (models/fidelity.py).
    """
    if head_output not in ("ov", "split"):
        raise ConfigError(f"head_output must be 'ov' or 'split', got {head_output!r}")
    if isinstance(model, GPT):
        model = load(model)
    if isinstance(model, ModelAdapter):
        check_weights_fidelity(model)
        if not isinstance(model.module, GPT):
            return _adapter_certificate(model)
    inputs = certificate_inputs(model, token_embedding=token_embedding, positions=positions, unembedding=unembedding)
    reasons, norm_factors, final_norm_factor, worst_norm = _norm_reasons(inputs.layers, inputs.final_norm)
    reasons += _structure_reasons(inputs.layers)
    # No indicative number either where the recursion does not model the block (gated MLPs, norms after sublayers,
    # bidirectional windows).
    unmodelled = (
        any(_is_gated(layer) or isinstance(layer.mlp, MoEWeights) for layer in inputs.layers)
        or bool(_out_norm_layers(inputs.layers))
        or bool(_bidirectional_window_layers(inputs.layers))
    )
    causal = {layer.attention.causal for layer in inputs.layers}
    masking: Literal["unmasked", "causal"] = "causal" if True in causal else "unmasked"
    blocks = (
        ()
        if unmodelled
        else tuple(
            block_constants(layer, head_output=head_output, norm_lipschitz=factor)
            for layer, factor in zip(inputs.layers, norm_factors, strict=True)
        )
    )
    embedding_norm = float(inputs.positions.embedding_norm_upper_bound.max())
    embedding_diameter = _max_distance_upper_bound(inputs.token_embedding)
    log10_constant: float | None = None
    rows: tuple[LayerBounds, ...] = ()
    polynomial: LogPolynomial = (math.nan,)
    if not unmodelled:
        rows = run_recursion(blocks, embedding_norm=embedding_norm, embedding_diameter=embedding_diameter)
        polynomial = rows[-1].log_other_positions
        log10_constant = _up(_log10_of_exp(log_poly_at(polynomial, 1.0)) + _log10(final_norm_factor))
    spread = None if inputs.unembedding is None else _max_distance_upper_bound(inputs.unembedding)
    return InfluenceCertificate(
        applicable=not reasons,
        reasons=tuple(reasons),
        masking=masking,
        head_output=head_output,
        log10_constant=log10_constant,
        log_polynomial=polynomial,
        layers=rows,
        blocks=blocks,
        embedding_norm=embedding_norm,
        embedding_diameter=embedding_diameter,
        unembedding_spread=spread,
        max_length=inputs.positions.max_length,
        norm_lipschitz=worst_norm if worst_norm > 0 else None,
    )
