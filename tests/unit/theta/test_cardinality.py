"""The cardinality bound and the cardinality-pruned search on the rows they are for: near-uniform attention with
odd and even counts, 9–127 keys, float32. Exact claims are checked against exact rational enumeration (n ≤ 22),
integer meet-in-the-middle (n ≤ 40) and an independent local search (longer rows), and each check is shown to
catch a deliberately wrong version of its stage."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from attnsens.theta import ThetaMethod, certify, exact
from attnsens.theta._numba_cardinality import (
    _prefix_sums,
    _suffix_distance,
    cardinality_branch_and_bound,
    cardinality_relaxation,
)
from tests.helpers.cardinality import assert_bound_claims, best_twice_gap, integer_rows, local_search_theta
from tests.helpers.soundness import assert_certificate_sound
from tests.reference.theta_oracles import theta_dyadic_meet_in_the_middle, theta_fraction

CARDINALITY_METHODS = {ThetaMethod.CARDINALITY_BOUND, ThetaMethod.CARDINALITY_SEARCH}


def near_uniform_rows(n_rows: int, length: int, spread: float, *, seed: int) -> torch.Tensor:
    """float32 rows softmax(spread·z): p_max·n between about 1.0 and 1.35 for spread ≤ 0.1."""
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(spread * torch.randn(n_rows, length, generator=gen, dtype=torch.float64), -1).float()


def dyadic_near_uniform(length: int, spread: float, rng: np.random.Generator) -> tuple[list[int], int]:
    """Integers ≈ 2^24·(1 + spread·z) and the exponent that makes their row sum about 1 (exact in float64)."""
    ints = np.maximum(1, np.round(2**24 * (1 + spread * rng.standard_normal(length)))).astype(np.int64)
    return [int(v) for v in ints], 24 + int(np.ceil(np.log2(length)))


def wrong_middle_count_only(vals_desc: np.ndarray, k_top: int, t: float) -> tuple[float, float]:
    """A plausible bug: only the counts nearest n/2 considered (drops T and the other counts)."""
    n = vals_desc.size
    best = np.inf
    for k in (n // 2, (n + 1) // 2):
        low, high = vals_desc[n - k :].sum(), vals_desc[:k].sum()
        best = min(best, 0.0 if low <= t <= high else min(abs(t - low), abs(t - high)))
    return best, best


def wrong_search_prunes_half(vals_desc: np.ndarray, t: float, quantum: float, budget: int) -> tuple[float, bool]:
    """A plausible bug: the search stops at the first split it meets and calls it proved."""
    side = 0.0
    for v in vals_desc:
        if side + v <= t:
            side += v
    return t - side, True


def assert_search_claims(search, rows: list[list[int]]) -> None:
    """A search result d is a real split's distance, and equals d* when it claims a proof."""
    for ints in rows:
        vals = np.sort(np.array(ints, dtype=np.float64))[::-1].copy()
        twice = best_twice_gap(ints)
        d, proved = search(vals, 0.5 * float(vals.sum()), 1.0, 50_000)
        assert 2 * Fraction(d) >= twice, f"{ints}: d={d} below the optimum {twice}/2"
        if proved:
            assert 2 * Fraction(d) == twice, f"{ints}: claimed d*={d}, true 2d*={twice}"


def test_cardinality_bound_is_a_bound_and_exact_when_positive() -> None:
    rows = integer_rows(0)
    assert_bound_claims(cardinality_relaxation, rows)
    claimed = sum(
        cardinality_relaxation(np.sort(np.array(r, float))[::-1].copy(), 8, 0.5 * sum(r))[0] > 0 for r in rows
    )
    assert claimed >= len(rows) // 5  # the check is not vacuous: many rows are settled by the bound


def test_meta_bound_check_catches_a_wrong_cardinality_bound() -> None:
    with pytest.raises(AssertionError):
        assert_bound_claims(wrong_middle_count_only, integer_rows(0))


def test_cardinality_search_is_exact_when_it_claims_a_proof() -> None:
    rows = integer_rows(1)
    assert_search_claims(cardinality_branch_and_bound, rows)
    proved = sum(
        cardinality_branch_and_bound(np.sort(np.array(r, float))[::-1].copy(), 0.5 * sum(r), 1.0, 50_000)[1]
        for r in rows
    )
    assert proved == len(rows)  # tiny rows: the search always exhausts its tree


def reference_suffix_distance(values: list[int], i: int, g: int) -> tuple[int, int, int]:
    """(bound, endpoint, k) of ``_suffix_distance`` from every count's interval of values[i:], in integers."""
    rest = sorted(values[i:])
    if g <= 0:
        return -g, -g, 0
    low = [sum(rest[:k]) for k in range(len(rest) + 1)]
    high = [sum(rest[len(rest) - k :]) for k in range(len(rest) + 1)]
    k = max(k for k in range(len(rest) + 1) if low[k] <= g)
    below = g - high[k]
    above = low[k + 1] - g if k < len(rest) else None
    bound = 0 if below <= 0 else below if above is None else min(below, above)
    endpoint = abs(below) if above is None else min(abs(below), above)
    return bound, endpoint, k


def test_suffix_distance_walks_to_the_count_from_any_start() -> None:
    """The search's bound finds its count by walking from the parent's: from every start, above or below the
    count, it must reach the same count, bound and endpoint as every count's interval computed apart."""
    rng = np.random.default_rng(5)
    for length, spread in ((9, 0.02), (20, 0.3), (33, 2.0)):
        values = sorted((int(v) for v in np.maximum(1, np.round(1000 * np.exp(spread * rng.standard_normal(length))))),
                        reverse=True)  # fmt: skip
        vals = np.array(values, float)
        prefix = _prefix_sums(vals)
        low_sum = np.array([prefix[length] - prefix[length - k] for k in range(length + 1)])
        for i in range(length):
            for g in rng.integers(-50, sum(values[i:]) + 50, 12).tolist():
                want = reference_suffix_distance(values, i, g)
                for start in range(length + 1):
                    bound, endpoint, k = _suffix_distance(prefix, low_sum, length, i, float(g), start)
                    assert (bound, endpoint, k) == want, (length, i, g, start)


