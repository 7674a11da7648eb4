"""θ on real attention rows, and the two stages built for them: the three-group cardinality bound and the four-list
search for a perfect split.

The rows are the tiny Pre-LN GPT's attention at checkpoints 0–64 of a training run (near-uniform, 25–63 keys,
float32), stored in ``tests/data/tiny_gpt_early_rows.npz`` by ``tools/real_theta_rows.py``. Exact claims are
checked against integer meet-in-the-middle (n ≤ 40) and brute force (n ≤ 14), longer rows against an independent
local search, and each check is shown to catch a deliberately wrong version of its stage.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from attnsens._float64 import UNIT_ROUNDOFF
from attnsens.theta import ThetaMethod, certify, exact
from attnsens.theta._constants import (
    ERROR_RADIUS_OFFSET,
    ERROR_RADIUS_PER_KEY,
    ERROR_RADIUS_SLACK,
    LOWEST_BIT_MAX_SUPPORT,
)
from attnsens.theta._enclosure import theta_enclosure
from attnsens.theta._numba_cardinality import (
    cardinality_relaxation,
    count_pruned_meet_in_the_middle,
    count_tail_score,
    group_cardinality_bound,
)
from attnsens.theta._numba_four_list import (
    FOUR_LIST_CANDIDATES,
    FOUR_LIST_MARK_BITS_LOG2,
    FOUR_LIST_MAX_PAIRS,
    _by_residue,
    _expected_counts,
    _four_list_modulus,
    _insert_pair_sums,
    _meets_pair_sum,
    _most_promising_targets,
    _reachable_targets,
    four_list_perfect_split,
)
from attnsens.theta._numba_refine import COUNT_MITM_MIN_TAIL
from attnsens.theta._torch_path import _quantum
from attnsens.theta.certificate import STOP_DISTANCE
from tests.helpers.cardinality import assert_bound_claims, best_twice_gap, integer_rows, local_search_theta
from tests.helpers.real_rows import (
    FIXTURE,
    ORACLE_MAX_SUPPORT,
    assert_enumerated_rows_equal_the_oracle,
    dyadic,
    oracle_rows,
    support,
)
from tests.helpers.scan import reference_ulp_float32
from tests.helpers.soundness import assert_certificate_sound
from tests.reference.theta_oracles import theta_dyadic_meet_in_the_middle
from tests.unit.theta.rows import coarse_grid_rows

CLUSTERED_ROW = 39075
"""Index (in the captured tensor) of a real row of two clusters of keys, one of the rows that were left wide."""


@pytest.fixture(scope="module")
def real_rows() -> torch.Tensor:
    return torch.from_numpy(np.load(FIXTURE)["rows"])


def test_fixture_is_the_early_training_regime(real_rows: torch.Tensor) -> None:
    """Near-uniform rows (median p_max·n below 1.5) of every support size 25–63."""
    n = support(real_rows)
    assert set(range(25, 64)) <= set(n.tolist())
    assert float((real_rows.max(-1).values * n).median()) < 1.5


def test_certify_holds_the_exact_theta_of_real_rows(real_rows: torch.Tensor) -> None:
    rows = oracle_rows(real_rows)
    cert = certify(rows)
    for i, row in enumerate(rows):
        theta = theta_dyadic_meet_in_the_middle(*dyadic(row))
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), theta, f"real row {i}")


def test_exact_agrees_with_the_oracle_on_real_rows(real_rows: torch.Tensor) -> None:
    rows = oracle_rows(real_rows)[::3]
    values = exact(rows)
    for i, row in enumerate(rows):
        theta = theta_dyadic_meet_in_the_middle(*dyadic(row))
        assert abs(Fraction(float(values[i])) - theta) <= Fraction(2.0**-49), f"real row {i}"


def test_real_rows_up_to_48_keys_reach_float32_resolution(real_rows: torch.Tensor) -> None:
    """Including the rows the cascade without these stages left up to 4.5·10^-5 wide."""
    rows = real_rows[support(real_rows) <= 48]
    cert = certify(rows)
    assert float(cert.width.max()) <= 2.0**-25, cert.method_names()


def test_most_real_rows_of_33_to_48_keys_are_exact(real_rows: torch.Tensor) -> None:
    """The four-list search proves a perfect split where one exists (nearly every even row of this size); the
    rest keep a float32-resolution interval. Measured: 79 % exact on the full early-training tensor."""
    n = support(real_rows)
    cert = certify(real_rows[(n >= 33) & (n <= 48)])
    methods = {ThetaMethod(int(m)) for m in cert.method}
    assert ThetaMethod.PERFECT_PARTITION in methods
    assert float(cert.exact.float().mean()) >= 0.6, cert.method_names()


def test_real_rows_the_proofs_leave_open_are_enumerated_up_to_26_keys(real_rows: torch.Tensor) -> None:
    """Every row of 25–26 keys is exact in ``certify`` (most of them by meet-in-the-middle after the proofs), and
    equal to the integer oracle."""
    n = support(real_rows)
    rows = real_rows[(n > 24) & (n <= 26)]
    assert rows.shape[0] >= 10
    assert_enumerated_rows_equal_the_oracle(rows, certify(rows, backend="numba"))


def lowest_bit_and_ulp(row: torch.Tensor) -> tuple[Fraction, Fraction]:
    """The lowest set bit over the row's non-zeros (the 2-adic part of their gcd) and the ulp of the smallest."""
    ints, exponent = dyadic(row)
    gcd = math.gcd(*ints)
    return Fraction(gcd & -gcd, 2**exponent), Fraction(reference_ulp_float32(float(row[row > 0].min())))


