"""The interleaved whole-row first-fits, in key order and back from the last key, against a walk of one row at a
time, written here in plain Python."""

from __future__ import annotations

import numpy as np
import pytest

from attnsens.theta._numba_first_fit import _whole_row_first_fits
from attnsens.theta._numba_refine import FREEZE_EVERY

STOP_D = 2.0**-13.5


def _one_row(row: np.ndarray, end: int, g: float) -> float:
    """The walk on its own: whole blocks while they fit, then key by key with a stop check every block."""
    filled, i = 0.0, 0
    while i + FREEZE_EVERY <= end:
        block = float(np.sum(row[i : i + FREEZE_EVERY], dtype=np.float64))
        if filled + block > g:
            break
        filled += block
        i += FREEZE_EVERY
    smallest = np.inf
    while i < end:
        for v in row[i : min(end, i + FREEZE_EVERY)].astype(np.float64):
            if filled + v <= g:
                filled += v
            else:
                smallest = min(smallest, v)
        i += FREEZE_EVERY
        if min(g - filled, smallest - (g - filled)) <= STOP_D:
            break
    return min(g - filled, smallest - (g - filled))


@pytest.mark.parametrize("reverse", [False, True])
def test_each_row_gets_the_result_of_its_own_walk(reverse: bool) -> None:
    # Eight rows of different lengths and sharpness in one block, so that lanes end at different times and take
    # the next row; a row's result must not depend on the rows it shares the walk with. Backwards, a row's walk
    # is that of its support reversed (the keys past its end are not part of it).
    rng = np.random.default_rng(3)
    n_keys = 700
    x = np.zeros((8, n_keys), np.float32)
    ends = np.array([700, 130, 650, 200, 129, 512, 333, 680], np.int64)
    for r, end in enumerate(ends):
        logits = rng.normal(0.0, [0.5, 4.0, 1.0, 8.0, 2.0, 0.1, 3.0, 6.0][r], end)
        if r % 2:  # recent keys heavier, as in causal attention
            logits += np.linspace(0.0, 3.0, end)
        p = np.exp(logits - logits.max())
        x[r, :end] = (p / p.sum()).astype(np.float32)
    row_sum = x.astype(np.float64).sum(axis=1)
    rows = np.array([5, 0, 7, 2, 4, 1, 6, 3], np.int64)  # any order of the block's rows
    out = np.empty(rows.size)
    _whole_row_first_fits(x, 0, rows, rows.size, ends, row_sum, STOP_D, reverse, out)
    # Block sums may round otherwise than NumPy's pairwise sum, so compare at the rounding model's scale.
    walked = [x[j, : ends[j]][::-1] if reverse else x[j, : ends[j]] for j in rows]
    expected = [_one_row(w, w.size, 0.5 * row_sum[j]) for w, j in zip(walked, rows, strict=True)]
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)
    assert (out >= 0).all()


def test_the_two_directions_settle_different_rows() -> None:
    """A row whose small keys come first leaves the key-order fill far from s/2 and is settled backwards, and its
    mirror image the other way round: the two walks are not one walk twice."""
    small = np.full(3000, 2.0**-14)  # each below the stop distance
    large = np.linspace(0.02, 0.05, 24)
    row = np.concatenate([small, large])
    x = np.stack([row, row[::-1]]).astype(np.float32)
    ends = np.array([x.shape[1]] * 2, np.int64)
    row_sum = x.astype(np.float64).sum(axis=1)
    forward, backward = np.empty(2), np.empty(2)
    _whole_row_first_fits(x, 0, np.arange(2), 2, ends, row_sum, STOP_D, False, forward)
    _whole_row_first_fits(x, 0, np.arange(2), 2, ends, row_sum, STOP_D, True, backward)
    assert forward[0] > STOP_D >= backward[0]
    assert backward[1] > STOP_D >= forward[1]
