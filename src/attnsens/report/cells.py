"""Per-(run, checkpoint, seed, layer) aggregates of the rows table that the findings are judged on.

Each cell is computed twice: over ``all`` rows, and over the ``core`` rows, which leave out two kinds of row
whose statistics say little about how a layer mixes its context:

* **sink rows**, whose largest weight sits on key position 0 (the first token of the sequence, or the BOS token
  where the tokenizer adds one): an attention sink puts most of the mass on one key by design;
* **early rows**, with fewer than ``EARLY_KEYS`` keys: with few keys p_max is large for any scores (a row with
  one key is dominant trivially, docs/math.md §9.4).

Effect sizes are stated relative to uniform attention over the row's n keys, where p_max·n = 1, normalized
entropy = 1 and n_eff / n = 1. ``trivial_lower_median`` is the median of s − p_max² (s = row sum), a lower bound
of θ that follows from p_max alone: a greedy split leaves the two sides at most p_max apart, so
d* ≤ p_max / 2 and θ = s − 4d*² ≥ s − p_max².
"""

from __future__ import annotations

from typing import Any

import pandas as pd

EARLY_KEYS = 16
"""Rows with fewer keys than this are "early" and left out of the core rows."""

SUBSETS = ("all", "core")
COUNT_COLUMNS = ("n_rows", "n_dominant", "n_sink", "n_dominant_sink", "n_early")
"""The cells' row counts (integers); every other aggregate is a median, mean or fraction."""

CORE_ROWS_SQL = f"argmax <> 0 AND n_keys >= {EARLY_KEYS}"
"""The SQL condition of a core row: not a sink (argmax at key 0), not early."""

_AGGREGATES = f"""
    count(*) AS n_rows,
    median(n_keys) AS n_keys_median,
    median(theta_lower) AS theta_lower_median,
    median(row_sum - p_max * p_max) AS trivial_lower_median,
    median(p_max) AS p_max_median,
    median(p_max * n_keys) AS p_max_n_median,
    avg(normalized_entropy) AS normalized_entropy_mean,
    avg(n_eff / n_keys) AS n_eff_fraction_mean,
    count(*) FILTER (WHERE dominant) AS n_dominant,
    count(*) FILTER (WHERE argmax = 0) AS n_sink,
    count(*) FILTER (WHERE dominant AND argmax = 0) AS n_dominant_sink,
    count(*) FILTER (WHERE n_keys < {EARLY_KEYS}) AS n_early
"""

CELLS_SQL = f"""
SELECT run_id, step, seed, layer, 'all' AS subset, {_AGGREGATES} FROM rows GROUP BY run_id, step, seed, layer
UNION ALL
SELECT run_id, step, seed, layer, 'core' AS subset, {_AGGREGATES} FROM rows WHERE {CORE_ROWS_SQL}
GROUP BY run_id, step, seed, layer
ORDER BY run_id, subset, step, seed, layer
"""


def layer_cells(connection: Any) -> pd.DataFrame:
    """The cells of the ``rows`` view of a DuckDB connection (columns: see CELLS_SQL), all heads pooled."""
    frame = connection.execute(CELLS_SQL).df()
    return frame.astype({c: "int64" for c in COUNT_COLUMNS})


def layer_cells_of(rows: pd.DataFrame) -> pd.DataFrame:
    """``layer_cells`` of an in-memory rows DataFrame (columns of the store's rows table)."""
    import duckdb

    connection = duckdb.connect(":memory:")
    try:
        connection.register("rows", rows)
        return layer_cells(connection)
    finally:
        connection.close()
