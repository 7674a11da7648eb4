"""The per-row pass (``_numba_scan.scan_row``) and the thresholded top-K search (``top_k``) against plain float
loops written here."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from attnsens.theta import certify
from attnsens.theta._numba_scan import _all_float32_multiples, scan_row, top_k
from tests.helpers.scan import reference_ulp_float32
from tests.unit.theta.rows import softmax_rows, with_zeros

K = 8


def scan(row: np.ndarray, exact_quantum: bool) -> tuple:
    """scan_row then top_k, as the cascade runs them: (ŝ, n, p_max, q, end, status, top_v, top_i)."""
    signed = np.dtype(f"int{8 * row.dtype.itemsize}")
    bits = row.view(signed)
    *out, threshold, first = scan_row(row, bits, signed.type(np.iinfo(signed).max), exact_quantum, K)
    top_v = np.empty(K)
    top_i = np.empty(K, np.int64)
    top_k(row, bits, threshold, first, out[4], top_v, top_i)
    return (*out, top_v, top_i)


def reference_top(row: np.ndarray) -> tuple[list[float], list[int]]:
    """The K largest positive entries, descending, ties by earlier index; padded with (−1, −1)."""
    order = sorted((i for i in range(row.size) if row[i] > 0), key=lambda i: (-float(row[i]), i))[:K]
    values = [float(row[i]) for i in order] + [-1.0] * (K - len(order))
    return values, order + [-1] * (K - len(order))


ROWS = {
    "softmax": softmax_rows(1, 1024, 2.0, seed=0)[0].numpy(),
    "causal": with_zeros(softmax_rows(1, 300, 1.0, seed=1), 0.6, seed=1)[0].numpy(),
    "odd length": softmax_rows(1, 37, 4.0, seed=2)[0].numpy(),
    "shorter than K": np.array([0.5, 0.0, 0.25, 0.25], np.float32),
    "ties": np.array([0.1] * 6 + [0.2] + [0.1] * 3 + [0.0] * 5, np.float32) / np.float32(1.1),
    "one key": np.array([1.0], np.float32),
    "window": np.concatenate([np.zeros(500), softmax_rows(1, 60, 1.0, seed=3)[0].numpy(), np.zeros(40)]),
    "scattered zeros": with_zeros(softmax_rows(1, 512, 1.0, seed=4), 0.9, seed=4)[0].numpy(),
    "subnormal entry": np.array([1.0 - 2.0**-24, 2.0**-24, 1e-40, 0.0], np.float32),
    "few low bits": np.array([0.5, 0.5 - 2.0**-24, 2.0**-30], np.float32),  # ulp 2^-53, lowest bit 2^-30
}


@pytest.mark.parametrize("name", list(ROWS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scan_matches_plain_loops(name: str, dtype: type) -> None:
    row = ROWS[name].astype(dtype)
    total, n, p_max, q, end, status, top_v, top_i = scan(row, exact_quantum=dtype == np.float64)
    positive = [i for i in range(row.size) if row[i] > 0]
    assert status == 0
    assert n == len(positive) and end == positive[-1] + 1
    assert abs(total - math.fsum(float(v) for v in row)) <= 2 * row.size * 2.0**-53
    assert p_max == float(row.max())
    values, indices = reference_top(row)
    assert top_v.tolist() == values and top_i.tolist() == indices
    if dtype == np.float32:  # ulp of p_min, or the lowest set bit over the row where only that one proves ŝ ≤ 2^52·q
        ulp = reference_ulp_float32(float(row[positive].min()))
        lowest = 1 / max(Fraction(float(row[i])).denominator for i in positive)
        assert q == (lowest if ulp * 2.0**52 < total <= lowest * 2**52 else ulp)
    for i in positive:  # q divides every entry
        assert float(row[i]) / q == math.floor(float(row[i]) / q)


def test_negative_zero_is_a_zero_and_a_negative_entry_is_flagged() -> None:
    row = np.array([0.5, -0.0, 0.5, -0.0], np.float32)
    total, n, *_, status, _, _ = scan(row, exact_quantum=False)
    assert status == 0 and n == 2 and total == 1.0
    for backend in ("numba", "torch"):
        cert = certify(torch.tensor([[0.5, -0.0, 0.5]]), backend=backend)
        assert float(cert.lower[0]) == 1.0 and bool(cert.exact[0])
    row[1] = -(2.0**-30)
    assert scan(row, exact_quantum=False)[5] == 2  # RowStatus.NEGATIVE
    tail = np.zeros(100, np.float32)
    tail[:2] = 0.5
    tail[-1] = -(2.0**-30)  # a negative entry after a run of zeros is still read
    assert scan(tail, exact_quantum=False)[5] == 2


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_entries_are_flagged(bad: float) -> None:
    row = np.array([0.5, bad, 0.5], np.float32)
    assert scan(row, exact_quantum=False)[5] == 1  # RowStatus.NON_FINITE


def test_multiples_of_a_power_of_two_by_integer_bits() -> None:
    """``_all_float32_multiples`` (the significand's low bits) answers as dividing each value by 2^k does, on normal
    and subnormal values, short and full significands, ±0.0, every cut of the span and k on both sides of the
    float32 range: a mask one bit short or long, or a normal value read without its implicit bit, gives another
    answer."""
    rng = np.random.default_rng(5)

    def by_division(values: np.ndarray, k: int) -> bool:
        q = math.ldexp(1.0, k)
        return all(v <= 0.0 or float(v) / q == math.floor(float(v) / q) for v in values.astype(np.float64))

    seen = {True: 0, False: 0}
    for trial in range(4000):
        size = int(rng.integers(1, 150))
        kind = trial % 4
        if kind == 0:  # full significands
            x = rng.random(size)
        elif kind == 1:  # short significands over the whole exponent range
            x = rng.integers(0, 16, size) * np.ldexp(1.0, rng.integers(-149, 0, size))
        elif kind == 2:  # subnormals and zeros
            x = rng.integers(0, 2**23, size) * 2.0**-149
            x[rng.random(size) < 0.3] = 0.0
        else:  # powers of two and negative zeros
            x = np.ldexp(1.0, rng.integers(-149, 1, size))
            x[rng.random(size) < 0.2] = -0.0
        row = x.astype(np.float32)
        end = int(rng.integers(0, size + 1))
        k = int(rng.integers(-152, 3))
        expected = by_division(row[:end], k)
        assert _all_float32_multiples(row.view(np.int32), end, k) == expected, (trial, k, row[:end])
        seen[expected] += 1
    assert min(seen.values()) > 500  # both answers are tested often