def grid_optimal_rows(rows: torch.Tensor) -> tuple[list[Fraction], list[bool]]:
    """The oracle's θ of each row, and whether its optimum is a split with 2d equal to the lowest set bit of the
    row's values while that bit is above the ulp of the smallest value (provable only on the coarser grid)."""
    thetas, on_grid = [], []
    for row in rows:
        ints, exponent = dyadic(row)
        theta = theta_dyadic_meet_in_the_middle(ints, exponent)
        lowest_bit, ulp = lowest_bit_and_ulp(row)
        thetas.append(theta)
        on_grid.append(lowest_bit > ulp and Fraction(sum(ints), 2**exponent) - theta == lowest_bit**2)
    return thetas, on_grid


def test_the_lowest_set_bit_proves_splits_the_ulp_cannot() -> None:
    """Rows of 25–32 keys whose values are all multiples of twice the ulp of the smallest: every subset sum lies on
    the grid of the lowest set bit q, so a split with 2d = q is optimal although 2d exceeds the ulp. Every
    certificate holds the oracle's θ, and most rows whose optimum is such a split are proved exact (none were with
    the ulp as quantum). With a quantum twice the lowest bit, 20 of these 120 certificates exclude θ."""
    rows = coarse_grid_rows(120, (25, 32), 0.3, seed=0)
    cert = certify(rows)
    thetas, on_grid = grid_optimal_rows(rows)
    for i, theta in enumerate(thetas):
        assert_certificate_sound(float(cert.lower[i]), float(cert.upper[i]), theta, f"coarse-grid row {i}")
    proved = [bool(cert.exact[i]) for i in range(len(rows)) if on_grid[i]]
    assert len(proved) >= 20
    assert sum(proved) >= 0.5 * len(proved), cert.method_names()


def test_torch_quantum_is_the_lowest_set_bit_up_to_128_keys() -> None:
    """The torch and device paths take the same quantum as the CPU kernels: the lowest set bit over rows of at most
    LOWEST_BIT_MAX_SUPPORT non-zeros, the ulp of the smallest value beyond (when that ulp proves the sums)."""
    rows = torch.cat([coarse_grid_rows(8, (25, 32), 0.3, seed=1), torch.zeros(8, 200)], dim=1)
    rows = torch.cat([rows, coarse_grid_rows(8, (150, 232), 0.3, seed=2)])
    x = rows.to(torch.float64)
    q = _quantum(x, x > 0, x.sum(-1), (x > 0).sum(-1), exact_quantum=False)
    for i, row in enumerate(rows):
        lowest_bit, ulp = lowest_bit_and_ulp(row)
        assert lowest_bit > ulp
        n = int((row > 0).sum())
        assert Fraction(float(q[i])) == (lowest_bit if n <= LOWEST_BIT_MAX_SUPPORT else ulp), f"row {i}, {n} keys"


def test_long_real_rows_against_an_independent_local_search(real_rows: torch.Tensor) -> None:
    rows = real_rows[support(real_rows) > 48]
    cert = certify(rows)
    rng = np.random.default_rng(0)
    for i, row in enumerate(rows):
        found = local_search_theta([v for v in row.tolist() if v != 0], rng, restarts=1)
        assert found <= Fraction(float(cert.upper[i])), f"row {i}: a split beats the certified upper bound"


# The three-group cardinality bound.


