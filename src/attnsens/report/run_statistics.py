"""The statistics the findings are judged on, per cell of one run, each with its bootstrap replicates.

A cell is (checkpoint, layer) with every seed and head pooled, or (checkpoint, layer, head) for the per-head
findings; a pretrained model has one checkpoint (step 0). Every statistic is computed from the rows of the cell
and replicated with the run's unit weights (attnsens.report.bootstrap), so intervals resample sequences and
seeds, never rows.

The envelope E = max(s − m², 4m(s − m) + s(1 − s)) of a row (m = p_max, s = row sum) is the lower bound of θ
that p_max alone implies (docs/math.md T2(b); T2(a) for s ≠ 1): where the median of E already reaches a
threshold, a median θ lower bound above it says nothing about the model beyond its largest weights.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnsens.report.bootstrap import Interval, UnitWeights, interval, unit_weights, weighted_median, weighted_ratio
from attnsens.report.cells import CORE_ROWS_SQL

ENVELOPE_MARGIN = 0.01
"""A row's certificate adds to p_max where its θ lower bound exceeds the envelope E by more than this."""

CLOSED_FORM_SQL = "(4 * p_max * (row_sum - p_max) + row_sum * (1 - row_sum))"
"""θ of a dominant row (p_max ≥ s/2), 4m(s − m) + s(1 − s), in SQL; also the second branch of the envelope E."""

FINDING_ROWS_SQL = f"""
SELECT run_id, step, seed, layer, head, batch,
       ({CORE_ROWS_SQL}) AS core,
       theta_lower,
       greatest(row_sum - p_max * p_max, {CLOSED_FORM_SQL}) AS envelope,
       p_max * n_keys AS p_max_n,
       normalized_entropy,
       dominant,
       argmax = 0 AS sink
FROM rows
"""
"""The columns of the rows table the findings use, one record per audited row (docs/math.md T2(b) for E)."""


def envelope(p_max: np.ndarray, row_sum: np.ndarray) -> np.ndarray:
    """E = max(s − m², 4m(s − m) + s(1 − s)), the lower bound of θ implied by p_max alone (docs/math.md T2(b)).

    >>> float(envelope(np.array([0.5]), np.array([1.0]))[0])
    1.0
    """
    return np.maximum(row_sum - p_max**2, 4 * p_max * (row_sum - p_max) + row_sum * (1 - row_sum))


@dataclass(frozen=True)
class Cell:
    """The rows of one cell: their values and the unit each row belongs to."""

    frame: pd.DataFrame
    units: np.ndarray