def test_meta_search_check_catches_a_wrong_search() -> None:
    with pytest.raises(AssertionError):
        assert_search_claims(wrong_search_prunes_half, integer_rows(1))


def check_against_exact_rationals(backend: str, lengths: tuple[int, ...]) -> None:
    """Every certificate of near-uniform rows of ``lengths`` keys holds the exact θ, and is exact."""
    blocks, row_lengths = [], []
    for length in lengths:
        for spread in (0.003, 0.03, 0.1):
            blocks.append(torch.nn.functional.pad(near_uniform_rows(1, length, spread, seed=length), (0, 22 - length)))
            row_lengths.append(length)
    rows = torch.cat(blocks)
    cert = certify(rows, backend=backend)
    for i, row in enumerate(rows):
        theta = theta_fraction(row.tolist())
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), theta, f"L={row_lengths[i]} [{backend}]")
        assert bool(cert.exact[i])


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_near_uniform_rows_against_exact_rationals(backend: str) -> None:
    """n = 9…18, odd and even."""
    check_against_exact_rationals(backend, (9, 12, 15, 17, 18))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_near_uniform_rows_of_21_and_22_keys_against_exact_rationals(backend: str) -> None:
    check_against_exact_rationals(backend, (21, 22))


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_odd_near_uniform_rows_are_exact_at_once(backend: str) -> None:
    """Odd counts without a perfect split: the cardinality bound proves the optimum (25–127 keys)."""
    for length in (25, 41, 63, 127):
        rows = near_uniform_rows(16, length, 0.003, seed=length)
        cert = certify(rows, backend=backend)
        assert bool(cert.exact.all()), f"L={length}: {cert.method_names()}"
        assert {ThetaMethod(int(m)) for m in cert.method} <= CARDINALITY_METHODS | {ThetaMethod.K_ATOM_RELAXATION}


def test_rows_of_25_to_40_keys_against_integer_meet_in_the_middle() -> None:
    """Dyadic near-uniform rows (exact float64 sums): certify and exact agree with the integer oracle."""
    rng = np.random.default_rng(3)
    for length in (25, 27, 31, 34, 37, 40):
        for spread in (0.0, 0.001, 0.02, 0.1):
            ints, exponent = dyadic_near_uniform(length, spread, rng)
            theta = theta_dyadic_meet_in_the_middle(ints, exponent)
            row = torch.tensor([v / 2.0**exponent for v in ints], dtype=torch.float64)
            cert = certify(row, tolerance=1.0)
            assert_certificate_sound(float(cert.lower), float(cert.upper), theta, f"L={length} σ={spread}")
            assert Fraction(float(exact(row, tolerance=1.0))) - theta <= Fraction(2.0**-49)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_long_near_uniform_rows_against_an_independent_local_search(backend: str) -> None:
    """49–127 keys: no local-search split may beat an exact claim (θ_local ≤ upper), and every row reaches
    float32 resolution."""
    rng = np.random.default_rng(4)
    blocks = [near_uniform_rows(1, length, spread, seed=length) for length in (49, 64, 101, 127)
              for spread in (0.003, 0.05)]  # fmt: skip
    rows = torch.cat([torch.nn.functional.pad(b, (0, 127 - b.shape[1])) for b in blocks])
    cert = certify(rows, backend=backend)
    assert bool((cert.width <= 2.0**-25).all()), cert.width.max()
    for i, row in enumerate(rows):
        found = local_search_theta([v for v in row.tolist() if v != 0], rng)
        assert found <= Fraction(float(cert.upper[i])), f"row {i}: a split beats the certified upper bound"


def test_meta_local_search_catches_a_too_low_upper_bound() -> None:
    """An upper bound of s − 4·(half a key)² on an even uniform-like row is beaten by the local search."""
    row = near_uniform_rows(1, 64, 0.05, seed=0)[0].tolist()
    s = sum(Fraction(v) for v in row)
    wrong_upper = s - Fraction(max(row)) ** 2
    assert local_search_theta(row, np.random.default_rng(0)) > wrong_upper


def torch_cardinality_bound(vals_desc: np.ndarray, k_top: int, t: float) -> tuple[float, float]:
    """The torch path's bound on one row, shaped like ``cardinality_relaxation`` (no endpoint: s bounds d*)."""
    from attnsens.theta._torch_path import _cardinality_bound, _subset_sums

    x = torch.tensor(vals_desc, dtype=torch.float64).unsqueeze(0)
    k = min(k_top, x.shape[1])
    sums = _subset_sums(x.topk(k, dim=-1).values)
    return float(_cardinality_bound(x, sums, torch.tensor([t], dtype=torch.float64), k)), float(vals_desc.sum())


def test_torch_cardinality_bound_is_a_bound_and_exact_when_positive() -> None:
    rows = integer_rows(2)
    assert_bound_claims(torch_cardinality_bound, rows)
    for ints in rows:
        vals = np.sort(np.array(ints, dtype=np.float64))[::-1].copy()
        t = 0.5 * float(vals.sum())
        assert torch_cardinality_bound(vals, 8, t)[0] == cardinality_relaxation(vals, 8, t)[0], ints