def clustered_rows(seed: int) -> list[list[int]]:
    """Integer rows of 6–14 values in two or three clusters (a block of similar keys beside a smaller block)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in range(6, 15):
        for low in (0.3, 0.55):
            n_low = max(1, n // 4)
            high = np.round(1000 * (1 + 0.02 * rng.standard_normal(n - n_low))).clip(1)
            small = np.round(1000 * low * (1 + 0.05 * rng.standard_normal(n_low))).clip(1)
            rows.append([int(v) for v in np.concatenate([high, small])])
        rows.append([int(v) for v in np.round(1000 * np.repeat([1.0, 0.6, 0.25], [n - 3, 2, 1]))])
    return rows


def group_stage(vals_desc: np.ndarray, k_top: int, t: float) -> tuple[float, float]:
    return group_cardinality_bound(vals_desc, t)


def wrong_group_bound_endpoints_only(vals_desc: np.ndarray, k_top: int, t: float) -> tuple[float, float]:
    """A plausible bug: each count's interval treated as its two endpoints, so t inside an interval is missed."""
    n = vals_desc.size
    best = np.inf
    for k in range(n + 1):
        for end in (vals_desc[n - k :].sum(), vals_desc[:k].sum()):
            best = min(best, abs(t - end))
    return best, best


def test_group_bound_is_a_bound_and_exact_when_positive() -> None:
    rows = integer_rows(5) + clustered_rows(0)
    assert_bound_claims(group_stage, rows)
    clustered = clustered_rows(1)
    claimed = sum(
        group_cardinality_bound(np.sort(np.array(r, float))[::-1].copy(), 0.5 * sum(r))[0] > 0 for r in clustered
    )
    assert claimed >= len(clustered) // 4  # not vacuous: clustered rows are settled by it


def test_meta_group_bound_check_catches_a_wrong_bound() -> None:
    with pytest.raises(AssertionError):
        assert_bound_claims(wrong_group_bound_endpoints_only, integer_rows(5) + clustered_rows(0))


def test_group_bound_proves_a_clustered_real_row_exactly(real_rows: torch.Tensor) -> None:
    """A real 36-key row of 29 keys near 1.1/n and 7 near 0.57/n: d* = 2.9·10^-3, no split is near-perfect."""
    source = np.load(FIXTURE)["source_index"]
    row = real_rows[int(np.flatnonzero(source == CLUSTERED_ROW)[0])]
    vals = np.sort(row[row > 0].double().numpy())[::-1].copy()
    d_lb, d_end = group_cardinality_bound(vals, 0.5 * vals.sum())
    theta = theta_dyadic_meet_in_the_middle(*dyadic(row))
    assert d_lb > 1e-3 and d_lb == d_end
    assert sum(Fraction(v) for v in row.tolist()) - 4 * Fraction(d_lb) ** 2 == theta


# The four-list search for a perfect split.


def near_uniform_integers(n: int, spread: float, rng: np.random.Generator, scale: int = 2**20) -> np.ndarray:
    return np.maximum(1, np.round(scale * (1 + spread * rng.standard_normal(n)))).astype(np.float64)


def twice_optimal_gap(values: np.ndarray) -> int:
    """min_S |2·Σ_S − Σ| of integer values by the meet-in-the-middle oracle."""
    ints = [int(v) for v in values]
    return math.isqrt(int(sum(ints) - theta_dyadic_meet_in_the_middle(ints, 0)))


def assert_four_list_claims(search, rows: list[np.ndarray]) -> int:
    """A finite result must be the distance of a real perfect split (2d* ≤ 1 in units of q = 1, and d = d*);
    returns how many rows it settled."""
    found = 0
    for values in rows:
        vals = np.sort(values)[::-1].copy()
        d = search(vals, 1.0)
        if np.isfinite(d):
            found += 1
            twice = twice_optimal_gap(vals)
            assert twice <= 1 and 2 * d == twice, f"n={vals.size}: claimed 2d={2 * d}, true 2d*={twice}"
    return found


def wrong_four_list_residues_only(vals_desc: np.ndarray, q: float) -> float:
    """A plausible bug: a residue match (mod M) taken for an exact match, so every row 'has' a perfect split."""
    total = int(sum(int(v / q) for v in vals_desc))
    return 0.5 * q * (total % 2)


def no_perfect_split_rows(rng: np.random.Generator) -> list[np.ndarray]:
    """Multiples of 4 whose total is 4·odd: every subset sum ≡ 0 (mod 4) but half the total ≡ 2, so 2d* ≥ 4."""
    rows = []
    for n in (33, 34, 35, 36):
        values = 4 * near_uniform_integers(n, 0.05, rng, scale=2**18)
        if int(values.sum() / 4) % 2 == 0:
            values[0] += 4
        rows.append(values)
    return rows


def test_four_list_finds_only_real_perfect_splits() -> None:
    rng = np.random.default_rng(7)
    rows = [near_uniform_integers(n, spread, rng) for n in (33, 34, 35, 36) for spread in (0.01, 0.1, 0.3)]
    rows += no_perfect_split_rows(rng)
    found = assert_four_list_claims(four_list_perfect_split, rows)
    assert found >= len(rows) // 2  # not vacuous: near-uniform rows of this size nearly always have one


