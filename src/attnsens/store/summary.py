"""Per-(checkpoint, layer, head) aggregates of the rows table (docs/math.md A3)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import pandas as pd

from attnsens.errors import InputError
from attnsens.store.schema import ROWS, SUMMARY

ALL_HEADS = -1
"""Value of the ``head`` column for records that pool every head of a layer."""

_GROUP = ("run_id", "model", "step", "seed", "layer", "head")
_NEEDED = (*_GROUP, "theta_lower", "theta_upper", "theta_exact", "dominant", "p_max", "entropy")
_NEEDED_EXTRA = ("normalized_entropy", "n_eff")
SUMMARIZED_COLUMNS = ("layer", "head", *(c for c in (*_NEEDED, *_NEEDED_EXTRA) if c not in _GROUP))
"""The columns of the rows table that ``summarize_columns`` reads."""


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
        return _empty_summary()
    codes, uniques = _key_codes(rows)
    return _summary(codes, uniques, _value_columns(rows), level)


def summarize_columns(
    columns: Mapping[str, np.ndarray], *, run_id: str, model: str, step: int, seed: int
) -> pd.DataFrame:
    """``summarize_rows`` of rows given as arrays of one run, model, step and seed: the same records, bit for bit,
    as ``summarize_rows`` of the frame of these rows with those four columns added, without building the frame.

    An audit written to a folder summarizes each layer's rows this way while they are still in memory, instead of
    reading them back from disk (``attnsens.study.auditing``).

    Args:
        columns: the ``SUMMARIZED_COLUMNS`` of the rows table (others are ignored), equal lengths.
        run_id, model, step, seed: the identity every row shares.
    """
    missing = [name for name in SUMMARIZED_COLUMNS if name not in columns]
    if missing:
        raise InputError(f"columns lack {missing}; give the columns of the rows table")
    count = len(columns["layer"])
    if count == 0:
        return _empty_summary()
    identity = {"run_id": run_id, "model": model, "step": step, "seed": seed}
    codes, uniques = [], []
    for name in _GROUP:
        if name in identity:
            codes.append(np.zeros(count, dtype=np.intp))
            uniques.append(pd.Index([identity[name]], dtype=_pandas_dtype(name)))
        else:
            code, unique = _factorize(pd.Series(columns[name]))
            codes.append(code)
            uniques.append(unique)
    names = {*_MEANS.values(), *_MEDIANS.values()}
    values = {name: np.asarray(columns[name]).astype(np.float64) for name in names}
    return _summary(codes, uniques, values, "both")


def _empty_summary() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=_pandas_dtype(name)) for name in SUMMARY.names})


def _summary(
    codes: list[np.ndarray], uniques: list[pd.Index], columns: dict[str, np.ndarray], level: str
) -> pd.DataFrame:
    """The summary records of the rows whose keys are ``codes`` (into ``uniques``) and whose aggregated columns
    are ``columns`` (float64, NaN for missing values), at ``level`` (``summarize_rows``)."""
    parts = []
    if level in ("head", "both"):
        parts.append(_aggregate(codes, uniques, columns))
    if level in ("layer", "both"):
        pooled = _GROUP.index("head")
        codes[pooled] = np.zeros(len(codes[pooled]), dtype=np.intp)
        uniques[pooled] = pd.Index(np.array([ALL_HEADS], dtype=uniques[pooled].dtype))
        parts.append(_aggregate(codes, uniques, columns))
    summary = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    summary = summary.sort_values(list(SUMMARY.key), ignore_index=True)[list(SUMMARY.names)]
    # Only the columns not yet in the schema's dtype are cast: casting all of them, text keys included, took a
    # third of the time of summarizing one layer of SmolLM2's rows at 4,096 tokens.
    wrong = {
        name: dtype
        for name in SUMMARY.names
        if summary[name].dtype != pd.api.types.pandas_dtype(dtype := _pandas_dtype(name))
    }
    return summary.astype(wrong) if wrong else summary


_MEANS = {
    "fraction_exact": "theta_exact",
    "fraction_dominant": "dominant",
    "p_max_mean": "p_max",
    "entropy_mean": "entropy",
    "normalized_entropy_mean": "normalized_entropy",
    "n_eff_mean": "n_eff",
}
_MEDIANS = {"theta_lower_median": "theta_lower", "theta_upper_median": "theta_upper", "p_max_median": "p_max"}
_THETA_QUANTILES = (10, 25, 75, 90)


def _key_codes(rows: pd.DataFrame) -> tuple[list[np.ndarray], list[pd.Index]]:
    """Each key column of ``_GROUP`` factorised: (its codes, its distinct values in sorted order)."""
    codes = []
    uniques = []
    for name in _GROUP:
        code, unique = _factorize(rows[name])
        codes.append(code)
        uniques.append(unique)
    return codes, uniques


def _factorize(column: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """(codes, sorted distinct values) of one key column. Integer columns of a modest range are numbered through a
    table over that range, and a text column holding one value (one run, one model) by a single comparison: both
    a fraction of a hashing factorisation's time on millions of rows."""
    if column.dtype.kind in "iu" and len(column):
        values = column.to_numpy()
        low, high = int(values.min()), int(values.max())
        if high - low < max(4 * values.size, 1 << 16):
            offsets = values - low if low else values
            seen = np.zeros(high - low + 1, dtype=bool)
            seen[offsets] = True
            rank = np.cumsum(seen, dtype=np.intp) - 1
            return rank[offsets], pd.Index((np.flatnonzero(seen) + low).astype(values.dtype))
    if len(column) and not column.hasnans and bool((column == column.iloc[0]).all()):
        return np.zeros(len(column), dtype=np.intp), pd.Index(column.iloc[:1].to_numpy(), dtype=column.dtype)
    code, unique = pd.factorize(column, sort=True, use_na_sentinel=False)
    return code.astype(np.intp, copy=False), pd.Index(unique)


