"""The pruned meet-in-the-middle (``_numba_enumeration.pruned_meet_in_the_middle``), the cascade's enumeration, and
the cascade on SmolLM2's short rows.

It lists, of the subsets of the larger values, only the sums that can still end within a known distance of t, so
its claim is: the result is min(d_known, d*). Checked on SmolLM2's real rows of 25–40 keys
(``tests/data/smollm2_short_rows.npz``, from ``tools/smollm2_short_rows.py``: values over many binades, where the
pruning cuts most), on the tiny GPT's near-uniform rows (where it cuts little), on synthetic rows against
brute force, and on rows whose sums carry rounding; each check is shown to catch a narrowed window.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from attnsens.theta._numba_enumeration import mitm_workspace, pruned_meet_in_the_middle
from attnsens.theta._numba_partition import karmarkar_karp, meet_in_the_middle
from tests.helpers.cardinality import best_twice_gap
from tests.helpers.real_rows import dyadic
from tests.reference.theta_oracles import best_twice_gap_dyadic
from tests.unit.theta.rows import error_radius as kernel_error_radius
from tests.unit.theta.rows import sums_error_free

DATA = Path(__file__).resolve().parents[2] / "data"
ORACLE_MAX_SUPPORT = 34
"""Real rows up to this many keys are checked against the integer oracle (2^17 sums a half)."""


def nonzero_rows(name: str) -> list[np.ndarray]:
    rows = np.load(DATA / name)["rows"]
    return [row[row > 0] for row in rows]


def exact_distance(values: np.ndarray) -> Fraction:
    """d* = min_S |p(S) − s/2| of the stored values, exactly (integer meet-in-the-middle)."""
    ints, exponent = dyadic(torch.from_numpy(values))
    return Fraction(best_twice_gap_dyadic(ints), 2 ** (exponent + 1))


def brute_force_distance(values: np.ndarray) -> Fraction:
    """d* by all 2^n subsets of the values as exact integers (n ≤ 16)."""
    ints, exponent = dyadic(torch.from_numpy(values))
    return Fraction(best_twice_gap(ints), 2 ** (exponent + 1))


def error_radius(values: np.ndarray) -> float:
    """The documented E of a row: 0 when its sums are error-free, else (2n + 16)·u·s with the kernels' slack."""
    row = torch.from_numpy(values)
    return 0.0 if sums_error_free(row) else kernel_error_radius(row)


def run(search, values: np.ndarray, d_known: float) -> float:
    vals = np.sort(values.astype(np.float64))[::-1].copy()
    t = 0.5 * float(vals.sum())
    return search(vals, t, d_known, 2.0 * error_radius(values), mitm_workspace(vals.size))


def assert_min_of_known_and_optimum(search, rows: list[np.ndarray], oracle, windows=("kk", "tight", "below")) -> int:
    """For each row and each known distance — the Karmarkar–Karp split's, d* itself, half of d* — the search returns
    min(d_known, d*) within the row's error radius (exactly where sums are error-free). Returns the rows checked."""
    for values in rows:
        d_star = oracle(values)
        e = error_radius(values)
        vals = np.sort(values.astype(np.float64))[::-1].copy()
        known = {"kk": karmarkar_karp(vals), "tight": float(d_star), "below": float(d_star) / 2}
        for window in windows:
            d = run(search, values, known[window])
            expected = min(Fraction(known[window]), d_star)
            assert abs(Fraction(d) - expected) <= Fraction(e), (values.size, window, d, float(d_star), e)
    return len(rows)


def narrowed_window(vals_desc, t, d_known, margin, workspace):
    """A plausible bug: the window far narrower than the known distance, so the subsets between — the optimum
    among them — are dropped, and d_known is returned as if nothing were nearer."""
    narrow = d_known * 2.0**-30
    d = pruned_meet_in_the_middle(vals_desc, t, narrow, margin, workspace)
    return d_known if d == narrow else d