def test_four_list_finds_nothing_where_no_perfect_split_exists() -> None:
    for values in no_perfect_split_rows(np.random.default_rng(8)):
        assert four_list_perfect_split(np.sort(values)[::-1].copy(), 1.0) == np.inf


def test_meta_four_list_check_catches_a_residue_only_match() -> None:
    with pytest.raises(AssertionError):
        assert_four_list_claims(wrong_four_list_residues_only, no_perfect_split_rows(np.random.default_rng(9)))


def test_four_list_settles_long_rows_with_greedy_targets() -> None:
    """41–48 values: 40 go to the lists, the larger rest fix the targets; every near-uniform row gets a split."""
    rng = np.random.default_rng(10)
    for n in (41, 44, 48):
        vals = np.sort(near_uniform_integers(n, 0.1, rng))[::-1].copy()
        d = four_list_perfect_split(vals, 1.0)
        assert 2 * d == int(vals.sum()) % 2, n


ROWS_THE_SHORT_SEARCH_MISSED = {38: 31, 125: 45}
"""Fixture rows (index: keys) whose perfect split the search with four targets and ``FOUR_LIST_WORK`` alone did not
find. The 31-key row needs the 64 targets or the longer budget, the 45-key row both."""


@pytest.mark.parametrize("index", sorted(ROWS_THE_SHORT_SEARCH_MISSED))
def test_four_list_finds_the_splits_that_need_more_targets_or_residues(real_rows: torch.Tensor, index: int) -> None:
    """The row of 31 keys is also checked against the integer oracle."""
    integers, exponent = dyadic(real_rows[index])
    q = math.ldexp(1.0, -exponent)
    vals = np.sort(np.array(integers, dtype=np.float64))[::-1].copy()
    assert vals.size == ROWS_THE_SHORT_SEARCH_MISSED[index]
    d = four_list_perfect_split(vals * q, q)
    assert np.isfinite(d) and 2 * d == q * (int(vals.sum()) % 2), d
    if vals.size <= ORACLE_MAX_SUPPORT:
        assert twice_optimal_gap(vals) == int(vals.sum()) % 2


def test_brute_force_agrees_with_the_integer_oracle() -> None:
    """The two oracles the tests above lean on agree on small rows."""
    rng = np.random.default_rng(11)
    for n in (5, 9, 12):
        values = near_uniform_integers(n, 0.2, rng, scale=1000)
        assert best_twice_gap([int(v) for v in values]) == twice_optimal_gap(values)


SMOLLM2_ROW = Path(__file__).resolve().parents[2] / "data" / "smollm2_wide_row.npz"
"""One row of SmolLM2-135M's attention on the first 512 tokens of the Shakespeare corpus (row 128,939 of all
138,240: 428 keys, p_max 0.42, sums with rounding), the one row of that audit wider than 2^-25 when refinement
stopped at d ≤ 2^-13.5 exactly."""


def test_every_real_row_reaches_float32_resolution(real_rows: torch.Tensor) -> None:
    """Every fixture row, of 25–63 keys, within 2^-25 by default: the 63-key near-uniform row on which exchanges
    and CKK stall (3.2·10^-8 wide before the last cardinality-pruned search) included."""
    cert = certify(real_rows)
    width = cert.upper - cert.lower
    assert float(width.max()) <= 2.0**-25, f"widest row {int(width.argmax())}: {float(width.max()):.3g}"


def test_stop_distance_leaves_room_for_the_error_radius() -> None:
    """A row whose sums carry rounding (E > 0) and whose best split lies just within the stop distance fits in
    2^-25 only because that distance is a relative 2^-12 below 2^-13.5: with this real row's sum and error radius,
    a split at 2^-13.5 itself encloses θ in an interval wider than 2^-25. (The cascade settled this row at the
    margin before the binade first-fit; it now ends far below it.)"""
    row = torch.from_numpy(np.load(SMOLLM2_ROW)["rows"])
    cert = certify(row)
    assert float(cert.upper - cert.lower) <= 2.0**-25
    s = float(cert.row_sum[0])
    n = int((row > 0).sum())
    err = (ERROR_RADIUS_PER_KEY * n + ERROR_RADIUS_OFFSET) * UNIT_ROUNDOFF * s * ERROR_RADIUS_SLACK

    def width_at(d: float) -> float:
        as_row = functools.partial(torch.tensor, dtype=torch.float64)
        lower, upper = theta_enclosure(as_row([s]), as_row([d]), as_row([0.0]), as_row([err]))
        return float(upper[0] - lower[0])

    assert width_at(STOP_DISTANCE["float32"]) <= 2.0**-25
    assert width_at(2.0**-13.5) > 2.0**-25  # the row is one the margin is for


