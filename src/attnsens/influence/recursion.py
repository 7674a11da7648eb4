"""The recursion of docs/math.md §10.3 in the log domain: B_k, A_{k,h}, κ, K^in, K^out, ω, F, D_k, E_k and C = E_L.

Every positive quantity that can overflow float64 (e^{2A}, D_k, E_k) is kept as a natural logarithm; sums use
log-sum-exp. E_k is a polynomial in H_n = Σ_{r≤n} 1/r with non-negative coefficients, stored as the list of
their logarithms: a constant for unmasked attention (the theorem's setting) and of degree k − 1 for causal attention.

Derivation for one block k and head h (query j ≠ i; δ_r := ‖y_r − y'_r‖ at layer k − 1; all norms ℓ2/spectral).
Unmasked attention with n keys, δ_i ≤ D, δ_r ≤ E/n for r ≠ i:

1. B_k = ‖f_k(0)‖ + Λ_k (B + Σ_h (‖V_h‖ B + ‖b_V^{(h)}‖)): f_k is Λ_k-Lipschitz and every head output is a convex
   combination of values of norm ≤ ‖V_h‖B + ‖b_V^{(h)}‖ (proof step 1).
2. A = ‖G‖B² + ‖g‖B bounds |s_jr| up to a row constant, so the row's oscillation is ≤ 2A and every weight is
   ≤ e^{2A}/(e^{2A} + n − 1) ≤ e^{2A}/n; this holds along the whole segment between the two score rows because the
   oscillation is a seminorm (proof step 2).
3. Δ_r = (y_j − y'_j)ᵀ G y_r + y'_jᵀ G (y_r − y'_r) + gᵀ(y_r − y'_r), so with κ = ‖G‖B:
   |Δ_i| ≤ K^in = κ(E + D) + ‖g‖D and |Δ_r| ≤ K^out/n, K^out = (2κ + ‖g‖)E (docs/math.md §10.3 with ‖g‖ = 0).
4. Σ_r |a_r'(t)| ≤ 2 Σ_r a_r |Δ_r| ≤ 2(e^{2A} K^in + K^out)/n =: ω/n.
5. b − b' = Σ_r â_r V(y_r − y'_r) + Σ_r (â_r − â'_r) V y'_r (value biases cancel in both sums because
   Σ_r â_r = Σ_r â'_r = 1), so n‖b − b'‖ ≤ F = ‖V‖(e^{2A} D + E + ω B).
6. E_k = Λ_k (E + Σ_h F_h); D_k = min(2 B_k, Λ_k (D + 2 Σ_h ‖V_h‖ B)).

Causal attention (docs/math.md §10.6, decision: derived and implemented). Row j has the j keys r ≤ j, so a weight is
≤ e^{2A}/j, positions r < i are unchanged (δ_r = 0) and position j > i satisfies, by induction, δ_j ≤ E(H_j)/j
with E a polynomial in H_j with non-negative coefficients (hence non-decreasing in j). Then for a query j > i

    S := j Σ_{r≤j, r≠i} â_r δ_r ≤ e^{2A} Σ_{i<r≤j} E(H_r)/r ≤ e^{2A} E(H_j) H_j,

which replaces the unmasked S ≤ E (there Σ â_r ≤ 1 and δ_r ≤ E/n uniformly). Steps 3–5 become
K^in = κ(E + D) + ‖g‖D, K^out = κE + (κ + ‖g‖) S, ω = 2(e^{2A} K^in + K^out), F = ‖V‖(e^{2A} D + S + ω B), all
"divided by j", and step 6 is unchanged. Each layer multiplies by at most one more H_j, so E_L has degree L − 1:
‖y_n^{(L)} − y'_n^{(L)}‖ ≤ E_L(H_n)/n ≤ E_L(1) H_n^{L−1}/n with H_n ≤ 1 + ln n — O((log n)^{L−1}/n). The same
substitution with S = E (unmasked) reproduces steps 3–5 exactly, so one code path serves both.

Finite-n tightening (unmasked only): at a given n the weight bound e^{2A}/(e^{2A} + n − 1) replaces e^{2A}/n and
δ_j ≤ E/n replaces δ_j ≤ E in K^in; the result bounds ‖Δy_n‖ at that n only.

Rounding. Every quantity is an upper bound of a nonnegative real number and every formula is increasing in its
inputs, so each operation is rounded up (``_up``, one step to the next float), except the one subtracted term of the
finite-n weight bound, which is rounded down. ``math.log`` and ``math.exp`` are within one ulp of the real value
(the C library's, as CPython calls it); two steps in the safe direction cover them. The result is an upper bound
in real arithmetic of the recursion at the given constants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from attnsens._rounding import float_down, float_up
from attnsens.influence.constants import BlockConstants

LogPolynomial = tuple[float, ...]  # log c_m of Σ_m c_m H^m, c_m ≥ 0 (−inf for c_m = 0)


@dataclass(frozen=True, kw_only=True)
class LayerBounds:
    """The recursion's values after block k (0-based ``layer``); log values are natural logarithms.

    ``log_other_positions`` is E_k as a polynomial in H_n (length 1 for unmasked attention).
    """

    layer: int
    lipschitz: float
    f_zero_norm: float
    hidden_norm_upper_bound: float  # B_k
    score_upper_bound: float  # A_k = max_h A_{k,h}
    log_weight_ratio: float  # 2 A_k = log e^{2A_k}
    log_changed_position: float  # log D_k
    log_other_positions: LogPolynomial  # log-coefficients of E_k
    log_omega: LogPolynomial  # max over heads of ω_{k,h}, coefficient-wise
    log_head_change: LogPolynomial  # Σ_h F_{k,h}


_up, _down = float_up, float_down  # module names, so a test can swap them for round-to-nearest


def _log(x: float) -> float:
    """≥ ln x (−∞ at 0): ``math.log`` is within one ulp, and two steps up cover it."""
    return _up(_up(math.log(x))) if x > 0 else -math.inf


def _log_down(x: float) -> float:
    """≤ ln x (−∞ at 0)."""
    return _down(_down(math.log(x))) if x > 0 else -math.inf


def _exp(x: float) -> float:
    """≥ e^x (0 exactly at −∞, a zero coefficient)."""
    if x == -math.inf:
        return 0.0
    return math.inf if x > 709.0 else _up(_up(math.exp(x)))


def _exp_down(x: float) -> float:
    """≤ e^x (≥ 0)."""
    return 0.0 if x < -745.0 else max(0.0, _down(_down(math.exp(x))))


def _logsumexp(*values: float, down: bool = False) -> float:
    """≥ log Σ e^v, every step rounded up (≤, every step rounded down, with ``down``)."""
    top = max(values)
    if math.isinf(top):
        return top
    step, exp, log = (_down, _exp_down, _log_down) if down else (_up, _exp, _log)
    total = 0.0
    for v in values:
        total = step(total + exp(step(v - top)))
    return step(top + log(total))


def _plus(*terms: float) -> float:
    """≥ the sum, each addition rounded up."""
    total = 0.0
    for term in terms:
        total = _up(total + term)
    return total


def _times(a: float, b: float) -> float:
    """≥ a·b for a, b ≥ 0."""
    return _up(a * b)


def _poly_add(*polys: LogPolynomial) -> LogPolynomial:
    degree = max(len(p) for p in polys)
    total = [_logsumexp(*(p[m] if m < len(p) else -math.inf for p in polys)) for m in range(degree)]
    while len(total) > 1 and total[-1] == -math.inf:
        total.pop()
    return tuple(total)


def _poly_scale(poly: LogPolynomial, log_factor: float) -> LogPolynomial:
    return tuple(_up(c + log_factor) for c in poly)


def _poly_times_h(poly: LogPolynomial) -> LogPolynomial:
    return (-math.inf, *poly)


def log_poly_max(*polys: LogPolynomial) -> LogPolynomial:
    """Coefficient-wise maximum (a polynomial that dominates each one for H ≥ 0)."""
    degree = max(len(p) for p in polys)
    return tuple(max(p[m] if m < len(p) else -math.inf for p in polys) for m in range(degree))


def log_poly_at(poly: LogPolynomial, harmonic: float) -> float:
    """≥ log Σ_m c_m H^m for H > 0 (rounded up)."""
    log_h = _log(harmonic)
    return _logsumexp(*(_up(c + _times(m, log_h)) if m else c for m, c in enumerate(poly)))


@dataclass(frozen=True, kw_only=True)
class ObservedLayer:
    """What a set of inputs reached at one block: the largest norm of its input rows (in place of B_{k−1}) and, per
    head, half the largest oscillation max_r s_jr − min_r s_jr of a score row (in place of A_{k,h})."""

    hidden_norm: float
    score_half_range: tuple[float, ...]


def run_recursion(
    blocks: Sequence[BlockConstants],
    *,
    embedding_norm: float,
    embedding_diameter: float,
    length: int | None = None,
    observed: Sequence[ObservedLayer] | None = None,
) -> tuple[LayerBounds, ...]:
    """B_k, A_k, D_k, E_k for every block (module docstring; docs/math.md §10.3 with biases and the causal variant).

    Args:
        blocks: per-block constants in order.
        embedding_norm: B_0 = sup ‖v_a + p_j‖.
        embedding_diameter: D_0 = max_{a,b} ‖v_a − v_b‖ (the two inputs share p_i).
        length: n for the finite-n tightening (unmasked blocks only), or None for the n-independent constants.
        observed: one ObservedLayer per block: the recursion then takes each block's input norm and score
            oscillation as measured on some inputs instead of their bounds over all inputs. The result is an
            *input-set* value: it speaks of inputs that stay within those measurements, and certifies nothing
            for other inputs (docs/math.md §10.6).

    Returns:
        One LayerBounds per block; the last one's E is C (unmasked) or the polynomial E_L(H_n) (causal).
    """
    if observed is not None and len(observed) != len(blocks):
        raise ValueError(f"observed has {len(observed)} layers for {len(blocks)} blocks")
    log_other: LogPolynomial = (-math.inf,)
    hidden, log_changed = embedding_norm, _log(embedding_diameter)
    log_two = _log(2.0)
    rows = []
    for index, block in enumerate(blocks):
        seen = None if observed is None else observed[index]
        if seen is not None:
            hidden = seen.hidden_norm
        log_hidden = _log(hidden)
        head_sum: LogPolynomial = (-math.inf,)
        omegas, scores = [], []
        for h, head in enumerate(block.heads):
            score = _plus(_times(head.score_norm, _times(hidden, hidden)), _times(head.query_bias_score_norm, hidden))
            if seen is not None:
                score = seen.score_half_range[h]
            scores.append(score)  # A_{k,h}
            log_rho = 2 * score
            log_query_change = log_other  # δ_j ≤ E (n ≥ 1)
            if length is not None and not block.causal:
                log_rho = _up(_up(_log(length) + 2 * score) - _logsumexp(2 * score, _log_down(length - 1), down=True))
                log_query_change = _poly_scale(log_other, -_log_down(length))
            log_kappa = _up(_log(head.score_norm) + log_hidden)
            log_bias = _log(head.query_bias_score_norm)
            k_in = _poly_add(
                _poly_scale(log_query_change, log_kappa),
                (_up(_logsumexp(log_kappa, log_bias) + log_changed),),
            )
            mixed = _poly_times_h(_poly_scale(log_other, 2 * score)) if block.causal else log_other  # S
            k_out = _poly_add(_poly_scale(log_other, log_kappa), _poly_scale(mixed, _logsumexp(log_kappa, log_bias)))
            omega = _poly_scale(_poly_add(_poly_scale(k_in, log_rho), k_out), log_two)
            omegas.append(omega)
            change = _poly_add((_up(log_rho + log_changed),), mixed, _poly_scale(omega, log_hidden))
            head_sum = _poly_add(head_sum, _poly_scale(change, _log(head.value_norm)))
        value_sum = _plus(*(h.value_norm for h in block.heads))
        value_parts = _plus(*(_plus(_times(h.value_norm, hidden), h.value_offset_norm) for h in block.heads))
        new_hidden = _plus(block.f_zero_norm, _times(block.lipschitz, _plus(hidden, value_parts)))
        log_changed = min(
            _log(2 * new_hidden),
            _up(_log(block.lipschitz) + _logsumexp(log_changed, _up(_log(2 * value_sum) + log_hidden))),
        )
        log_other = _poly_scale(_poly_add(log_other, head_sum), _log(block.lipschitz))
        hidden = new_hidden
        rows.append(
            LayerBounds(
                layer=block.index,
                lipschitz=block.lipschitz,
                f_zero_norm=block.f_zero_norm,
                hidden_norm_upper_bound=hidden,
                score_upper_bound=max(scores),
                log_weight_ratio=2 * max(scores),
                log_changed_position=log_changed,
                log_other_positions=log_other,
                log_omega=log_poly_max(*omegas),
                log_head_change=head_sum,
            )
        )
    return tuple(rows)
