"""Soundness on rows of 2–34 keys whose logits have structure that Gaussian scores lack: integer multiples of
log 2 (every probability a power of two when their sum is one, rounded otherwise), exact duplicates, two blocks
of keys, a few large keys over many small ones, heavy tails. Each certificate is checked exactly against the
integer meet-in-the-middle oracle, by default and with every row enumerated (``exact_support=34``), on both CPU
backends.

Rows of 24–27 powers of two crashed the four-list search (a modulus larger than its pair sums) until a randomised
comparison of this kind found them.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from attnsens.theta import ThetaMethod, certify, exact
from attnsens.theta._numba_partition import multiset_split
from tests.helpers.real_rows import dyadic
from tests.helpers.soundness import BACKENDS, assert_certificate_sound
from tests.reference.theta_oracles import theta_dyadic_meet_in_the_middle

FAMILIES = ("powers_of_two", "log2_integers", "duplicates", "two_blocks", "few_large", "heavy_tail", "near_uniform")
LENGTHS = (2, 7, 16, 24, 25, 26, 27, 31, 34)
MAX_LOGIT_SPREAD = 10.0
"""Logits are clipped to this far below the largest: probabilities within a factor e^10 < 2^15, so the oracle's
integers (multiples of the smallest value's ulp) stay below 2^46/n."""


def structured_row(family: str, n_keys: int, rng: np.random.Generator) -> torch.Tensor:
    """A float32 softmax row of ``n_keys`` keys with the family's logits."""
    if family == "powers_of_two":
        return powers_of_two_summing_to_one(n_keys, rng)
    if family == "log2_integers":
        z = rng.integers(-4, 4, n_keys) * math.log(2)
    elif family == "duplicates":
        z = rng.choice(rng.standard_normal(3), n_keys)
    elif family == "two_blocks":
        z = np.where(np.arange(n_keys) < rng.integers(1, n_keys + 1), 0.0, rng.uniform(-3, 0))
        z = z + 0.01 * rng.standard_normal(n_keys)
    elif family == "few_large":
        z = 0.1 * rng.standard_normal(n_keys)
        z[: rng.integers(1, 5)] += rng.uniform(2, 12)
    elif family == "heavy_tail":
        z = 0.5 * rng.standard_cauchy(n_keys)
    else:
        z = 10.0 ** rng.uniform(-4, -1) * rng.standard_normal(n_keys)
    p = np.exp(np.maximum(z - z.max(), -MAX_LOGIT_SPREAD))
    return torch.from_numpy((p / p.sum()).astype(np.float32))


def powers_of_two_summing_to_one(n_keys: int, rng: np.random.Generator) -> torch.Tensor:
    """1 halved n_keys − 1 times, each time a random value of at least 2^-8 split into two halves: a softmax of
    integer multiples of log 2 whose probabilities are exact (a sum that is a power of two)."""
    exponents = [0]
    for _ in range(n_keys - 1):
        splittable = [i for i, k in enumerate(exponents) if k < 8]
        k = exponents.pop(splittable[rng.integers(len(splittable))])
        exponents += [k + 1, k + 1]
    return torch.tensor([2.0**-k for k in rng.permutation(exponents)], dtype=torch.float32)


def structured_rows(seed: int) -> tuple[torch.Tensor, list[str]]:
    rng = np.random.default_rng(seed)
    rows, labels = [], []
    for family in FAMILIES:
        for n_keys in LENGTHS:
            for k in range(2):
                rows.append(torch.nn.functional.pad(structured_row(family, n_keys, rng), (0, max(LENGTHS) - n_keys)))
                labels.append(f"{family}, {n_keys} keys, #{k}")
    return torch.stack(rows), labels


@pytest.mark.parametrize("backend", BACKENDS)
def test_structured_logit_rows_contain_theta(backend: str) -> None:
    rows, labels = structured_rows(seed=3)
    default = certify(rows, backend=backend)
    enumerated = certify(rows, backend=backend, exact_support=34)
    exact_by_default = 0
    for i, row in enumerate(rows):
        theta = theta_dyadic_meet_in_the_middle(*dyadic(row))
        for name, cert in (("default", default), ("exact_support=34", enumerated)):
            lower, upper = float(cert.lower[i]), float(cert.upper[i])
            assert_certificate_sound(lower, upper, theta, f"{labels[i]} [{backend}, {name}]")
        assert bool(enumerated.exact[i]), labels[i]
        if int((row != 0).sum()) <= 24:
            assert bool(default.exact[i]), labels[i]
        exact_by_default += bool(default.exact[i])
    assert exact_by_default > len(rows) // 2  # not vacuous: most of these rows are proved by default


def best_multiset_distance(values: list[int], counts: list[int], total: int) -> Fraction:
    """min_S |p(S) − total/2| over the sub-multisets of ``values`` (integers) with ``counts`` copies each, exactly:
    every choice of every count but the last value's, and for that one the floor and ceiling of its best count (in
    integers: |2·Σ − total| is minimised)."""
    last = len(values) - 1
    best = None
    for ks in itertools.product(*(range(c + 1) for c in counts[:last])):
        rest = total - 2 * sum(k * v for k, v in zip(ks, values[:last], strict=True))  # 2·(t − partial)
        below = rest // (2 * values[last])
        for k in (below, below + 1):
            k = min(max(k, 0), counts[last])
            gap = abs(rest - 2 * k * values[last])
            best = gap if best is None else min(best, gap)
    assert best is not None
    return Fraction(best, 2)


def random_multiset(rng: np.random.Generator, n_values: int, most: int) -> tuple[list[int], list[int]]:
    values = sorted({int(v) for v in rng.integers(1 << 10, 1 << 20, n_values)}, reverse=True)
    return values, [int(c) for c in rng.integers(1, most + 1, len(values))]


def test_multiset_split_is_the_exact_optimum() -> None:
    rng = np.random.default_rng(5)
    for n_values, most in [(1, 9), (2, 30), (3, 20), (4, 12), (5, 6), (8, 2), (16, 1)] * 4:
        values, counts = random_multiset(rng, n_values, most)
        vals = np.repeat(np.array(values, dtype=np.float64), counts)
        total = int(vals.sum())
        d, proved = multiset_split(vals, 0.5 * total)
        assert proved
        assert Fraction(d) == best_multiset_distance(values, counts, total), (values, counts)


def test_multiset_split_declines_rows_it_cannot_list() -> None:
    rng = np.random.default_rng(6)
    assert not multiset_split(np.sort(rng.integers(1, 1 << 20, 17).astype(np.float64))[::-1].copy(), 1.0)[1]
    many_copies = np.repeat(np.array([9.0, 7.0, 5.0, 3.0]), 400)  # 401^4 choices: two lists of 160,801 sums
    assert not multiset_split(many_copies, 0.5 * many_copies.sum())[1]


def wrong_multiset_split_without_the_last_copy(vals_desc: np.ndarray, t: float) -> tuple[float, bool]:
    """A plausible bug: every value's count runs to c_j − 1, never taking all its copies."""
    values, counts = np.unique(vals_desc, return_counts=True)
    best = min(
        abs(sum(k * v for k, v in zip(ks, values, strict=True)) - t)
        for ks in itertools.product(*(range(c) for c in counts))
    )
    return float(best), True


def test_meta_multiset_oracle_catches_a_missing_copy() -> None:
    rng = np.random.default_rng(7)
    with pytest.raises(AssertionError):
        for _ in range(20):
            values, counts = random_multiset(rng, 3, 6)
            vals = np.repeat(np.array(values, dtype=np.float64), counts)
            total = int(vals.sum())
            d, _ = wrong_multiset_split_without_the_last_copy(vals, 0.5 * total)
            assert Fraction(d) == best_multiset_distance(values, counts, total)


def multiset_theta(row: torch.Tensor) -> Fraction:
    """θ of a row of repeated values, exactly: s − 4·d*² with d* from ``best_multiset_distance`` on the row's
    distinct values as integers (the most frequent last, so the oracle loops over the others)."""
    values, counts = np.unique(row[row > 0].numpy(), return_counts=True)
    ints, exponent = dyadic(torch.from_numpy(values))
    order = np.argsort(counts)
    ints_sorted = [ints[j] for j in order]
    counts_sorted = [int(counts[j]) for j in order]
    total = sum(v * c for v, c in zip(ints_sorted, counts_sorted, strict=True))
    d = best_multiset_distance(ints_sorted, counts_sorted, total)
    scale = Fraction(1, 2**exponent)
    return total * scale - 4 * (d * scale) ** 2


def repeated_logit_rows(seed: int) -> torch.Tensor:
    """Softmax rows of 49–160 keys whose logits take 1–4 values: every heuristic stage stalls on them."""
    rng = np.random.default_rng(seed)
    rows = []
    for n_keys in (49, 64, 97, 128, 160):
        for n_values in (1, 2, 3, 4):
            z = rng.choice(rng.standard_normal(n_values), n_keys)
            p = np.exp(z - z.max())
            rows.append(torch.nn.functional.pad(torch.from_numpy((p / p.sum()).astype(np.float32)), (0, 160 - n_keys)))
    return torch.stack(rows)


def test_rows_of_repeated_logits_contain_theta_at_float32_resolution() -> None:
    """Rows the heuristics settle within the stop distance end there; the rest end exact, in the multiset split."""
    rows = repeated_logit_rows(seed=8)
    cert = certify(rows)
    assert int((cert.method == ThetaMethod.MULTISET_SPLIT).sum()) >= len(rows) // 3
    for i, row in enumerate(rows):
        theta = multiset_theta(row)
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), theta, f"row {i}")
        assert float(cert.upper[i] - cert.lower[i]) <= 2.0**-25, i


def test_exact_solves_long_rows_of_a_few_repeated_values() -> None:
    """2,000 keys over three logits: lists of 668 and 446,224 sums, beyond ``certify``'s cap of 2^16 and within
    ``exact``'s; complete Karmarkar–Karp alone ran out of its 2,000,000 nodes on this row."""
    rng = np.random.default_rng(0)
    z = rng.choice(rng.standard_normal(3), 2000)
    p = np.exp(z - z.max())
    row = torch.from_numpy((p / p.sum()).astype(np.float32))
    theta = multiset_theta(row)
    value = float(exact(row[None])[0])
    assert abs(Fraction(value) - theta) <= Fraction(2.0**-40)