# The torch path's form of the three-group bound.


def torch_group_stage(vals_desc: np.ndarray, k_top: int, t: float) -> tuple[float, float]:
    """The torch form on one row; its only claim is d_lb (the upper end is the row's total, always valid)."""
    from attnsens.theta._torch_path import _group_cardinality_bound

    row = torch.from_numpy(vals_desc).unsqueeze(0)
    d_lb = _group_cardinality_bound(row, torch.tensor([t], dtype=torch.float64), min(48, vals_desc.size))
    return float(d_lb[0]), float(vals_desc.sum())


def test_torch_group_bound_is_a_bound_and_exact_when_positive() -> None:
    assert_bound_claims(torch_group_stage, integer_rows(5) + clustered_rows(0))


def test_torch_group_bound_equals_the_numba_bound(real_rows: torch.Tensor) -> None:
    """Bit for bit, on the real rows of ≤ 48 keys and on clustered integer rows: the same cuts (first of equal
    gaps), the same prefix sums and the same order of addition."""
    from attnsens.theta._torch_path import _group_cardinality_bound

    rows = real_rows[support(real_rows) <= 48].double()
    clustered = [torch.tensor(r + [0] * (64 - len(r)), dtype=torch.float64) for r in clustered_rows(2)]
    rows = torch.cat([rows, torch.stack(clustered)])
    t = 0.5 * rows.sum(-1)
    got = _group_cardinality_bound(rows, t, 48)
    descending = [np.sort(r[r > 0].numpy())[::-1].copy() for r in rows]
    want = [group_cardinality_bound(vals, float(h))[0] for vals, h in zip(descending, t, strict=True)]
    assert torch.equal(got, torch.tensor(want, dtype=torch.float64))
    assert int((got > 0).sum()) >= 20  # not vacuous


def test_torch_path_proves_the_clustered_real_row(real_rows: torch.Tensor) -> None:
    source = np.load(FIXTURE)["source_index"]
    row = real_rows[int(np.flatnonzero(source == CLUSTERED_ROW)[0])]
    cert = certify(row, backend="torch")
    assert bool(cert.exact) and int(cert.method) == ThetaMethod.CARDINALITY_BOUND
    theta = theta_dyadic_meet_in_the_middle(*dyadic(row))
    assert_certificate_sound(float(cert.lower), float(cert.upper), theta, "clustered row, torch path")


# The count-pruned meet-in-the-middle.


def odd_tail_rows(rng: np.random.Generator) -> list[np.ndarray]:
    """Near-uniform integer rows of an odd count (t = s/2 in the tail of the sums of the two middle counts), the
    regime the count-pruned search is for, at spreads where the cardinality bound leaves some open."""
    return [near_uniform_integers(n, spread, rng, scale=2**16) for n in (25, 27, 29, 31, 35) for spread in (0.03, 0.06)]


def assert_count_search_claims(search, rows: list[np.ndarray]) -> int:
    """Whenever the search claims a proof, its d is d* (integer meet-in-the-middle oracle); it is started from
    the distance of a real split (the sorted greedy one). Returns the number of proofs."""
    proved = 0
    for values in rows:
        vals = np.sort(values)[::-1].copy()
        t = 0.5 * float(vals.sum())
        greedy = 0.0
        for v in vals:
            greedy += v if greedy + v <= t else 0.0
        d, claimed = search(vals, t, t - greedy, 2_000_000)
        if claimed:
            proved += 1
            twice = twice_optimal_gap(vals)
            assert 2 * Fraction(d) == twice, f"n={vals.size}: claimed 2d={2 * d}, true 2d*={twice}"
    return proved


def wrong_count_search_trusting_a_shorter_distance(vals_desc: np.ndarray, t: float, d_found: float, budget: int):
    """A plausible bug in a caller: the window narrowed far below the distance of the split actually found, so when
    nothing lies within it the search 'proves' the found distance, which is not optimal."""
    narrow = d_found * 2.0**-30
    d, proved = count_pruned_meet_in_the_middle(vals_desc, t, narrow, budget)
    return (d_found, proved) if d == narrow else (d, proved)


def test_count_pruned_search_proves_real_optima() -> None:
    rows = odd_tail_rows(np.random.default_rng(3))
    rows += [near_uniform_integers(n, 0.05, np.random.default_rng(n), scale=2**16) for n in (26, 30)]
    proved = assert_count_search_claims(count_pruned_meet_in_the_middle, rows)
    assert proved == len(rows)  # with a large budget every row is proved


def test_meta_count_search_check_catches_a_narrowed_window() -> None:
    with pytest.raises(AssertionError):
        rows = odd_tail_rows(np.random.default_rng(3))
        assert_count_search_claims(wrong_count_search_trusting_a_shorter_distance, rows)


