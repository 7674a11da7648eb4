"""One pass over each float32 attention row: max, argmax, Σp, Σp², −Σ p log p, nonzero count (float64 sums).

Compiled on first use (numba is imported by the caller only when a CPU tensor needs it).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from attnsens._numba_cache import cached_njit


@cached_njit(parallel=True, fastmath=False)
def row_moments(rows, p_max, argmax, total, squares, entropy, nonzero):  # pragma: no cover - compiled
    n_rows, n = rows.shape
    for r in numba.prange(n_rows):
        best = -1.0
        best_index = 0
        s = 0.0
        s2 = 0.0
        h = 0.0
        count = 0
        for j in range(n):
            v = rows[r, j]
            if v > best:
                best = v
                best_index = j
            if v > 0.0:
                x = np.float64(v)
                s += x
                s2 += x * x
                h -= x * math.log(x)
                count += 1
        p_max[r] = best
        argmax[r] = best_index
        total[r] = s
        squares[r] = s2
        entropy[r] = h
        nonzero[r] = count
