"""Columns whose float64 dot product cancels to 0 while the real one is 1, and the exact dot product."""

from __future__ import annotations

from fractions import Fraction

BIG = 1e8

SPACING = 16
"""The three non-zero terms sit 16 apart, so any blocked or strided float64 summation adds the 1 to a ±10^16 before
the two cancel (10^16 + 1 rounds to 10^16): the computed product is 0, the real one 1."""


def spaced(values: list[float]) -> list[float]:
    column = [0.0] * (2 * SPACING + 1)
    for i, v in enumerate(values):
        column[i * SPACING] = v
    return column


Q_COLUMN = spaced([BIG, 1.0, -BIG])

K_COLUMN = spaced([BIG, 1.0, BIG])


def exact_dot(a: list[float], b: list[float]) -> Fraction:
    return sum((Fraction(x) * Fraction(y) for x, y in zip(a, b, strict=True)), Fraction(0))