def test_count_pruned_search_lists_few_sums_on_odd_real_rows(real_rows: torch.Tensor) -> None:
    """The real odd rows of 25–36 keys without a perfect split whose target lies in the tail of its count (the
    cardinality bound settles none of them): the search proves each within 100,000 nodes, at least half within
    the 5,000 that ``certify`` gives it, and agrees with the oracle every time."""
    n = support(real_rows)
    rows = oracle_rows(real_rows[(n % 2 == 1) & (n <= ORACLE_MAX_SUPPORT)])
    tried = quick = 0
    for row in rows:
        vals = np.sort(row[row > 0].double().numpy())[::-1].copy()
        t = 0.5 * vals.sum()
        if count_tail_score(vals, t) < COUNT_MITM_MIN_TAIL or cardinality_relaxation(vals, 8, t)[0] > 0:
            continue
        theta = theta_dyadic_meet_in_the_middle(*dyadic(row))
        if sum(Fraction(v) for v in row.tolist()) == theta:  # a perfect split: the four-list search's rows
            continue
        tried += 1
        quick += count_pruned_meet_in_the_middle(vals, t, 2.0**-13.5, 5_000)[1]
        d, claimed = count_pruned_meet_in_the_middle(vals, t, 2.0**-13.5, 100_000)
        assert claimed
        assert sum(Fraction(v) for v in row.tolist()) - 4 * Fraction(d) ** 2 == theta
    assert tried >= 8 and 2 * quick >= tried, (tried, quick)


def test_four_list_estimate_counts_subsets_count_by_count() -> None:
    """The four-list search sizes its modulus and decides whether to run from the expected number of subsets with
    sum exactly T. On near-uniform values it must match the true count at a count's centre and be ≈ 0 between
    two counts' bumps, where one Gaussian over all subset sums is wrong both ways (7× too low at a centre, > 10
    between bumps where there are none)."""
    rng = np.random.default_rng(3)
    values = rng.integers(9_600, 10_400, 20).astype(np.int64)  # ±4 %: the early-training rows' spread
    sums = np.zeros(1, np.int64)
    for v in values:
        sums = np.concatenate([sums, sums + v])
    mean = float(values.mean())
    spread = 0.5 * math.sqrt(float((values.astype(float) ** 2).sum()))
    for k in (8.0, 10.0, 10.5, 11.5):
        target = round(k * mean)
        window = 200
        true = float(((sums >= target - window) & (sums <= target + window)).sum()) / (2 * window + 1)
        estimate = _expected_counts(values, np.array([target], np.int64))[0]
        one_gaussian = 2.0**values.size / (math.sqrt(2 * math.pi) * spread)
        one_gaussian *= math.exp(-0.5 * ((target - values.sum() / 2) / spread) ** 2)
        if k == int(k):
            assert true > 50 and abs(estimate / true - 1.0) < 0.25, (k, true, estimate)
        else:
            assert true == 0.0 and estimate < 0.01 < 10.0 < one_gaussian, (k, estimate, one_gaussian)


def reference_expected_count(values: np.ndarray, target: int) -> float:
    """``_expected_counts`` term by term in Python floats, every count k = 1 … m − 1 included (no cut-off)."""
    m = values.size
    mean = float(values.mean())
    variance = float(((values.astype(float) - mean) ** 2).sum()) / (m - 1)
    total = 0.0
    for k in range(1, m):
        sigma = math.sqrt(k * (m - k) / m * variance)
        if sigma > 0.0:
            z = (target - k * mean) / sigma
            total += math.comb(m, k) * math.exp(-0.5 * z * z) / (math.sqrt(2 * math.pi) * sigma)
    return total


def test_four_list_estimate_leaves_out_only_counts_that_add_nothing() -> None:
    """The estimate takes an exp only for the counts within ``EXPECTED_COUNT_Z`` spreads of the target: on
    near-uniform, spread and tiny values, at and between the bumps, it equals the sum over every count."""
    rng = np.random.default_rng(17)
    families = [
        rng.integers(9_600, 10_400, 24),  # near-uniform (early training)
        (2.0 ** rng.uniform(0, 30, 30)).astype(np.int64) + 1,  # many binades (a pretrained model's rows)
        rng.integers(1, 50, 12),  # small integers: sums crowd, spreads of a few units
    ]
    compared = 0
    for values in families:
        values = np.sort(values.astype(np.int64))[::-1].copy()
        mean = float(values.mean())
        targets = np.array(
            [round(k * mean) for k in (1.0, 3.5, values.size / 2, values.size / 2 + 0.5, values.size - 1.5)], np.int64
        )
        estimates = _expected_counts(values, targets)
        for target, estimate in zip(targets.tolist(), estimates.tolist(), strict=True):
            reference = reference_expected_count(values, target)
            assert estimate == pytest.approx(reference, rel=1e-9, abs=1e-12), (target, estimate, reference)
            compared += reference > 1.0
    assert compared >= 6  # most targets have many subsets: the comparison is not of zeros


