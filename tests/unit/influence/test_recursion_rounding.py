"""The influence certificate is an upper bound in real arithmetic: the recursion's every step is rounded up (against
a 200-bit mpmath recursion on the same constants), and so are ‖f_k(0)‖, H_n and the embedding diameter, also where
float64 cancels (docs/math.md §10.3)."""

from __future__ import annotations

import math
import random

import mpmath
import pytest
import torch

from attnsens.influence import recursion
from attnsens.influence.certificate import _harmonic, _max_distance_upper_bound
from attnsens.influence.constants import BlockConstants, HeadConstants, block_constants
from attnsens.weights import AttentionWeights, LayerWeights, MLPWeights

F64 = torch.float64


def _random_blocks(rng: random.Random, n_blocks: int, causal: bool) -> list[BlockConstants]:
    def value() -> float:
        return rng.uniform(0.05, 1.5)

    def head() -> HeadConstants:
        return HeadConstants(
            score_norm=value() / 4, query_bias_score_norm=value() / 8, value_norm=value(), value_offset_norm=value() / 3
        )

    return [
        BlockConstants(index=k, lipschitz=1 + value(), f_zero_norm=value(), causal=causal, heads=(head(), head()))
        for k in range(n_blocks)
    ]


def _mp_recursion(blocks: list[BlockConstants], embedding_norm: float, embedding_diameter: float, length: int | None):
    """The recursion of ``influence/recursion.py`` in the value domain at 200 bits: [(B, D, E coefficients)]."""
    mpf = mpmath.mpf
    out = []
    with mpmath.workprec(200):
        hidden, changed, other = mpf(embedding_norm), mpf(embedding_diameter), [mpf(0)]

        def add(*polys):
            degree = max(len(p) for p in polys)
            return [mpmath.fsum(p[m] if m < len(p) else 0 for p in polys) for m in range(degree)]

        for block in blocks:
            head_sum = [mpf(0)]
            for head in block.heads:
                score = mpf(head.score_norm) * hidden**2 + mpf(head.query_bias_score_norm) * hidden
                rho = mpmath.exp(2 * score)
                query_change = other
                if length is not None and not block.causal:
                    rho = length * mpmath.exp(2 * score) / (mpmath.exp(2 * score) + length - 1)
                    query_change = [c / length for c in other]
                kappa, bias = mpf(head.score_norm) * hidden, mpf(head.query_bias_score_norm)
                k_in = add([c * kappa for c in query_change], [(kappa + bias) * changed])
                mixed = [0] + [c * mpmath.exp(2 * score) for c in other] if block.causal else other
                k_out = add([c * kappa for c in other], [c * (kappa + bias) for c in mixed])
                omega = [2 * c for c in add([c * rho for c in k_in], k_out)]
                change = add([rho * changed], mixed, [c * hidden for c in omega])
                head_sum = add(head_sum, [c * mpf(head.value_norm) for c in change])
            value_sum = mpmath.fsum(mpf(h.value_norm) for h in block.heads)
            parts = mpmath.fsum(mpf(h.value_norm) * hidden + mpf(h.value_offset_norm) for h in block.heads)
            new_hidden = mpf(block.f_zero_norm) + mpf(block.lipschitz) * (hidden + parts)
            changed = min(2 * new_hidden, mpf(block.lipschitz) * (changed + 2 * value_sum * hidden))
            other = [mpf(block.lipschitz) * c for c in add(other, head_sum)]
            hidden = new_hidden
            out.append((hidden, changed, other))
    return out


def _violations(rows, exact) -> int:
    count = 0
    for row, (hidden, changed, other) in zip(rows, exact, strict=True):
        count += mpmath.mpf(row.hidden_norm_upper_bound) < hidden
        count += mpmath.mpf(row.log_changed_position) < mpmath.log(changed)
        count += sum(
            mpmath.mpf(c) < mpmath.log(e) for c, e in zip(row.log_other_positions, other, strict=False) if e > 0
        )
    return count


CASES = [(seed, causal, length) for seed in range(40) for causal, length in ((False, None), (True, None), (False, 37))]


