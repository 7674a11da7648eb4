"""Attention-row generators for the θ tests: softmax rows and the adversarial families of issue 2."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch

UNIT_ROUNDOFF = 2.0**-53


def softmax_rows(n_rows: int, length: int, sigma: float, *, seed: int, dtype=torch.float32) -> torch.Tensor:
    """[n_rows, length] rows softmax(σ·z), z ~ N(0, 1), computed in float64 and stored as ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n_rows, length, generator=gen, dtype=torch.float64)
    return torch.softmax(sigma * z, -1).to(dtype)


def coarse_grid_rows(n_rows: int, supports: tuple[int, int], sigma: float, *, seed: int) -> torch.Tensor:
    """[n_rows, supports[1]] float32 rows softmax(σ·z) of a random support in [supports[0], supports[1]] (zero
    tail) whose values are rounded down to multiples of twice the ulp of the smallest: every value, and every
    subset sum, then lies on a grid coarser than that ulp (as on real rows whose lone smallest values happen to
    have even mantissas)."""
    rng = np.random.default_rng(seed)
    low, high = supports
    out = torch.zeros(n_rows, high, dtype=torch.float32)
    for i in range(n_rows):
        n = int(rng.integers(low, high + 1))
        p = torch.softmax(sigma * torch.from_numpy(rng.standard_normal(n)), 0)
        two_ulps = 2.0 ** (math.frexp(float(p.float().min()))[1] - 23)
        out[i, :n] = (p - torch.remainder(p, two_ulps)).float()
    return out


def with_zeros(rows: torch.Tensor, fraction: float, *, seed: int) -> torch.Tensor:
    """Zero a random ``fraction`` of entries (masked keys anywhere), keeping ≥ 1 non-zero, and renormalise."""
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(rows.shape, generator=gen) >= fraction
    keep[torch.arange(rows.shape[0]), torch.randint(rows.shape[1], (rows.shape[0],), generator=gen)] = True
    masked = torch.where(keep, rows.to(torch.float64), 0.0)
    return (masked / masked.sum(-1, keepdim=True)).to(rows.dtype)


def pad(row: list[float], length: int, *, seed: int) -> list[float]:
    """Place ``row`` at random positions of a zero row of ``length`` (zeros = masked keys)."""
    rng = np.random.default_rng(seed)
    out = [0.0] * length
    for value, position in zip(row, rng.permutation(length)[: len(row)], strict=False):
        out[int(position)] = value
    return out


def adversarial_rows(length: int, *, seed: int) -> dict[str, list[float]]:
    """Named rows of ``length`` keys (zero-padded) from the adversarial families; float64 values."""
    rng = np.random.default_rng(seed)
    eps = 1e-6
    families: dict[str, list[float]] = {}
    for k in (2, 4, 6, 3, 5, 7, 15):
        if k <= length:
            families[f"equal_atoms_{k}"] = [1.0 / k] * k
    m = min(length, 12)
    families["powers_of_two"] = [2.0**-i for i in range(1, m)] + [2.0 ** -(m - 1)]
    dyadic = rng.integers(1, 64, size=min(length, 10)).astype(float)
    families["random_dyadics"] = list(dyadic / 2.0 ** math.ceil(math.log2(dyadic.sum())))
    ints = rng.integers(1, 1000, size=min(length, 11)).astype(float)
    families["integer_weights"] = list(ints / ints.sum())
    if length >= 6:
        dust = [eps / 4] * 4
        families["two_heavy_plus_dust"] = [0.5 - eps / 2, 0.5 - eps / 2, *dust]
    if length >= 4:
        for name, top in (("pmax_below_half", 0.5 - 1e-9), ("pmax_at_half", 0.5), ("pmax_above_half", 0.5 + 1e-9)):
            families[name] = [top, (1 - top) / 2, (1 - top) / 4, (1 - top) / 4]
    families["three_atoms_small_tail"] = [0.33, 0.33, 0.33, 0.005, 0.005][: max(3, min(length, 5))]
    families["geometric"] = list(0.7 ** np.arange(min(length, 12)) * 0.3 / (1 - 0.7 ** min(length, 12)))
    families["single_key"] = [1.0]
    if length >= 2:
        families["two_keys"] = [0.3, 0.7]
    return {name: pad(values, length, seed=seed + i) for i, (name, values) in enumerate(families.items())}


def sums_error_free(row: torch.Tensor) -> bool:
    """The documented criterion of exact summation: s ≤ 2^52·q, q = the lowest set bit over the row (for every
    dtype: float32/16/bf16 rows try their smallest value's ulp first, which is never larger)."""
    values = [Fraction(float(v)) for v in row.flatten().tolist() if v != 0]
    s = sum(values)
    q = Fraction(1, max(v.denominator for v in values))
    return s <= q * 2**52


def error_radius(row: torch.Tensor) -> float:
    """E = (2n + 16)·u·s·(1 + 2^-10): the documented rounding radius of rows whose sums are not error-free."""
    n = int((row != 0).sum())
    s = float(row.to(torch.float64).sum())
    return (2 * n + 16) * UNIT_ROUNDOFF * s * (1 + 2**-10) * (1 + 2**-40)
