"""exact(): proved-optimal θ against exact oracles; TooHardError when a row cannot be proved."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from attnsens.errors import TooHardError
from attnsens.theta import certify, exact
from tests.reference.theta_oracles import theta_dyadic_meet_in_the_middle, theta_fraction
from tests.unit.theta.rows import softmax_rows


def _dyadic_rows(n_rows: int, support: int, length: int, bits: int, seed: int) -> tuple[torch.Tensor, list]:
    """Rows of random `bits`-bit integers scaled by one power of two (exact float64 values), zero-padded."""
    gen = torch.Generator().manual_seed(seed)
    rows, cases = [], []
    for _ in range(n_rows):
        ints = torch.randint(1, 2**bits, (support,), generator=gen, dtype=torch.int64)
        exponent = int(ints.sum()).bit_length()
        row = torch.zeros(length, dtype=torch.float64)
        row[torch.randperm(length, generator=gen)[:support]] = ints.to(torch.float64) / 2.0**exponent
        rows.append(row)
        cases.append(([int(v) for v in ints.tolist()], exponent))
    return torch.stack(rows), cases


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_small_rows_match_enumeration(backend: str) -> None:
    rows = softmax_rows(12, 15, 1.5, seed=11, dtype=torch.float32)
    values = exact(rows, backend=backend)
    cert = certify(rows, backend=backend)
    for i, row in enumerate(rows):
        theta = theta_fraction(row.tolist())
        assert abs(Fraction(float(values[i])) - theta) <= Fraction(2.0**-52)
        assert float(cert.lower[i]) <= float(values[i]) <= float(cert.upper[i])


@pytest.mark.parametrize("support", [26, 33, 38])
def test_meet_in_the_middle_up_to_48_matches_integer_oracle(support: int) -> None:
    rows, cases = _dyadic_rows(3, support, 61, bits=30, seed=support)
    values = exact(rows, tolerance=1.0)
    for value, (ints, exponent) in zip(values.tolist(), cases, strict=True):
        theta = theta_dyadic_meet_in_the_middle(ints, exponent)
        assert abs(Fraction(value) - theta) <= Fraction(2.0**-52)


def test_ckk_proves_rows_beyond_48() -> None:
    """Few distinct magnitudes: CKK (or the K-atom relaxation) proves these 60-key rows quickly."""
    gen = torch.Generator().manual_seed(4)
    heavy = torch.tensor([0.31, 0.29, 0.2], dtype=torch.float64)
    tail = torch.rand(57, generator=gen, dtype=torch.float64)
    row = torch.cat([heavy, 0.2 * tail / tail.sum()])
    value = exact(row, tolerance=1e-9)
    cert = certify(row)
    assert float(cert.lower) <= float(value) <= float(cert.upper)


def test_too_hard_names_rows_and_fix() -> None:
    rows = softmax_rows(3, 200, 1.0, seed=5, dtype=torch.float64)
    with pytest.raises(TooHardError, match=r"3 of 3 rows.*row 0, 200 non-zero keys.*node_budget"):
        exact(rows, node_budget=1)


@pytest.mark.slow
def test_meet_in_the_middle_at_48() -> None:
    rows, cases = _dyadic_rows(1, 48, 48, bits=20, seed=48)
    value = float(exact(rows, tolerance=1.0)[0])
    ints, exponent = cases[0]
    assert abs(Fraction(value) - theta_dyadic_meet_in_the_middle(ints, exponent)) <= Fraction(2.0**-52)


@pytest.mark.parametrize("case", ["random", "ties", "repeated", "one", "integers", "spread"])
def test_sorted_subset_sums_is_every_subset_sum_in_order(case: str) -> None:
    """The two-ended merge-doubling lists the multiset of all 2^m subset sums, ascending, bit for bit as a sort of
    the sums formed in the same order would (ties between L and L + v, and within L, included)."""
    import itertools

    import numpy as np

    from attnsens.theta._numba_enumeration import _sorted_subset_sums

    rng = np.random.default_rng(5)
    vals = {
        "random": rng.random(11),
        "ties": np.array([0.25, 0.25, 0.5, 0.125, 0.125, 0.375, 0.25, 0.75]),
        "repeated": np.full(9, 1.0 / 3.0),
        "one": np.array([0.5]),
        "integers": rng.integers(1, 6, 12).astype(np.float64),  # many ties where the middle chains start
        "spread": np.exp(rng.normal(0.0, 4.0, 12)),  # one list spent long before the other
    }[case]
    sums = []
    for mask in itertools.product((0, 1), repeat=vals.size):
        total = 0.0
        for k, bit in enumerate(mask):  # the doubling adds values in list order, to sums formed the same way
            total = total + vals[k] if bit else total
        sums.append(total)
    listed = _sorted_subset_sums(vals)
    assert listed.shape == (2**vals.size,)
    assert np.array_equal(listed, np.sort(np.array(sums)))


@pytest.mark.parametrize("case", ["random", "integers", "spread", "outside"])
def test_closest_pair_sum_is_the_least_pair_distance(case: str) -> None:
    """The four-lane sweep returns min |x + y − t| over every pair, the same float64 differences compared, on lists
    below and above the size where it splits into lanes; with exact hits (integers), lists spanning many binades
    and targets outside the reachable range."""
    import numpy as np

    from attnsens.theta._numba_enumeration import _closest_pair_sum, _closest_pair_sweep, _sorted_subset_sums

    rng = np.random.default_rng(11)
    for trial in range(60):
        m_a, m_b = int(rng.integers(1, 10)), int(rng.integers(1, 10))
        if case == "integers":
            v, w = rng.integers(1, 40, m_a).astype(float), rng.integers(1, 40, m_b).astype(float)
        elif case == "spread":
            v, w = np.exp(rng.normal(0.0, 4.0, m_a)), np.exp(rng.normal(0.0, 4.0, m_b))
        else:
            v, w = rng.random(m_a), rng.random(m_b)
        a, b = _sorted_subset_sums(v), _sorted_subset_sums(w)
        total = v.sum() + w.sum()
        t = total * (rng.choice([-0.5, 1.5]) if case == "outside" else rng.uniform(0.1, 0.9))
        if case == "integers" and trial % 2:
            t = float(np.floor(t))
        brute = np.abs((a[:, None] + b[None, :]) - t).min()
        assert _closest_pair_sum(a, b, t) == brute, (case, trial, a.size, b.size)
        assert _closest_pair_sweep(a, b, t, 0, a.size, b.size - 1) == brute