def test_recursion_is_never_below_the_200_bit_recursion_and_round_to_nearest_is() -> None:
    """120 random three-block constant sets (unmasked, causal, finite n): every B_k, log D_k and coefficient of
    log E_k is at or above the exact recursion's. With the directed steps replaced by round-to-nearest (the
    previous code) some land below it."""
    below_with_nearest = 0
    for seed, causal, length in CASES:
        rng = random.Random(seed)
        blocks = _random_blocks(rng, 3, causal)
        B0, D0 = rng.uniform(0.5, 2.0), rng.uniform(0.5, 2.0)
        exact = _mp_recursion(blocks, B0, D0, length)
        rows = recursion.run_recursion(blocks, embedding_norm=B0, embedding_diameter=D0, length=length)
        assert _violations(rows, exact) == 0, (seed, causal, length)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(recursion, "_up", lambda x: x)
            patch.setattr(recursion, "_down", lambda x: x)
            nearest = recursion.run_recursion(blocks, embedding_norm=B0, embedding_diameter=D0, length=length)
        below_with_nearest += _violations(nearest, exact)
    assert below_with_nearest > 0  # mutation: round-to-nearest is not an upper bound


def test_harmonic_number_is_an_upper_bound() -> None:
    for n in (1, 2, 7, 1000, 123_457):
        with mpmath.workprec(200):
            exact = mpmath.harmonic(n)
        assert mpmath.mpf(_harmonic(n)) >= exact, n


def test_max_distance_covers_rows_whose_gram_form_cancels() -> None:
    """25 copies of a row at 10^8 and one other row 80 away: torch.cdist's Gram form (used above 25 rows) returns
    79.40 for the real 79.56 on one processor and 79.80 on another. The certified bound is from the same Gram matrix
    with its error term and covers it."""
    g = torch.Generator().manual_seed(5)
    a = 1e8 + torch.randn(16, generator=g, dtype=F64)
    b = a + 25 * torch.randn(16, generator=g, dtype=F64)
    rows = torch.cat([a.expand(25, 16), b[None]])
    with mpmath.workprec(200):
        squares = ((mpmath.mpf(float(x)) - mpmath.mpf(float(y))) ** 2 for x, y in zip(a, b, strict=True))
        exact = mpmath.sqrt(mpmath.fsum(squares))
    bound = _max_distance_upper_bound(rows)
    assert mpmath.mpf(bound) >= exact
    assert bound <= 1.2 * float(exact)  # the error term, 2γ_16 ‖r‖² ≈ 2300 against the square's 6330
    # Mutation, the previous bound: torch.cdist's value is off by far more than a float64 rounding of the distance
    # (0.16 below it on one processor, 0.24 above on another), so it is no bound wherever it lands below.
    assert abs(float(torch.cdist(rows, rows).max()) - float(exact)) > 1e-3 * float(exact)


def test_f_zero_norm_covers_a_cancelling_constant() -> None:
    """d_model = 1, b_O = 2^40, W_in = 0.1, W_out = −10: f(0) = c + W_out relu(W_in c) is −5.55·10^-17 c ≈ −6·10^-5
    in reals, while float64 rounds c − 10·fl(0.1 c) at ulp(2^40) = 2.4·10^-4."""
    c = 2.0**40
    attention = AttentionWeights(
        w_q=torch.zeros(1, 1, 1, dtype=F64), w_k=torch.zeros(1, 1, 1, dtype=F64), w_v=torch.ones(1, 1, 1, dtype=F64),
        w_o=torch.ones(1, 1, dtype=F64), b_o=torch.tensor([c], dtype=F64), tau=1.0, causal=False,
    )  # fmt: skip
    mlp = MLPWeights(
        kind="mlp", activation="relu", w_in=torch.tensor([[0.1]], dtype=F64), w_out=torch.tensor([[-10.0]], dtype=F64)
    )
    layer = LayerWeights(index=0, placement="none", attention=attention, mlp=mlp, attn_norm=None, mlp_norm=None)
    with mpmath.workprec(200):
        exact = abs(mpmath.mpf(c) + mpmath.mpf(-10.0) * max(mpmath.mpf(0.1) * mpmath.mpf(c), 0))
    bound = block_constants(layer).f_zero_norm
    assert mpmath.mpf(bound) >= exact, (bound, float(exact))
    float_value = abs(c + -10.0 * max(0.1 * c, 0.0))
    assert math.isfinite(bound) and mpmath.mpf(float_value * (1 + 1e-10)) < exact  # mutation: the old inflation