def _value_columns(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """The aggregated columns as float64 arrays (NaN for missing values)."""
    names = {*_MEANS.values(), *_MEDIANS.values()}
    return {name: rows[name].to_numpy(dtype=np.float64, na_value=np.nan) for name in names}


def _aggregate(codes: list[np.ndarray], uniques: list[pd.Index], columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """One record per group of ``_GROUP``: its keys, then the statistics.

    The key codes are combined into one group number in key order, means are weighted bin counts, and every order
    statistic is read off the values sorted by (group, value). Missing values are skipped, and quantiles
    interpolate linearly between order statistics, as pandas' ``mean``, ``median`` and ``quantile`` do. With
    both levels, 2.4 times as fast as pandas' groupby on the 138,240 rows of a 512-token SmolLM2 audit and 2.7
    times on 2.2 million rows (the values equal, the means to the last bits of a different summation order).
    """
    group, out = _group_numbers(codes, uniques)
    n_groups = len(out["head"])
    n_rows = np.bincount(group, minlength=n_groups)
    out["n_rows"] = n_rows.astype(np.int64)
    for name, column in _MEANS.items():
        values = columns[column]
        present = ~np.isnan(values)
        if present.all():
            counts, sums = n_rows, np.bincount(group, weights=values, minlength=n_groups)
        else:
            counts = np.bincount(group, weights=present, minlength=n_groups)
            sums = np.bincount(group, weights=np.where(present, values, 0.0), minlength=n_groups)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[name] = sums / counts
    order = _grouping_order(group, n_groups)
    starts = np.cumsum(n_rows) - n_rows
    for name, column in _MEDIANS.items():
        sorted_values, counts = _sorted_within(columns[column], order, starts, n_rows, group)
        out[name] = _median(sorted_values, starts, counts)
        if column == "theta_lower":
            for q in _THETA_QUANTILES:
                out[f"theta_lower_q{q}"] = _quantile(sorted_values, starts, counts, q / 100)
    return pd.DataFrame(out)  # built once: column by column, the frame's bookkeeping cost more than the statistics


def _group_numbers(codes: list[np.ndarray], uniques: list[pd.Index]) -> tuple[np.ndarray, dict[str, Any]]:
    """(number of each row's group, 0 … G − 1 in the sorted order of the key tuples; the G key tuples, a column
    each)."""
    sizes = tuple(max(len(unique), 1) for unique in uniques)
    space = float(np.prod(np.array(sizes, dtype=np.float64)))
    if space <= max(4 * codes[0].size, 1 << 20):  # key tuples numbered through a table of every combination
        combined = np.ravel_multi_index(codes, sizes)
        seen = np.zeros(int(space), dtype=bool)
        seen[combined] = True
        numbers = np.flatnonzero(seen)
        group = (np.cumsum(seen) - 1)[combined]
        key_codes = np.unravel_index(numbers, sizes)
    else:  # too many combinations for a table: the distinct rows of the code matrix (also in key order)
        numbers, group = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
        key_codes = tuple(numbers.T)
    named = zip(_GROUP, uniques, key_codes, strict=True)
    keys: dict[str, Any] = {name: unique.take(code) for name, unique, code in named}
    return group.reshape(-1).astype(np.intp, copy=False), keys


def _grouping_order(group: np.ndarray, n_groups: int) -> np.ndarray:
    """The row indices grouped by group number (stable; a radix sort when the numbers fit 16 bits)."""
    narrow = group.astype(np.uint16) if n_groups <= 1 << 16 else group
    return np.argsort(narrow, kind="stable")


def _sorted_within(
    values: np.ndarray, order: np.ndarray, starts: np.ndarray, n_rows: np.ndarray, group: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``values`` sorted by (group, value), missing values last in their group, and each group's count of
    non-missing values; ``order`` groups the rows (``_grouping_order``), group g starts at ``starts[g]``.

    Each group's values are sorted in place after the one grouping sort: on a 512-token audit's rows a tenth of
    the time of a lexicographic sort by (group, value). Where groups hold only a few rows each the loop would
    dominate, and the lexicographic sort is used."""
    present = ~np.isnan(values)
    counts = n_rows if present.all() else np.bincount(group, weights=present, minlength=n_rows.size).astype(np.intp)
    if n_rows.size > values.size // 64:
        return values[np.lexsort((values, group))], counts
    sorted_values = values[order]
    for start, end in zip(starts.tolist(), (starts + n_rows).tolist(), strict=True):
        sorted_values[start:end].sort()  # NaN sorts last
    return sorted_values, counts


def _median(sorted_values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each group's median: its middle value, or the mean of its two middle values; NaN for an empty group.

    (a + b) / 2 never exceeds the upper middle value b, so at least half of a group's values are ≥ its median."""
    last = np.maximum(counts - 1, 0)
    low = sorted_values[starts + last // 2] if sorted_values.size else np.zeros(counts.size)
    high = sorted_values[starts + (last + 1) // 2] if sorted_values.size else np.zeros(counts.size)
    return np.where(counts > 0, (low + high) / 2, np.nan)


def _quantile(sorted_values: np.ndarray, starts: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """Each group's q-quantile, linear interpolation between its order statistics; NaN for an empty group."""
    position = q * np.maximum(counts - 1, 0)
    below = np.floor(position).astype(np.int64)
    above = np.minimum(below + 1, np.maximum(counts - 1, 0))
    fraction = position - below
    if not sorted_values.size:
        return np.full(counts.size, np.nan)
    low = sorted_values[starts + below]
    high = sorted_values[starts + above]
    return np.where(counts > 0, np.where(fraction > 0, low + (high - low) * fraction, low), np.nan)


def _pandas_dtype(name: str) -> str:
    column = SUMMARY.column(name) if name in SUMMARY.names else ROWS.column(name)
    text = str(column.dtype)
    return {"string": "str", "double": "float64"}.get(text, text)