def oracle_rows(name: str, max_support: int) -> list[np.ndarray]:
    """The fixture's rows of at most ``max_support`` keys whose integers the oracle holds in int64."""
    rows = [v for v in nonzero_rows(name) if v.size <= max_support]
    return [v for v in rows if max(dyadic(torch.from_numpy(v))[0]) * v.size < 2**46]


def test_real_smollm2_rows_against_the_integer_oracle() -> None:
    rows = oracle_rows("smollm2_short_rows.npz", ORACLE_MAX_SUPPORT)
    assert assert_min_of_known_and_optimum(pruned_meet_in_the_middle, rows, exact_distance) >= 40


def test_real_tiny_gpt_rows_against_the_integer_oracle() -> None:
    rows = oracle_rows("tiny_gpt_early_rows.npz", 30)
    assert assert_min_of_known_and_optimum(pruned_meet_in_the_middle, rows[::2], exact_distance) >= 10


def test_meta_oracle_check_catches_a_narrowed_window() -> None:
    rows = oracle_rows("smollm2_short_rows.npz", 28)
    with pytest.raises(AssertionError):
        assert_min_of_known_and_optimum(narrowed_window, rows, exact_distance, windows=("kk",))


@pytest.mark.parametrize("spread_binades", [2, 12, 30])
def test_synthetic_rows_against_brute_force(spread_binades: int) -> None:
    """Values log-uniform over a few to thirty binades, n = 1–15, as float32 (error-free sums)."""
    rng = np.random.default_rng(spread_binades)
    rows = []
    for n in range(1, 16):
        for _ in range(3):
            values = np.exp2(-spread_binades * rng.random(n)).astype(np.float32)
            rows.append((values / values.sum(dtype=np.float32)).astype(np.float32))
    assert assert_min_of_known_and_optimum(pruned_meet_in_the_middle, rows, brute_force_distance) == 45


def test_rows_whose_sums_carry_rounding_stay_within_the_error_radius() -> None:
    """Values over 60–80 binades: the sums are not float64-exact, and the margin keeps every subset the window
    could lose in real numbers; the result is within E of the exact d*."""
    rng = np.random.default_rng(7)
    rows = []
    for n in (5, 9, 12, 14):
        for _ in range(4):
            values = np.exp2(-(60 + 20 * rng.random()) * rng.random(n)) * (1 + rng.random(n))
            values[rng.integers(n)] = 2.0**-70  # one value far below the others' ulp
            rows.append(values / values.sum())
    assert all(error_radius(v) > 0 for v in rows)
    assert assert_min_of_known_and_optimum(pruned_meet_in_the_middle, rows, brute_force_distance) == 16


def test_meta_brute_force_check_catches_a_narrowed_window() -> None:
    rng = np.random.default_rng(12)
    rows = [(lambda v: (v / v.sum()).astype(np.float32))(np.exp2(-12 * rng.random(n))) for n in range(8, 16)]
    with pytest.raises(AssertionError):
        assert_min_of_known_and_optimum(narrowed_window, rows, brute_force_distance, windows=("kk",))


def test_edge_sizes() -> None:
    empty = np.zeros(0)
    assert pruned_meet_in_the_middle(empty, 0.0, np.inf, 0.0, mitm_workspace(0)) == 0.0
    assert pruned_meet_in_the_middle(np.array([0.5]), 0.25, np.inf, 0.0, mitm_workspace(1)) == 0.25
    assert pruned_meet_in_the_middle(np.array([0.5, 0.5]), 0.5, np.inf, 0.0, mitm_workspace(2)) == 0.0
    # A known distance below d*: nothing is nearer, and the search says so by returning it.
    assert pruned_meet_in_the_middle(np.array([0.75, 0.25]), 0.5, 0.125, 0.0, mitm_workspace(2)) == 0.125


def test_the_cascade_enumeration_reuses_a_workspace_and_matches_fresh_buffers() -> None:
    """``meet_in_the_middle`` (the cascade's entry point) on real rows in one shared workspace: each row's optimum,
    whatever a longer row left in the buffers."""
    rows = sorted(nonzero_rows("smollm2_short_rows.npz"), key=lambda v: -v.size)[::7]
    shared = mitm_workspace(40)
    for values in rows:
        row = values.astype(np.float32)
        t = 0.5 * float(row.astype(np.float64).sum())
        e = error_radius(values)
        fresh = meet_in_the_middle(row, row.size, t, e, np.inf, mitm_workspace(0))
        assert meet_in_the_middle(row, row.size, t, e, np.inf, shared) == fresh


