"""The residue bound (``_numba_residues``) and the cascade stage that proves with it (``RESIDUE_BOUND``).

The residues modulo 64 that a row's subset sums reach bound d* from below; where the bound is above q/2 no split
is perfect, and a split found at the bound is optimal. Rows with a few keys some nats below the rest are where it
matters: their few small values alone set the low bits of every sum. Each claim is checked against brute force
(n ≤ 14) or integer meet-in-the-middle (n ≤ 36), and each check is shown to catch a bound one step too high.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
import torch

from attnsens.theta import ThetaMethod, certify, exact
from attnsens.theta._numba_four_list import four_list_perfect_split
from attnsens.theta._numba_residues import reached_residues, residue_bound, residue_count
from tests.helpers.cardinality import best_twice_gap
from tests.helpers.real_rows import dyadic
from tests.helpers.soundness import assert_certificate_sound
from tests.reference.theta_oracles import best_twice_gap_dyadic, theta_dyadic_meet_in_the_middle

FEW_LOW_KEYS_SUPPORT = (28, 34)
"""Supports of the softmax rows below: long enough to pass meet-in-the-middle's cheap limit (24 keys) and the
enumeration after the proofs (26), short enough for the oracle (2^17 sums a half)."""


def low_bit_integers(rng: np.random.Generator, n: int) -> np.ndarray:
    """n integers whose low bits come from a few of them: most are multiples of 2^k (k = 2–6), one to three are
    small and arbitrary, as a float row's values are when a few keys sit in lower binades."""
    k = int(rng.integers(2, 7))
    coarse = rng.integers(1 << 3, 1 << 6, n) << k
    n_fine = min(n, int(rng.integers(1, 4)))
    coarse[:n_fine] = rng.integers(1, 1 << (k + 2), n_fine)
    return coarse


def subset_sums(ints: np.ndarray) -> list[int]:
    return [sum(c) for r in range(len(ints) + 1) for c in itertools.combinations(ints.tolist(), r)]


def test_reached_residues_are_the_subset_sums_modulo_64() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        ints = low_bit_integers(rng, int(rng.integers(1, 11)))
        reach, total = reached_residues(np.sort(ints.astype(np.float64))[::-1].copy(), 1.0)
        assert total == int(ints.sum())
        bits = {r for r in range(64) if (int(reach) >> r) & 1}
        assert bits == {a % 64 for a in subset_sums(ints)}, ints
        assert residue_count(np.uint64(reach)) == len(bits)
        assert residue_bound(np.sort(ints.astype(np.float64))[::-1].copy(), 1.0)[1] == len(bits)


def assert_bound_below_the_optimum(bound: Callable[[np.ndarray, float], float], seed: int) -> int:
    """``bound`` (in units of q = 1, as ``residue_bound``) ≤ d* on random low-bit rows of 6–14 integers, and
    above the parity bound on most; returns how many it met exactly."""
    rng = np.random.default_rng(seed)
    tight = above_parity = 0
    for _ in range(300):
        ints = low_bit_integers(rng, int(rng.integers(6, 15)))
        vals = np.sort(ints.astype(np.float64))[::-1].copy()
        twice_gap = best_twice_gap(ints.tolist())
        claimed = bound(vals, 1.0)
        assert 2 * Fraction(claimed) <= twice_gap, (ints.tolist(), claimed, twice_gap)
        tight += 2 * claimed == twice_gap
        above_parity += 2 * claimed > int(ints.sum()) % 2
    assert above_parity >= 150  # 232 of these 300 rows
    return tight


def test_residue_bound_never_exceeds_the_optimum_and_is_often_it() -> None:
    tight = assert_bound_below_the_optimum(lambda vals, q: residue_bound(vals, q)[0], seed=1)
    assert tight >= 150  # 212 of 300


def test_meta_bound_check_catches_a_bound_one_step_too_high() -> None:
    """The check above fails on a bound that skips one candidate distance (δ + 2 where δ is reached)."""
    with pytest.raises(AssertionError):
        assert_bound_below_the_optimum(lambda vals, q: residue_bound(vals, q)[0] + q, seed=1)


def few_low_keys_rows(seed: int, count: int, drop: tuple[float, float] = (2.0, 4.0)) -> torch.Tensor:
    """float32 softmax rows of 28–34 near-uniform keys (logits 0.3·z) with one to three keys ``drop`` nats lower:
    those few keys sit in lower binades and set the low bits of every subset sum."""
    rng = np.random.default_rng(seed)
    lo, hi = FEW_LOW_KEYS_SUPPORT
    rows = []
    for _ in range(count):
        n = int(rng.integers(lo, hi + 1))
        z = 0.3 * rng.standard_normal(n)
        k = int(rng.integers(1, 4))
        z[:k] -= rng.uniform(*drop, k)
        p = np.exp(z - z.max())
        rows.append(torch.nn.functional.pad(torch.from_numpy((p / p.sum()).astype(np.float32)), (0, hi - n)))
    return torch.stack(rows)


def test_certify_proves_rows_with_a_few_low_keys_exactly() -> None:
    """Many such rows end at ``RESIDUE_BOUND``, and every one holds the oracle's θ as an exact row: lower and upper
    the float64 enclosure of that one number. Before the stage, 30 % of rows like these ended exact."""
    rows = few_low_keys_rows(seed=2, count=120)
    cert = certify(rows)
    proved = torch.nonzero(cert.method == ThetaMethod.RESIDUE_BOUND).flatten().tolist()
    assert len(proved) >= 30, cert.method_names()
    assert bool(cert.exact[proved].all())
    for i in proved:
        theta = theta_dyadic_meet_in_the_middle(*dyadic(rows[i]))
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), theta, f"row {i}")
        assert float(cert.upper[i] - cert.lower[i]) <= 2.0**-49, i


def test_exact_agrees_with_the_oracle_where_the_residue_stage_proves() -> None:
    rows = few_low_keys_rows(seed=3, count=40)
    proved = certify(rows).method == ThetaMethod.RESIDUE_BOUND
    values = exact(rows[proved])
    for i, row in enumerate(rows[proved]):
        theta = theta_dyadic_meet_in_the_middle(*dyadic(row))
        assert abs(Fraction(float(values[i])) - theta) <= Fraction(2.0**-49), i


def test_four_list_split_at_the_bound_is_the_optimum() -> None:
    """The four-list search aimed at (V − δ)/2 (δ the residue bound) finds only real subsets: where it reports
    one, δ is the oracle's optimum."""
    rows = few_low_keys_rows(seed=4, count=60)
    found = 0
    for row in rows:
        ints, _ = dyadic(row)
        vals = np.sort(np.array(ints, np.float64))[::-1].copy()
        bound, _ = residue_bound(vals, 1.0)
        gap = int(2 * bound)
        if gap <= sum(ints) % 2:
            continue
        if four_list_perfect_split(vals, 1.0, 1 << 16, gap) == bound:
            found += 1
            assert best_twice_gap_dyadic(ints) == gap, ints
    assert found >= 5