def test_four_list_keeps_exactly_the_targets_whose_residue_a_subset_sum_reaches() -> None:
    """A target's residue modulo 64 must be one that some subset sum of the searched values has, or no subset hits
    it. Values of which only a few are odd multiples of small powers of two (a row's smallest keys beside larger
    ones in coarser binades) reach few residues; every target that is a real subset sum is kept, and exactly
    the targets whose residue no subset reaches are dropped (brute force over all 2^14 subsets)."""
    rng = np.random.default_rng(23)
    coarse = rng.integers(1 << 10, 1 << 12, 11) * 64  # multiples of 64: they add nothing to the residues
    fine = np.array([3, 10, 17])  # subset sums ≡ 0, 3, 10, 13, 17, 20, 27, 30 (mod 64)
    values = np.concatenate([coarse, fine]).astype(np.int64)
    sums = np.zeros(1, np.int64)
    for v in values:
        sums = np.concatenate([sums, sums + v])
    reached = set((sums % 64).tolist())
    assert len(reached) == 8
    hits = rng.choice(sums, 40)
    misses = rng.integers(0, int(values.sum()), 200)
    targets = np.concatenate([hits, misses, [-1, int(values.sum()) + 1]]).astype(np.int64)
    kept = _reachable_targets(values, targets.copy())
    assert set(hits.tolist()) <= set(kept.tolist())
    expected = [int(t) for t in targets if 0 <= t <= values.sum() and int(t) % 64 in reached]
    assert kept.tolist() == expected
    assert len(expected) < 0.5 * targets.size  # most random targets are dropped: the filter is not a no-op


def best_target_prefix(expected: list[float]) -> int:
    """Reference for ``_most_promising_targets``: the k (targets in decreasing order of expected count) with the
    most expected splits per pass, Σ E_i / (1 + k); the first of equal rates."""
    ranked = sorted(expected, reverse=True)
    rates = [sum(ranked[:k]) / (1 + k) for k in range(1, len(ranked) + 1)]
    return 1 + rates.index(max(rates))


def test_four_list_searches_the_targets_with_the_most_splits_per_pass() -> None:
    """The search pays one pass per target per residue on top of the pass that stores the left pair sums, so it
    takes the targets in decreasing order of their expected counts while the splits per pass still grow; targets
    outside [0, Σ searched] hold no subset and are never taken."""
    rng = np.random.default_rng(11)
    values = rng.integers(9_000, 11_000, 24).astype(np.int64)
    centre = int(values.sum()) // 2
    mean = float(values.mean())
    cases = [
        [centre, centre + 1, centre - 1, centre + 2],  # four near the centre: all worth a pass
        [centre, round(centre + 0.5 * mean), round(centre - 0.5 * mean), centre + 3],  # two between bumps
        [centre, -5, int(values.sum()) + 5, round(centre + 0.5 * mean)],  # two unreachable
    ]
    taken_counts = []
    for targets in cases:
        t = np.array(targets, np.int64)
        expected = [
            _expected_counts(values, t[k : k + 1])[0] if 0 <= t[k] <= values.sum() else 0.0 for k in range(t.size)
        ]
        chosen, chosen_expected, best = _most_promising_targets(values, t)
        k = best_target_prefix(expected)
        ranked = sorted(range(t.size), key=lambda i: -expected[i])
        assert sorted(chosen.tolist()) == sorted(t[ranked[:k]].tolist()), (targets, expected, chosen)
        assert best == max(expected)
        assert chosen_expected == pytest.approx(sum(sorted(expected, reverse=True)[:k]))
        assert all(0 <= c <= values.sum() for c in chosen.tolist())
        taken_counts.append(chosen.size)
    assert taken_counts == [4, 2, 1], taken_counts  # all four; the two at bump centres; the one reachable centre


def test_meta_target_choice_check_catches_taking_every_target() -> None:
    """The reference above would reject a search that always takes every target."""
    expected = [40.0, 2.0, 1.0, 0.5]
    assert best_target_prefix(expected) == 1 != len(expected)


def pair_sums_of_residue(left: np.ndarray, right: np.ndarray, modulus: int, residue: int) -> set[int]:
    return {int(x + y) for x in left for y in right if (x + y) % modulus == residue}