def test_pruning_lists_far_fewer_sums_on_real_rows_than_the_halves() -> None:
    """What the pruning is for: on SmolLM2's rows of 33–40 keys, the head list grows past the half of
    meet-in-the-middle (2^(n/2)) before the list of the values left is cheaper, on most rows. Measured as the
    level where the head stops: later than n/2 + 2 on at least half of the rows."""
    rows = [v for v in nonzero_rows("smollm2_short_rows.npz") if v.size >= 33]
    later = 0
    for values in rows:
        vals = np.sort(values.astype(np.float64))[::-1].copy()
        t = 0.5 * float(vals.sum())
        d_known = karmarkar_karp(vals)
        rest = np.concatenate([np.cumsum(vals[::-1])[::-1], [0.0]])
        sums = np.array([vals[0]])
        k = 1
        while k < vals.size and (k < vals.size // 2 or 2 * sums.size <= 2 ** (vals.size - k)):
            sums = np.concatenate([sums, sums + vals[k]])
            sums = sums[(sums >= t - d_known - rest[k + 1]) & (sums <= t + d_known)]
            k += 1
        later += k > vals.size // 2 + 2
    assert 2 * later >= len(rows), (later, len(rows))


WORKSPACE_CHECK = """
import numpy as np
from attnsens.theta._numba_enumeration import mitm_workspace, pruned_meet_in_the_middle
rng = np.random.default_rng(5)
for n in range(1, 19):
    for spread in (0.05, 4.0, 30.0):
        values = np.sort(np.exp2(-spread * rng.random(n)))[::-1].copy()
        t = 0.5 * float(values.sum())
        for d_known in (np.inf, 1e-9):  # nothing pruned (the largest lists), and a narrow window
            pruned_meet_in_the_middle(values, t, d_known, 0.0, mitm_workspace(n))
print("ok")
"""


def test_the_lists_fit_the_workspace_exactly_sized() -> None:
    """numba does not check indices: a list that outgrew ``mitm_workspace(n)`` would write past its buffer
    silently. Run as plain Python (NUMBA_DISABLE_JIT), where NumPy raises IndexError on any write past the end,
    with the workspace sized exactly and windows from none to narrow."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    done = subprocess.run([sys.executable, "-c", WORKSPACE_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize("exact_support", [None, ORACLE_MAX_SUPPORT])
def test_certify_holds_the_exact_theta_of_real_smollm2_rows(exact_support: int | None) -> None:
    """The cascade on SmolLM2's short rows, by default and with every row of up to 34 keys enumerated: θ of the
    stored values (exact rationals) in every interval, exact rows as wide as documented, and all rows exact
    under ``exact_support``."""
    from attnsens.theta import certify
    from tests.helpers.soundness import assert_certificate_sound, assert_exact_width

    rows = oracle_rows("smollm2_short_rows.npz", ORACLE_MAX_SUPPORT)
    padded = torch.zeros(len(rows), ORACLE_MAX_SUPPORT, dtype=torch.float32)
    for i, values in enumerate(rows):
        padded[i, : values.size] = torch.from_numpy(values)
    cert = certify(padded, exact_support=exact_support)
    for i, values in enumerate(rows):
        ints, exponent = dyadic(torch.from_numpy(values))
        s = Fraction(sum(ints), 2**exponent)
        theta = s - 4 * exact_distance(values) ** 2
        lower, upper = float(cert.lower[i]), float(cert.upper[i])
        assert_certificate_sound(lower, upper, theta, f"row {i} ({values.size} keys)")
        if bool(cert.exact[i]):
            assert_exact_width(padded[i], lower, upper, f"row {i}")
    if exact_support is not None:
        assert bool(cert.exact.all())
    else:
        assert not bool(cert.exact.all())  # the fixture holds rows the default leaves open
