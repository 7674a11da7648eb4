"""Reference oracles for θ(p) and ‖J_softmax‖_{∞→1}, written from the definitions (docs/math.md §2.2–2.3, T1).

Independent of ``attnsens.theta``: plain enumeration over subsets / sign vectors, exact rationals where the
answer must be checked without tolerance.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np


def theta_fraction(values: list[float] | np.ndarray) -> Fraction:
    """θ = s − 4·min_S (p(S) − s/2)² of the stored float values, exactly, by enumerating all 2^n subsets.

    Every float is a dyadic rational, so the row is scaled by a common power of two to integers and the
    2^n subset sums are Python integers (n ≤ ~20).
    """
    fractions = [Fraction(float(v)) for v in values if float(v) != 0.0]
    if not fractions:
        return Fraction(0)
    denominator = max(f.denominator for f in fractions)
    ints = [int(f * denominator) for f in fractions]
    total = sum(ints)
    sums = [0]
    for a in ints:
        sums = sums + [x + a for x in sums]
    best_twice_gap = min(abs(2 * x - total) for x in sums)
    # s − 4·(gap)² with gap = |2x − total| / (2·denominator)
    return Fraction(total, denominator) - Fraction(best_twice_gap * best_twice_gap, denominator * denominator)


def theta_float64(values: np.ndarray) -> float:
    """θ by enumeration in float64 (fast, rounding ~1e-16; for properties that hold with slack)."""
    p = np.asarray(values, dtype=np.float64)
    p = p[p != 0]
    s = p.sum()
    sums = np.zeros(1)
    for a in p:
        sums = np.concatenate([sums, sums + a])
    return float(s - 4.0 * np.min(np.abs(sums - 0.5 * s)) ** 2)


def softmax_jacobian(p: np.ndarray, tau: float) -> np.ndarray:
    """The explicit Jacobian (diag p − p pᵀ)/τ of softmax(u/τ) at p (docs/math.md §2.1)."""
    p = np.asarray(p, dtype=np.float64)
    return (np.diag(p) - np.outer(p, p)) / tau


def inf_to_one_norm_brute_force(matrix: np.ndarray) -> float:
    """‖A‖_{∞→1} = max over sign vectors x of ‖A x‖₁ (docs/math.md §2.2), all 2^L vertices of the cube."""
    n = matrix.shape[1]
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=n)))
    return float(np.abs(signs @ matrix.T).sum(axis=1).max())


def inf_to_one_norm_bilinear_brute_force(matrix: np.ndarray) -> float:
    """‖A‖_{∞→1} = max over sign vectors x, y of yᵀ A x: the literal 4^L definition (L ≤ 9)."""
    n = matrix.shape[0]
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=n)))
    return float((signs @ matrix @ signs.T).max())


def best_twice_gap_dyadic(ints: list[int]) -> int:
    """min_S |2·Σ_S − Σ| over the subsets of the non-negative integers ``ints`` (< 2^46/n) by integer
    meet-in-the-middle in numpy.

    All 2^(n/2) half sums are int64 and exact; for every sum b of the second half the closest partner in the
    sorted first half is found by binary search, so the optimum is exact (n ≤ ~40).
    """
    a_half, b_half = np.array(ints[: len(ints) // 2], np.int64), np.array(ints[len(ints) // 2 :], np.int64)

    def subset_sums(values: np.ndarray) -> np.ndarray:
        sums = np.zeros(1, np.int64)
        for v in values:
            sums = np.concatenate([sums, sums + v])
        return sums

    total = int(sum(ints))
    a = np.sort(subset_sums(a_half))
    b = subset_sums(b_half)
    # 2·(a + b) closest to total  ⇔  a closest to total/2 − b
    pos = np.searchsorted(a, (total - 2 * b) // 2)
    best = None
    for candidate in (pos - 1, pos, pos + 1):
        ok = (candidate >= 0) & (candidate < a.size)
        gap = np.abs(2 * (a[np.clip(candidate, 0, a.size - 1)] + b) - total)
        gap = np.where(ok, gap, np.iinfo(np.int64).max).min()
        best = int(gap) if best is None else min(best, int(gap))
    assert best is not None
    return best


def theta_dyadic_meet_in_the_middle(ints: list[int], exponent: int) -> Fraction:
    """Exact θ of the row p_i = ints[i]·2^-exponent (ints < 2^46/n): s − 4·d*² with 2·d* from
    ``best_twice_gap_dyadic`` (n ≤ ~40)."""
    best = best_twice_gap_dyadic(ints)
    scale = Fraction(1, 2**exponent)
    return int(sum(ints)) * scale - Fraction(best * best) * scale * scale