class RunStatistics:
    """Cells of one run's rows (one subset: all rows or the core rows) and their bootstrapped statistics."""

    def __init__(self, rows: pd.DataFrame, weights: UnitWeights) -> None:
        self.rows = rows.reset_index(drop=True)
        self.weights = weights
        self.unit = weights.index(self.rows["seed"].to_numpy(), self.rows["batch"].to_numpy())
        self.steps = sorted(int(s) for s in self.rows["step"].unique())
        self.layers = sorted(int(x) for x in self.rows["layer"].unique())
        self._groups = {
            (int(key[0]), int(key[1])): np.asarray(index)
            for key, index in self.rows.groupby(["step", "layer"], sort=True).indices.items()
        }

    @classmethod
    def of_run(cls, rows: pd.DataFrame, *, run_id: str) -> tuple[RunStatistics, RunStatistics]:
        """The statistics of all rows and of the core rows, on one set of unit weights."""
        weights = unit_weights(rows["seed"].to_numpy(), rows["batch"].to_numpy(), key=run_id)
        return cls(rows, weights), cls(rows[rows["core"]], weights)

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    @property
    def n_sequences(self) -> int:
        """Distinct (seed, sequence) units with rows here."""
        return int(np.unique(self.unit).size)

    def cells(self, step: int | None = None) -> list[tuple[int, int]]:
        """The (step, layer) cells with rows, of one step or of all."""
        return [key for key in self._groups if step is None or key[0] == step]

    def cell(self, step: int, layer: int, head: int | None = None) -> Cell:
        index = self._groups.get((step, layer), np.empty(0, dtype=np.int64))
        if head is not None:
            index = index[self.rows["head"].to_numpy()[index] == head]
        return Cell(self.rows.iloc[index], self.unit[index])

    def heads(self, step: int) -> list[tuple[int, int]]:
        part = self.rows[self.rows["step"] == step]
        return sorted({(int(a), int(b)) for a, b in zip(part["layer"], part["head"], strict=True)})

    # Statistics of one cell: point estimate and replicates (cached, so a statistic used twice is drawn once).

    @functools.cache  # noqa: B019 - one instance per report; the cache lives as long as it does
    def median(self, column: str, step: int, layer: int, head: int | None = None) -> tuple[float, np.ndarray]:
        cell = self.cell(step, layer, head)
        values = cell.frame[column].to_numpy(np.float64)
        if values.size == 0:
            return float("nan"), np.full(self.weights.weights.shape[0], np.nan)
        return float(np.median(values)), weighted_median(values, cell.units, self.weights.weights)

    @functools.cache  # noqa: B019
    def mean(
        self, column: str, step: int, layer: int | None = None, head: int | None = None
    ) -> tuple[float, np.ndarray]:
        """Mean of a column (a fraction for a boolean column) over the cell, or over every layer of ``step``."""
        if layer is None:
            index = np.flatnonzero(self.rows["step"].to_numpy() == step)
            cell = Cell(self.rows.iloc[index], self.unit[index])
        else:
            cell = self.cell(step, layer, head)
        values = cell.frame[column].to_numpy(np.float64)
        if values.size == 0:
            return float("nan"), np.full(self.weights.weights.shape[0], np.nan)
        replicates = weighted_ratio(values, np.ones_like(values), cell.units, self.weights.weights)
        return float(values.mean()), replicates

    def share_above_envelope(self, step: int, layer: int, head: int | None = None) -> float:
        """Share of the cell's rows whose θ lower bound exceeds E by more than ENVELOPE_MARGIN."""
        frame = self.cell(step, layer, head).frame
        if frame.empty:
            return float("nan")
        return float((frame["theta_lower"] - frame["envelope"] > ENVELOPE_MARGIN).mean())

    def seed_medians(self, column: str, step: int, layer: int) -> dict[int, float]:
        """The cell's median of ``column`` for each seed alone: the spread over seeds, as numbers."""
        frame = self.cell(step, layer).frame
        return {int(seed): float(part[column].median()) for seed, part in frame.groupby("seed", sort=True)}

    def lowest(self, column: str, cells: list[tuple[int, int]]) -> tuple[tuple[int, int], Interval]:
        """The cell with the lowest median of ``column``, and the interval of the lowest median over ``cells``
        (each replicate takes its own minimum: the interval is the minimum's, not one cell's)."""
        estimates = {key: self.median(column, *key) for key in cells}
        worst = min(estimates, key=lambda key: estimates[key][0])
        stacked = np.stack([replicates for _, replicates in estimates.values()])
        minimum = np.where(np.isnan(stacked), np.inf, stacked).min(axis=0)
        minimum[np.isinf(minimum)] = np.nan
        return worst, interval(estimates[worst][0], minimum)

    def highest_fraction(self, column: str, cells: list[tuple[int, int]]) -> tuple[tuple[int, int], Interval]:
        """The cell with the largest mean of a boolean ``column`` and the interval of the largest over ``cells``."""
        estimates = {key: self.mean(column, *key) for key in cells}
        worst = max(estimates, key=lambda key: estimates[key][0])
        stacked = np.stack([replicates for _, replicates in estimates.values()])
        maximum = np.where(np.isnan(stacked), -np.inf, stacked).max(axis=0)
        maximum[np.isinf(maximum)] = np.nan
        return worst, interval(estimates[worst][0], maximum)
