"""Per-(checkpoint, layer, head) aggregates of the rows table (docs/math.md A3)."""

from __future__ import annotations

from typing import Literal

import pandas as pd

from attnsens.errors import InputError
from attnsens.store.schema import ROWS, SUMMARY

ALL_HEADS = -1
"""Value of the ``head`` column for records that pool every head of a layer."""

_GROUP = ("run_id", "model", "step", "seed", "layer", "head")
_NEEDED = (*_GROUP, "theta_lower", "theta_upper", "theta_exact", "dominant", "p_max", "entropy")
_NEEDED_EXTRA = ("normalized_entropy", "n_eff")


def summarize_rows(rows: pd.DataFrame, *, level: Literal["head", "layer", "both"] = "both") -> pd.DataFrame:
    """Aggregate audited rows per (run_id, step, seed, layer, head): quantiles of theta_lower and row statistics.

    For every group: n_rows; median and 10/25/75/90 % quantiles (linear interpolation) of theta_lower; median
    theta_upper; fractions of exact and dominant-atom rows; median and mean p_max; mean entropy (nats), mean
    normalized entropy and mean n_eff.

    Args:
        rows: a DataFrame with the columns of the ``rows`` table (schema.ROWS).
        level: ``"head"`` — one record per head; ``"layer"`` — one record per layer pooling the rows of all its
            heads, with ``head = -1`` (ALL_HEADS); ``"both"`` — the two concatenated. Pooled records are
            medians over rows, not medians of per-head medians.

    Returns:
        A DataFrame with exactly the columns of schema.SUMMARY, sorted by its key. By T2(f) the median of a
        valid lower bound certifies that at least half the rows of the group have θ ≥ theta_lower_median.
    """
    missing = [c for c in (*_NEEDED, *_NEEDED_EXTRA) if c not in rows.columns]
    if missing:
        raise InputError(f"rows frame lacks columns {missing}; give a frame with the columns of the rows table")
    if level not in ("head", "layer", "both"):
        raise InputError(f"level must be 'head', 'layer' or 'both', got {level!r}")
    if rows.empty:
        return pd.DataFrame({name: pd.Series(dtype=_pandas_dtype(name)) for name in SUMMARY.names})
    parts = []
    if level in ("head", "both"):
        parts.append(_aggregate(rows))
    if level in ("layer", "both"):
        parts.append(_aggregate(rows.assign(head=ALL_HEADS)))
    summary = pd.concat(parts, ignore_index=True)
    summary = summary.sort_values(list(SUMMARY.key), ignore_index=True)
    return summary[list(SUMMARY.names)].astype({name: _pandas_dtype(name) for name in SUMMARY.names})


def _aggregate(rows: pd.DataFrame) -> pd.DataFrame:
    grouped = rows.groupby(list(_GROUP), sort=True, observed=True, dropna=False)
    theta = grouped["theta_lower"]
    out = grouped.agg(
        n_rows=("theta_lower", "size"),
        theta_lower_median=("theta_lower", "median"),
        theta_upper_median=("theta_upper", "median"),
        fraction_exact=("theta_exact", "mean"),
        fraction_dominant=("dominant", "mean"),
        p_max_median=("p_max", "median"),
        p_max_mean=("p_max", "mean"),
        entropy_mean=("entropy", "mean"),
        normalized_entropy_mean=("normalized_entropy", "mean"),
        n_eff_mean=("n_eff", "mean"),
    )
    for q in (10, 25, 75, 90):
        out[f"theta_lower_q{q}"] = theta.quantile(q / 100)
    return out.reset_index()


def _pandas_dtype(name: str) -> str:
    column = SUMMARY.column(name) if name in SUMMARY.names else ROWS.column(name)
    text = str(column.dtype)
    return {"string": "str", "double": "float64"}.get(text, text)
