"""The greedy split with best single exchanges (``_numba_partition.swap_descent``) and the rows it is for:
near-uniform attention, as at initialisation, where first-fit and Karmarkar–Karp stop about half a key from s/2."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from attnsens.theta import ThetaMethod, certify
from attnsens.theta._numba_partition import swap_descent
from attnsens.theta._numba_refine import SHORT_ROW_SUPPORT

STOP = 2.0**-13.5


def near_uniform_rows(n_rows: int, length: int, spread: float, *, seed: int) -> torch.Tensor:
    """float32 softmax rows of scores with a small standard deviation ``spread`` (near-uniform attention)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(spread * torch.randn(n_rows, length, generator=gen, dtype=torch.float64), -1).float()


@pytest.mark.parametrize("n", [5, 9, 12, 15])
def test_the_distance_is_that_of_a_real_subset(n: int) -> None:
    """d is |p(S) − t| of some subset S (checked against all 2^n), never below the optimum, never above the
    greedy split it starts from."""
    rng = np.random.default_rng(n)
    for _ in range(20):
        vals = np.sort(rng.random(n) ** 3)[::-1].copy()
        t = 0.5 * float(vals.sum())
        distances = sorted(abs(sum(c) - t) for k in range(n + 1) for c in itertools.combinations(vals.tolist(), k))
        d = swap_descent(vals, t, -1.0, 8)
        assert d >= distances[0] - 1e-15
        assert min(abs(d - x) for x in distances) <= 1e-15
        assert d <= swap_descent(vals, t, -1.0, 0) + 1e-15


def test_exchanges_close_the_gap_that_greedy_leaves_on_near_uniform_values() -> None:
    vals = np.sort(near_uniform_rows(1, 117, 0.1, seed=0)[0].double().numpy())[::-1].copy()
    t = 0.5 * float(vals.sum())
    greedy = swap_descent(vals, t, STOP, 0)
    assert greedy > 0.2 / vals.size  # an odd count: the greedy split ends about half a key from t
    assert swap_descent(vals, t, STOP, 8) <= STOP


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("length", [41, 117, 128, 301])
def test_near_uniform_rows_reach_float32_resolution(length: int, backend: str) -> None:
    """Attention at initialisation: every row certified to 2^-25 without the budgeted CKK, inside θ ≤ s."""
    rows = near_uniform_rows(64, length, 0.1, seed=length)
    cert = certify(rows, backend=backend)
    assert bool((cert.width <= 2.0**-25).all())
    assert bool((cert.lower <= cert.row_sum).all())
    methods = {ThetaMethod(int(m)) for m in cert.method}
    assert ThetaMethod.CKK_BUDGET not in methods
    if backend == "numba" and length <= SHORT_ROW_SUPPORT:  # short-row proofs first: four-list finds perfect splits
        assert bool(cert.exact.all()), cert.method_names()
    elif length % 2:
        assert ThetaMethod.SWAP_DESCENT in methods
    assert math.isclose(float(cert.upper.max()), float(cert.row_sum.max()), rel_tol=0, abs_tol=1e-6)
