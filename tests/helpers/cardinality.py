"""Integer rows and independent references for the θ relaxation and cardinality-bound tests."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np


def best_twice_gap(ints: list[int]) -> int:
    """min_S |2·Σ_S − Σ| by enumerating all subsets (n ≤ 16)."""
    total = sum(ints)
    return min(abs(2 * sum(c) - total) for k in range(len(ints) + 1) for c in itertools.combinations(ints, k))


def assert_bound_claims(stage, rows: list[list[int]]) -> None:
    """Every (d_lb, d_end) of ``stage`` on integer rows: d_lb ≤ d* ≤ d_end, and d_lb = d* whenever d_lb > 0."""
    for ints in rows:
        vals = np.sort(np.array(ints, dtype=np.float64))[::-1].copy()
        twice = best_twice_gap(ints)
        d_lb, d_end = stage(vals, 8, 0.5 * float(vals.sum()))
        assert 2 * Fraction(d_lb) <= twice <= 2 * Fraction(d_end), f"{ints}: 2d*={twice}, bound {d_lb}, {d_end}"
        if d_lb > 0:
            assert 2 * Fraction(d_lb) == twice, f"{ints}: claimed d*={d_lb}, true 2d*={twice}"


def integer_rows(seed: int) -> list[list[int]]:
    """Near-uniform, uniform-with-one-outlier and spread integer rows of 3–14 values, odd and even counts."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in range(3, 15):
        for spread in (0.0, 0.01, 0.05, 0.2):
            rows.append([int(v) for v in np.round(1000 * (1 + spread * rng.standard_normal(n))).clip(1)])
        rows.append([1000] * (n - 1) + [1000 + int(rng.integers(1, 900))])
        rows.append([int(v) for v in rng.integers(1, 1000, size=n)])
    return rows


def local_search_theta(values: list[float], rng: np.random.Generator, restarts: int = 3) -> Fraction:
    """An independent lower bound on θ: random splits improved by single moves and 1–1 exchanges.

    The float32 values are scaled by one power of two to Python integers, so every sum is exact; the best
    |2·p(S) − s| found gives θ ≥ s − (2·p(S) − s)².
    """
    fractions = [Fraction(v) for v in values if v != 0]
    denominator = max(f.denominator for f in fractions)
    ints = [int(f * denominator) for f in fractions]
    total = sum(ints)
    best = None
    for _ in range(restarts):
        inside = rng.random(len(ints)) < 0.5
        twice_gap = 2 * sum(v for v, a in zip(ints, inside, strict=True) if a) - total
        improved = True
        while improved:
            improved = False
            for i, v in enumerate(ints):
                delta = -2 * v if inside[i] else 2 * v
                if abs(twice_gap + delta) < abs(twice_gap):
                    inside[i] = not inside[i]
                    twice_gap += delta
                    improved = True
            outs = [j for j in range(len(ints)) if not inside[j]]
            for i in (i for i in range(len(ints)) if inside[i]):
                deltas = [2 * (ints[j] - ints[i]) for j in outs]
                k = min(range(len(outs)), key=lambda k: abs(twice_gap + deltas[k]), default=None)
                if k is not None and abs(twice_gap + deltas[k]) < abs(twice_gap):
                    inside[i], inside[outs[k]] = False, True
                    twice_gap += deltas[k]
                    improved = True
                    break
        best = abs(twice_gap) if best is None else min(best, abs(twice_gap))
    return Fraction(total, denominator) - Fraction(best * best, denominator * denominator)
