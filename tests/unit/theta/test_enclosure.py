"""The one-row θ enclosure compiled into kernels (``_numba_enclosure.theta_interval``) against the array one
(``_enclosure.theta_enclosure``): the same bits on real rows' numbers and on every edge range the array one
handles (error radii, perfect splits, tiny sums, overflowing squares, NaN)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnsens.theta._enclosure import theta_enclosure
from attnsens.theta._numba_enclosure import theta_interval
from tests.unit.theta.rows import softmax_rows


def kernel_intervals(s_hat: np.ndarray, d_found: np.ndarray, d_lb: np.ndarray, err: np.ndarray) -> tuple:
    pairs = [theta_interval(*values) for values in zip(s_hat, d_found, d_lb, err, strict=True)]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def edge_cases() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(11)
    tiny = 2.0**-1074
    cases = [
        (1.0, 0.0, 0.0, 0.0),  # a perfect split: θ = s exactly
        (1.0, 0.0, 0.0, 2.0**-40),  # a perfect split found with rounding error
        (1.0, 2.0**-14, 2.0**-15, 0.0),
        (1.0, 2.0**-14, 0.0, 2.0**-45),  # d_lb − E < 0: clamped to 0
        (0.999, 0.3, 0.3, 1e-13),
        (3 * tiny, tiny, 0.0, 0.0),  # tiny rows
        (2.0**-950, 2.0**-952, 2.0**-953, 2.0**-1000),
        (2.0**-900, 2.0**-902, 2.0**-902, 0.0),  # the tiny threshold itself
        (3e200, 1e200, 1e200, 0.0),  # overflowing squares
        (3e200, 0.5e200, 0.5e200, 1e190),
        (1e300, 1e300, 1e300, 0.0),
        (1.0, np.inf, 0.0, 0.0),
        (np.nan, 0.1, 0.1, 0.0),
        (1.0, np.nan, np.nan, np.nan),
    ]
    s = 1.0 + rng.uniform(-1e-3, 1e-3, 2000)
    d = np.abs(rng.normal(0, 0.1, 2000)) * rng.choice([1.0, 2.0**-20, 0.0], 2000)
    lb = d * rng.choice([1.0, 0.5, 0.0], 2000)
    e = rng.choice([0.0, 1e-16, 1e-12], 2000)
    columns = [np.array([c[i] for c in cases]) for i in range(4)]
    return tuple(np.concatenate([column, extra]) for column, extra in zip(columns, (s, d, lb, e), strict=True))


def assert_same_bits(ours: tuple, theirs: tuple) -> None:
    for a, b in zip(ours, theirs, strict=True):
        b = np.asarray(b, dtype=np.float64)
        assert np.array_equal(a.view(np.int64), b.view(np.int64)), np.flatnonzero(a.view(np.int64) != b.view(np.int64))


def test_the_kernel_enclosure_equals_the_array_one_on_every_edge_range() -> None:
    s, d, lb, e = edge_cases()
    arrays = theta_enclosure(*(torch.from_numpy(v) for v in (s, d, lb, e)))
    assert_same_bits(kernel_intervals(s, d, lb, e), tuple(t.numpy() for t in arrays))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_enclosure_equals_the_array_one_on_certified_rows(dtype: torch.dtype) -> None:
    from attnsens.theta import _numba_kernels
    from attnsens.theta.certificate import (
        CKK_MAX_SUPPORT,
        CKK_NODE_BUDGET,
        MITM_MAX_SUPPORT,
        STOP_DISTANCE,
        _certify_rows_numba,
    )

    padded = [
        torch.nn.functional.pad(softmax_rows(64, n, sigma, seed=n, dtype=dtype), (0, 300 - n))
        for n in (3, 30, 300)
        for sigma in (0.5, 8.0)
    ]
    rows = torch.cat(padded).contiguous()
    out = _certify_rows_numba(
        _numba_kernels, rows, STOP_DISTANCE["float32"], MITM_MAX_SUPPORT, CKK_NODE_BUDGET, CKK_MAX_SUPPORT, True, 1e-3
    )
    assert bool((out["err"] > 0).any())  # rows with a rounding radius, and float32 rows without one
    assert bool((out["err"] == 0).any()) == (dtype == torch.float32)
    numbers = tuple(out[name].numpy() for name in ("row_sum", "d_found", "d_lb", "err"))
    arrays = theta_enclosure(*(out[name] for name in ("row_sum", "d_found", "d_lb", "err")))
    assert_same_bits(kernel_intervals(*numbers), tuple(t.numpy() for t in arrays))