@pytest.mark.parametrize("filter_bits", ["sized", "all set"])
def test_four_list_lookup_finds_every_match_a_set_finds(filter_bits: str) -> None:
    """``_meets_pair_sum`` against Python sets over random lists, for targets that do and do not meet a stored pair
    sum. With every filter bit set each wanted sum is a candidate, so the candidate block fills and is probed many
    times over in one call (a lookup that dropped a full block's candidates would miss the later matches)."""
    rng = np.random.default_rng(11)
    modulus, log_size = 13, 11  # about 315 pair sums a residue, at least 4 slots each as in the search
    shift = 64 - log_size
    lists = [np.sort(rng.integers(0, 1 << 20, 64)) for _ in range(4)]
    residues = [a % modulus for a in lists]
    grouped = [_by_residue(lists[k], residues[k], modulus) for k in (1, 3)]
    table = np.empty(1 << log_size, np.int64)
    used = np.zeros(1 << log_size, np.int64)
    marks = np.empty(1 << (log_size + FOUR_LIST_MARK_BITS_LOG2 - 6), np.uint64)
    candidates = np.empty(FOUR_LIST_CANDIDATES, np.int64)
    # Every target below has the residue of the stored sums, so the lookup pairs them with right sums ≡ 0.
    right = sorted(pair_sums_of_residue(lists[2], lists[3], modulus, 0))
    checked = 0
    for stamp, residue in enumerate(range(modulus), start=1):
        marks[:] = 0
        assert _insert_pair_sums(lists[0], residues[0], *grouped[0], modulus, residue, table, used, stamp, shift, marks)
        if filter_bits == "all set":
            marks[:] = np.iinfo(np.uint64).max
        stored = pair_sums_of_residue(lists[0], lists[1], modulus, residue)
        # Two targets met by construction (the last and first right sums with a stored sum), and random ones, each
        # moved to residue ``residue``.
        for target in [right[-1] + min(stored), right[0] + max(stored), *rng.integers(0, 1 << 22, 8)]:
            target = int(target) - int(target) % modulus + residue
            expected = any(target - y in stored for y in right)
            found = _meets_pair_sum(lists[2], residues[2], *grouped[1], modulus, 0, target, table, used, stamp, shift,
                                    marks, candidates)  # fmt: skip
            assert found == expected, (residue, target)
            checked += expected
    assert checked >= modulus  # the matches placed at the ends of the right list are found in every residue


POWERS_OF_TWO_ROW = [2.0**-k for k in (8, 8, 5, 8, 6, 8, 5, 7, 5, 8, 4, 4, 6, 8, 7, 8, 3, 4, 4, 8, 3, 3, 6, 3, 4)]
"""25 keys, each a power of two, summing to 1 (softmax of integer multiples of log 2): millions of perfect splits
among the four lists' 2^24 subsets, but only 4,096 pair sums a list."""


def powers_of_two_row(n_keys: int) -> torch.Tensor:
    """``POWERS_OF_TWO_ROW`` with two 2^-8 merged (24 keys) or one or two 2^-3 halved (26, 27 keys): sum still 1."""
    exponents = [round(-math.log2(v)) for v in POWERS_OF_TWO_ROW]
    if n_keys == 24:
        exponents.remove(8)
        exponents[exponents.index(8)] = 7
    for _ in range(n_keys - 25):
        exponents.remove(3)
        exponents += [4, 4]
    row = torch.tensor([2.0**-k for k in exponents], dtype=torch.float32)
    assert row.numel() == n_keys and float(row.double().sum()) == 1.0
    return row


def test_four_list_modulus_never_exceeds_the_pair_sums() -> None:
    """M > pair_count left pair lists of no sums and divided by zero (a crash of ``certify`` on such rows)."""
    for group in range(6, 11):
        pair_count = 1 << (2 * group)
        for expected in (0.5, 100.0, 5_000.0, 1e6, 1e12):
            modulus = _four_list_modulus(expected, pair_count)
            assert 2 <= modulus <= pair_count and pair_count // modulus <= FOUR_LIST_MAX_PAIRS


@pytest.mark.parametrize("n_keys", [24, 25, 26, 27])
def test_rows_of_small_powers_of_two_are_certified(n_keys: int) -> None:
    row = powers_of_two_row(n_keys)
    vals = np.sort(row.double().numpy())[::-1].copy()
    q = float(vals.min())  # every value a multiple of the smallest, a power of two
    assert 2 * four_list_perfect_split(vals, q) == 0.0  # the total, 1, is an even multiple of q
    theta = theta_dyadic_meet_in_the_middle(*dyadic(row))
    for cert in (certify(row[None]), certify(row[None], exact_support=34)):
        assert_certificate_sound(float(cert.lower[0]), float(cert.upper[0]), theta, f"{n_keys} powers of two")
        assert bool(cert.exact[0])
