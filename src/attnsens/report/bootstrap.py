"""Bootstrap confidence intervals over independent units: sequences, and seeds where a run has several.

Rows of one sequence are not independent (they share the text and, across layers, the residual stream), so the
resampled unit is the audited sequence, never the row. A training run's seeds are independent models: with two
or more, a replicate first draws the seeds with replacement, then each drawn seed's sequences with replacement
(a two-level bootstrap). A replicate is a vector of weights, one per unit, and every statistic of every cell is
computed from the same replicate, so a statistic built from several cells (the lowest cell's median, a growth
from one checkpoint to another on the same sequences) gets a joint interval.

The intervals are percentile intervals of ``REPLICATES`` replicates drawn from a generator seeded by the run id:
a report built twice shows the same numbers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

REPLICATES = 1000
"""Bootstrap replicates per run."""

CONFIDENCE = 0.95
"""Coverage of every interval."""


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap percentile interval (NaN bounds where there are no replicates)."""

    estimate: float
    low: float
    high: float

    def above(self, threshold: float) -> bool:
        """The whole interval is at or above ``threshold``."""
        return bool(self.low >= threshold)

    def below(self, threshold: float) -> bool:
        """The whole interval is below ``threshold``."""
        return bool(self.high < threshold)

    def text(self, digits: int = 3, *, percent: bool = False) -> str:
        """'0.912 [0.887, 0.934]' (or '12.5 % [9.8, 15.1]')."""
        if percent:
            return f"{100 * self.estimate:.1f} % [{100 * self.low:.1f}, {100 * self.high:.1f}]"
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def interval(estimate: float, replicates: np.ndarray) -> Interval:
    """``estimate`` with the central CONFIDENCE percentile interval of ``replicates`` (NaNs ignored)."""
    values = np.asarray(replicates, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Interval(float(estimate), float("nan"), float("nan"))
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return Interval(float(estimate), float(low), float(high))


@dataclass(frozen=True)
class UnitWeights:
    """Bootstrap weights of a run's units: ``weights[b, u]`` is how often replicate b drew unit u.

    ``seeds`` and ``sequences`` name unit u; ``index(seed, sequence)`` maps rows to their unit.
    """

    seeds: np.ndarray
    sequences: np.ndarray
    weights: np.ndarray

    @property
    def n_units(self) -> int:
        return int(self.seeds.size)

    @property
    def n_seeds(self) -> int:
        return int(np.unique(self.seeds).size)

    def index(self, seed: np.ndarray, sequence: np.ndarray) -> np.ndarray:
        """The unit number of each (seed, sequence) pair (every pair must be a unit)."""
        keys = self.seeds.astype(np.int64) * (1 << 32) + self.sequences.astype(np.int64)
        wanted = np.asarray(seed, dtype=np.int64) * (1 << 32) + np.asarray(sequence, dtype=np.int64)
        order = np.argsort(keys)
        return order[np.searchsorted(keys, wanted, sorter=order)]


def unit_weights(seed: np.ndarray, sequence: np.ndarray, *, key: str, replicates: int = REPLICATES) -> UnitWeights:
    """Two-level bootstrap weights over the distinct (seed, sequence) pairs given (one level for one seed).

    A sum of independent multinomial draws with equal probabilities is one multinomial draw with the trials
    added, so a seed drawn c times gives its n sequences multinomial(c·n) counts.
    """
    pairs = np.unique(np.stack([np.asarray(seed, np.int64), np.asarray(sequence, np.int64)]), axis=1)
    seeds, sequences = pairs[0], pairs[1]
    rng = np.random.default_rng(_seed_of(key))
    distinct = np.unique(seeds)
    weights = np.zeros((replicates, seeds.size), dtype=np.float64)
    if distinct.size > 1:
        draws = rng.integers(0, distinct.size, size=(replicates, distinct.size))
        times = np.stack([(draws == i).sum(axis=1) for i in range(distinct.size)], axis=1)
    else:
        times = np.ones((replicates, 1), dtype=np.int64)
    for i, value in enumerate(distinct):
        members = np.flatnonzero(seeds == value)
        uniform = np.full(members.size, 1.0 / members.size)
        weights[:, members] = rng.multinomial(times[:, i] * members.size, uniform)
    return UnitWeights(seeds=seeds, sequences=sequences, weights=weights)


def _seed_of(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def weighted_median(values: np.ndarray, units: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per replicate, the lower weighted median of ``values`` whose row r weighs ``weights[b, units[r]]``.

    The rows are sorted once; replicate b's median is the first sorted row at which the weight of the rows up to
    it reaches half of b's total, found by bisection over the sorted rows: the weight of the first k rows is
    Σ_u w[b, u]·(rows of unit u among them), and the count of unit u's rows below k is a search in that unit's
    sorted positions. The weights are counts, so every sum is exact, and the result is that of a cumulative sum
    over the rows, at (replicates × units) work per step instead of (replicates × rows).

    Returns (replicates,) values, NaN where a replicate gives the rows no weight.
    """
    order = np.argsort(values, kind="stable")
    ordered, owners = values[order], np.asarray(units, np.int64)[order]
    replicates, n_units = weights.shape
    result = np.full(replicates, np.nan)
    if ordered.size == 0:
        return result
    n = ordered.size
    # Every unit's positions in the sorted rows, as one increasing array of keys unit·(n + 1) + position.
    by_unit = np.argsort(owners, kind="stable")
    keys = owners[by_unit] * (n + 1) + by_unit
    below = np.arange(n_units, dtype=np.int64) * (n + 1)  # the key of position 0 of each unit
    start = np.searchsorted(keys, below)
    total = weights @ np.bincount(owners, minlength=n_units).astype(np.float64)
    half = total / 2
    low, high = np.ones(replicates, np.int64), np.full(replicates, n, np.int64)
    while bool((low < high).any()):
        middle = (low + high) // 2
        counts = np.searchsorted(keys, below[None, :] + middle[:, None]) - start[None, :]  # rows below middle
        reached = np.einsum("bu,bu->b", weights, counts) >= half
        high = np.where(reached, middle, high)
        low = np.where(reached, low, middle + 1)
    result[:] = ordered[low - 1]
    result[total == 0] = np.nan
    return result


def weighted_ratio(
    numerator: np.ndarray, denominator: np.ndarray, units: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """Per replicate, Σ_r w·numerator / Σ_r w·denominator (a fraction or a mean), summed per unit first."""
    n_units = weights.shape[1]
    top = np.bincount(units, weights=numerator, minlength=n_units)
    bottom = np.bincount(units, weights=denominator, minlength=n_units)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights @ top) / (weights @ bottom)
