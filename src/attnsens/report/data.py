"""Everything the report needs from a run directory, read with DuckDB so the rows table is never loaded whole.

The rows table can hold tens of millions of records; the report reads only a fixed-seed sample of it (for the
scatter plot) and SQL aggregates over all of it (for the dominant-atom check).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from attnsens.errors import FileFormatError
from attnsens.store.manifest import MANIFEST_NAME
from attnsens.store.parquet import read_metadata
from attnsens.store.query import connect
from attnsens.store.summary import ALL_HEADS, summarize_rows

SCATTER_SAMPLE_ROWS = 20_000
_CHECKPOINT_TABLES = ("rows", "summary", "bounds")

# θ of a dominant row with stored sum s is s − 4(p_max − s/2)² = 4 p_max (s − p_max) + s (1 − s)
# (docs/architecture.md "θ semantics"); for s = 1 this is 4 p_max (1 − p_max), docs/math.md T2(a).
_DOMINANT_THETA_SQL = "(4 * p_max * (row_sum - p_max) + row_sum * (1 - row_sum))"

_SUMMARY_INPUT_COLUMNS = (
    "run_id, model, step, seed, layer, head, theta_lower, theta_upper, theta_exact, dominant, p_max, entropy, "
    "normalized_entropy, n_eff"
)


@dataclass(frozen=True, kw_only=True)
class DominantCheck:
    """Dominant-atom rows over the whole rows table and their distance from the closed form 4m(s − m) + s(1 − s)."""

    n_rows: int
    n_dominant: int
    fraction_exact_among_dominant: float | None
    max_abs_deviation_lower: float | None
    max_abs_deviation_upper: float | None

    @property
    def fraction_dominant(self) -> float:
        return self.n_dominant / self.n_rows if self.n_rows else float("nan")


@dataclass(frozen=True, kw_only=True)
class RunData:
    """The tables of one run as DataFrames (None where the run has no such table)."""

    run_dir: Path
    tables: tuple[str, ...]
    manifest: dict[str, Any] | None
    summary: pd.DataFrame | None
    rows_sample: pd.DataFrame | None
    dominant: DominantCheck | None
    training: pd.DataFrame | None
    grad_norms: pd.DataFrame | None
    bounds: pd.DataFrame | None
    influence: pd.DataFrame | None
    overview: dict[str, Any] = field(default_factory=dict)


def load_run(run_dir: str | Path) -> RunData:
    """Read the run's tables for the report. FileFormatError if the directory is missing or holds no tables."""
    root = Path(run_dir)
    connection, tables = connect(root)
    try:

        def table(name: str, order: str) -> pd.DataFrame | None:
            if name not in tables:
                return None
            return connection.execute(f'SELECT * FROM "{name}" ORDER BY {order}').df()

        summary = table("summary", "run_id, step, seed, layer, head")
        rows_sample, dominant = None, None
        if "rows" in tables:
            summary = _with_layer_records(summary, connection)
            rows_sample = connection.execute(
                "SELECT p_max, theta_lower, theta_upper, dominant, row_sum FROM rows "
                f"USING SAMPLE reservoir({SCATTER_SAMPLE_ROWS} ROWS) REPEATABLE (0)"
            ).df()
            dominant = _dominant_check(connection)
        data = RunData(
            run_dir=root,
            tables=tuple(tables),
            manifest=_read_manifest(root) or _first_file_record(tables),
            summary=summary,
            rows_sample=rows_sample,
            dominant=dominant,
            training=table("training", "run_id, seed, step"),
            grad_norms=table("grad_norms", "run_id, seed, step, layer"),
            bounds=table("bounds", "run_id, step, seed, layer, head"),
            influence=table("influence", "run_id, model, position_kind, n"),
        )
        return _with_overview(data, connection, tables)
    finally:
        connection.close()


def _with_layer_records(summary: pd.DataFrame | None, connection: Any) -> pd.DataFrame:
    """Summary with per-layer (head = -1) records, computed from the rows where the stored summary lacks them."""
    if summary is not None and (summary["head"] == ALL_HEADS).any():
        return summary
    level = "both" if summary is None else "layer"
    computed = summarize_rows(connection.execute(f"SELECT {_SUMMARY_INPUT_COLUMNS} FROM rows").df(), level=level)
    return computed if summary is None else pd.concat([summary, computed], ignore_index=True)


def _dominant_check(connection: Any) -> DominantCheck:
    record = connection.execute(
        "SELECT count(*), count(*) FILTER (WHERE dominant), "
        "avg(CAST(theta_exact AS DOUBLE)) FILTER (WHERE dominant), "
        f"max(abs(theta_lower - {_DOMINANT_THETA_SQL})) FILTER (WHERE dominant), "
        f"max(abs(theta_upper - {_DOMINANT_THETA_SQL})) FILTER (WHERE dominant) FROM rows"
    ).fetchone()
    return DominantCheck(
        n_rows=int(record[0]),
        n_dominant=int(record[1]),
        fraction_exact_among_dominant=record[2],
        max_abs_deviation_lower=record[3],
        max_abs_deviation_upper=record[4],
    )


def _read_manifest(root: Path) -> dict[str, Any] | None:
    path = root / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _first_file_record(tables: dict[str, Any]) -> dict[str, Any] | None:
    """Config and provenance from the first file's Parquet metadata, for runs written without a manifest."""
    for files in tables.values():
        try:
            record = read_metadata(files[0])
        except FileFormatError:
            continue
        metadata = record.get("metadata") or {}
        return {"config": metadata.get("config", metadata), "provenance": record.get("provenance", {})}
    return None


def _with_overview(data: RunData, connection: Any, tables: dict[str, Any]) -> RunData:
    """Models, runs, seeds, audited checkpoints, layer/head counts and record counts across all tables."""
    overview: dict[str, Any] = {"records": {}}
    for name in tables:
        columns = {c[0] for c in connection.execute(f'DESCRIBE "{name}"').fetchall()}
        overview["records"][name] = connection.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
        wanted = ["model", "run_id", "seed"] + (["step"] if name in _CHECKPOINT_TABLES else [])
        for column in (c for c in wanted if c in columns):
            values = connection.execute(f'SELECT DISTINCT "{column}" FROM "{name}" ORDER BY 1').fetchall()
            overview.setdefault(column, set()).update(v[0] for v in values if v[0] is not None)
    overview = {k: sorted(v) if isinstance(v, set) else v for k, v in overview.items()}
    if data.training is not None and not data.training.empty:
        overview["training_steps"] = int(data.training["step"].max())
    if data.summary is not None and not data.summary.empty:
        overview["layers"] = int(data.summary["layer"].max()) + 1
        heads = data.summary.loc[data.summary["head"] != ALL_HEADS, "head"]
        if not heads.empty:
            overview["heads"] = int(heads.max()) + 1
    return replace(data, overview=overview)
