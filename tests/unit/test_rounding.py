"""The rounding module against exact rationals (fractions.Fraction) and 300-bit mpmath: every directed operation,
certified sum and spectral-norm bound lands on the safe side of the real value, including subnormals, overflow
and the exact cases where round-to-nearest lands below."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import mpmath
import pytest
import torch

from attnsens import _rounding as R

F64 = torch.float64


def _floats(rng: random.Random, n: int) -> list[float]:
    """Mixed magnitudes: ordinary, near 1, huge, tiny normal and subnormal values of both signs."""
    pool = []
    for _ in range(n):
        kind = rng.randrange(5)
        if kind == 0:
            x = rng.uniform(-4, 4)
        elif kind == 1:
            x = 1.0 + rng.randrange(-8, 8) * 2.0**-52
        elif kind == 2:
            x = rng.uniform(1, 2) * 2.0 ** rng.randrange(900, 1023)
        elif kind == 3:
            x = rng.uniform(1, 2) * 2.0 ** rng.randrange(-1070, -1000)
        else:
            x = rng.choice([1 / 3, 0.1, 2.0**-1074, 3 * 2.0**-1074])
        pool.append(x if rng.random() < 0.7 else -x)
    return pool


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_directed_operations_enclose_the_exact_result(name: str) -> None:
    rng = random.Random(name)
    a = torch.tensor(_floats(rng, 400), dtype=F64)
    b = torch.tensor(_floats(rng, 400), dtype=F64)
    exact = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
             "div": lambda x, y: x / y}[name]  # fmt: skip
    up, down = getattr(R, f"{name}_up")(a, b), getattr(R, f"{name}_down")(a, b)
    for x, y, hi, lo in zip(a.tolist(), b.tolist(), up.tolist(), down.tolist(), strict=True):
        real = exact(Fraction(x), Fraction(y))
        assert math.isinf(hi) or Fraction(hi) >= real, (name, x, y, hi)
        assert math.isinf(lo) or Fraction(lo) <= real, (name, x, y, lo)


def test_square_roots_and_squares_enclose_the_exact_result() -> None:
    x = torch.tensor([abs(v) for v in _floats(random.Random(3), 400)], dtype=F64)
    for v, hi, lo, sq_hi, sq_lo in zip(
        x.tolist(), R.sqrt_up(x).tolist(), R.sqrt_down(x).tolist(), R.square_up(x).tolist(),
        R.square_down(x).tolist(), strict=True,
    ):  # fmt: skip
        assert Fraction(hi) ** 2 >= Fraction(v) >= Fraction(lo) ** 2
        assert (math.isinf(sq_hi) or Fraction(sq_hi) >= Fraction(v) ** 2) and Fraction(sq_lo) <= Fraction(v) ** 2


def test_sums_of_nonnegative_terms_enclose_the_exact_sum() -> None:
    rng = random.Random(5)
    for n in (1, 2, 7, 100, 4097):
        x = torch.tensor([abs(v) if abs(v) < 1e300 else 1.0 for v in _floats(rng, n)], dtype=F64)
        exact = sum(Fraction(v) for v in x.tolist())
        assert Fraction(float(R.sum_upper_bound(x))) >= exact >= Fraction(float(R.sum_lower_bound(x)))


def test_inexact_sum_of_thirds_is_enclosed() -> None:
    x = torch.full((3,), 1 / 3, dtype=F64)
    exact = 3 * Fraction(1 / 3)
    assert Fraction(float(x.sum())) != exact  # round to nearest (here 1.0) is off the real sum
    assert Fraction(float(R.sum_upper_bound(x))) >= exact >= Fraction(float(R.sum_lower_bound(x)))


def _sigma_max_mpmath(W: torch.Tensor) -> mpmath.mpf:
    with mpmath.workprec(300):
        M = mpmath.matrix([[mpmath.mpf(v) for v in row] for row in W.tolist()])
        return max(mpmath.svd_r(M, compute_uv=False))


def test_spectral_norm_bound_exceeds_the_300_bit_singular_value() -> None:
    gen = torch.Generator().manual_seed(0)
    for shape in [(1, 1), (2, 3), (5, 4), (6, 6), (3, 9)]:
        for scale in (1.0, 2.0**-500, 2.0**400):
            W = torch.randn(*shape, generator=gen, dtype=F64) * scale
            bound = R.spectral_norm_upper_bound(W)
            true = _sigma_max_mpmath(W)
            with mpmath.workprec(300):
                assert mpmath.mpf(float(bound)) >= true, (shape, scale)
                assert mpmath.mpf(float(bound)) <= true * (1 + mpmath.mpf(2) ** -40)


def test_spectral_norm_bound_of_rank_one_matrices_exceeds_the_exact_norm() -> None:
    """‖a bᵀ‖₂² = ‖a‖²‖b‖² exactly in rationals; the float64 eigenvalue lands below it about half the time."""
    gen = torch.Generator().manual_seed(1)
    below = 0
    for _ in range(200):
        a = torch.randn(4, generator=gen, dtype=F64)
        b = torch.randn(6, generator=gen, dtype=F64)
        W = a[:, None] * b[None, :]
        exact = sum(Fraction(v) ** 2 for row in W.tolist() for v in row)  # ‖W‖_F² = σ² for rank one
        below += Fraction(float(torch.linalg.matrix_norm(W, ord=2))) ** 2 < exact
        assert Fraction(float(R.spectral_norm_upper_bound(W))) ** 2 >= exact
    assert below > 0  # the family is adversarial for round-to-nearest


def test_scale_lower_bounds_of_layernorm_and_rmsnorm_are_below_the_300_bit_values() -> None:
    rows = [[2.0**60 + 256 * k for k in range(32)], [1e300, -1e300, 3.0], [2.0**-1074] * 4, [0.0, 0.0, 0.0]]
    gen = torch.Generator().manual_seed(2)
    rows += (torch.randn(20, 7, generator=gen, dtype=F64) * 3 + 1).tolist()
    for i, row in enumerate(rows):
        for eps in (0.0, 1e-5, 2.0**-1074):
            x = torch.tensor(row, dtype=F64)
            ln, rms = float(R.layernorm_scale_lower_bound(x, eps)), float(R.rmsnorm_scale_lower_bound(x, eps))
            with mpmath.workprec(400):
                v = [mpmath.mpf(t) for t in row]
                mean = mpmath.fsum(v) / len(v)
                sigma = mpmath.sqrt(mpmath.fsum((t - mean) ** 2 for t in v) / len(v) + mpmath.mpf(eps))
                r = mpmath.sqrt(mpmath.fsum(t**2 for t in v) / len(v) + mpmath.mpf(eps))
                assert mpmath.mpf(ln) <= sigma and mpmath.mpf(rms) <= r, (row[:3], eps)
                if i not in (1, 2) and eps != 2.0**-1074:  # overflowing squares, subnormals: sound but loose
                    assert mpmath.mpf(ln) >= sigma * (1 - mpmath.mpf(2) ** -40)


def test_gamma_refuses_counts_beyond_the_certified_range() -> None:
    assert R.gamma(10) >= 10 * 2.0**-53
    with pytest.raises(ValueError, match="certified range"):
        R.gamma(2**40)
