"""Everything the report needs from a run directory, read with DuckDB so the rows table is never loaded whole.

The rows table can hold tens of millions of records; the report reads a fixed-seed sample of it (for the
scatter plot), SQL aggregates over all of it (for the dominant-atom check), and the eleven narrow columns the
findings resample (about 70 bytes a row: 700 MB for ten million rows).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from attnsens.errors import FileFormatError
from attnsens.report.cells import layer_cells
from attnsens.report.run_statistics import CLOSED_FORM_SQL, FINDING_ROWS_SQL
from attnsens.store.manifest import MANIFEST_NAME
from attnsens.store.parquet import read_metadata
from attnsens.store.query import connect
from attnsens.store.summary import ALL_HEADS, summarize_rows
from attnsens.store.verify import RunCheck, verify_run

SCATTER_SAMPLE_ROWS = 20_000
"""Rows below half their mass (p_max < s/2) sampled for the θ-vs-p_max figure; every dominant row is added."""
_CHECKPOINT_TABLES = ("rows", "summary", "bounds")

# θ of a dominant row with stored sum s is s − 4(p_max − s/2)² = 4 p_max (s − p_max) + s (1 − s)
# (docs/architecture.md "θ semantics"); for s = 1 this is 4 p_max (1 − p_max), docs/math.md T2(a).
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
class CertificateQuality:
    """Per run_id: exact share, float32-resolution share and width quantiles (``summary``); rows per stage."""

    summary: pd.DataFrame
    methods: pd.DataFrame


FLOAT32_RESOLUTION = 2.0**-25
"""The default certification target: an interval no wider than this is exact at float32 resolution."""


@dataclass(frozen=True, kw_only=True)
class RunData:
    """The tables of one run directory as DataFrames (None where the run has no such table).

    ``cells``: per-(run_id, step, seed, layer) aggregates over all rows and over the core rows (report.cells);
    ``finding_rows``: the columns of every audited row the findings are judged on (report.run_statistics);
    ``dominant_checks``: the closed-form check of dominant rows per run_id; ``run_kinds``: what each run_id is
    (``"training"``, ``"checkpoint"`` or ``"pretrained"``, see _run_kinds); ``baselines``: the study's n-gram
    baselines and parameter counts.
    """

    run_dir: Path
    tables: tuple[str, ...]
    manifest: dict[str, Any] | None
    summary: pd.DataFrame | None
    rows_sample: pd.DataFrame | None
    training: pd.DataFrame | None
    grad_norms: pd.DataFrame | None
    bounds: pd.DataFrame | None
    influence: pd.DataFrame | None
    cells: pd.DataFrame | None = None
    dominant_checks: dict[str, DominantCheck] = field(default_factory=dict)
    run_kinds: dict[str, str] = field(default_factory=dict)
    baselines: pd.DataFrame | None = None
    certificates: CertificateQuality | None = None
    overview: dict[str, Any] = field(default_factory=dict)
    check: RunCheck | None = None
    finding_rows: pd.DataFrame | None = None
    influence_summaries: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


def load_run(run_dir: str | os.PathLike[str], *, force: bool = False) -> RunData:
    """Read the run's tables for the report, after checking the folder against its manifest.

    Raises RunIntegrityError when the check fails and ``force`` is False (with ``force`` the check's problems
    travel in ``RunData.check`` to the report's banner); FileFormatError if the directory is missing or holds
    no tables.
    """
    root = Path(run_dir)
    check = verify_run(root)
    connection, tables = connect(root, force=force, check=check)
    try:

        def table(name: str, order: str) -> pd.DataFrame | None:
            if name not in tables:
                return None
            return connection.execute(f'SELECT * FROM "{name}" ORDER BY {order}').df()

        summary = table("summary", "run_id, step, seed, layer, head")
        rows_sample, cells, checks, certificates, finding_rows = None, None, {}, None, None
        if "rows" in tables:
            finding_rows = connection.execute(FINDING_ROWS_SQL).df()
            certificates = _certificate_quality(connection)
            summary = _with_layer_records(summary, connection)
            rows_sample = _scatter_rows(connection)
            checks = _dominant_checks(connection)
            cells = layer_cells(connection)
        training = table("training", "run_id, seed, step")
        data = RunData(
            run_dir=root,
            tables=tuple(tables),
            manifest=_read_manifest(root) or _first_file_record(tables),
            summary=summary,
            rows_sample=rows_sample,
            training=training,
            grad_norms=table("grad_norms", "run_id, seed, step, layer"),
            bounds=table("bounds", "run_id, step, seed, layer, head"),
            influence=table("influence", "run_id, model, position_kind, n"),
            cells=cells,
            dominant_checks=checks,
            run_kinds=_run_kinds(cells, training),
            baselines=table("baselines", "run_id, name"),
            certificates=certificates,
            check=check,
            finding_rows=finding_rows,
            influence_summaries=_influence_summaries(tables.get("influence", [])),
        )
        return _with_overview(data, connection, tables)
    finally:
        connection.close()


def _with_layer_records(summary: pd.DataFrame | None, connection: Any) -> pd.DataFrame:
    """Summary with per-layer (head = -1) records, computed from the rows where the stored summary lacks them."""
    if summary is not None and (summary["head"] == ALL_HEADS).any():
        return summary
    level: Literal["both", "layer"] = "both" if summary is None else "layer"
    computed = summarize_rows(connection.execute(f"SELECT {_SUMMARY_INPUT_COLUMNS} FROM rows").df(), level=level)
    return computed if summary is None else pd.concat([summary, computed], ignore_index=True)


_DOMINANT_CHECK_SQL = (
    "count(*), count(*) FILTER (WHERE dominant), "
    "avg(CAST(theta_exact AS DOUBLE)) FILTER (WHERE dominant), "
    f"max(abs(theta_lower - {CLOSED_FORM_SQL})) FILTER (WHERE dominant), "
    f"max(abs(theta_upper - {CLOSED_FORM_SQL})) FILTER (WHERE dominant)"
)


def _check(record: tuple) -> DominantCheck:
    return DominantCheck(
        n_rows=int(record[0]),
        n_dominant=int(record[1]),
        fraction_exact_among_dominant=record[2],
        max_abs_deviation_lower=record[3],
        max_abs_deviation_upper=record[4],
    )


def _dominant_checks(connection: Any) -> dict[str, DominantCheck]:
    records = connection.execute(f"SELECT run_id, {_DOMINANT_CHECK_SQL} FROM rows GROUP BY run_id").fetchall()
    return {str(record[0]): _check(record[1:]) for record in records}


def _scatter_rows(connection: Any) -> pd.DataFrame:
    """Every dominant row and a fixed-seed reservoir sample of the others, for the θ-vs-p_max figure."""
    columns = "run_id, p_max, theta_lower, theta_upper, dominant, row_sum"
    dominant = connection.execute(f"SELECT {columns} FROM rows WHERE dominant").df()
    others = connection.execute(
        f"SELECT {columns} FROM (SELECT {columns} FROM rows WHERE NOT dominant) "
        f"USING SAMPLE reservoir({SCATTER_SAMPLE_ROWS} ROWS) REPEATABLE (0)"
    ).df()
    return pd.concat([others, dominant], ignore_index=True)


def _certificate_quality(connection: Any) -> CertificateQuality:
    from attnsens.theta import ThetaMethod

    width = "(theta_upper - theta_lower)"
    summary = connection.execute(
        "SELECT run_id AS run, count(*) AS rows, avg(CAST(theta_exact AS DOUBLE)) AS exact, "
        f'avg(CAST({width} <= {FLOAT32_RESOLUTION!r} AS DOUBLE)) AS "width ≤ 2^-25", '
        f'median({width}) AS "median width", quantile_cont({width}, 0.99) AS "99 % width", '
        f'max({width}) AS "max width" FROM rows GROUP BY run_id ORDER BY run_id'
    ).df()
    methods = connection.execute(
        "SELECT run_id AS run, theta_method AS code, count(*) AS rows, avg(CAST(theta_exact AS DOUBLE)) AS exact, "
        f'max({width}) AS "max width" FROM rows GROUP BY ALL ORDER BY run_id, code'
    ).df()
    names = {int(m): m.name.lower().replace("_", " ") for m in ThetaMethod}
    methods.insert(2, "stage", [names.get(int(code), f"code {int(code)}") for code in methods["code"]])
    return CertificateQuality(summary=summary, methods=methods.drop(columns="code"))


def _run_kinds(cells: pd.DataFrame | None, training: pd.DataFrame | None) -> dict[str, str]:
    """Per run_id: ``training`` (a training log or several audited checkpoints), ``checkpoint`` (one step > 0
    without a log) or ``pretrained`` (a static model, recorded as step 0, audited once)."""
    if cells is None:
        return {}
    trained = set() if training is None else {str(r) for r in training["run_id"].unique()}
    kinds = {}
    for run, steps in cells.groupby("run_id")["step"]:
        if str(run) in trained or steps.nunique() > 1:
            kinds[str(run)] = "training"
        else:
            kinds[str(run)] = "pretrained" if int(steps.iloc[0]) == 0 else "checkpoint"
    return kinds


def _influence_summaries(files: list[Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(run_id, model) → the experiment's summary stored with each influence file (``InfluenceResult.summary``:
    certified and input-set constants, per-layer A_k and p_max·n); files written without one are left out."""
    import pyarrow.parquet as pq

    from attnsens.store.parquet import read_metadata

    summaries = {}
    for file in files:
        try:
            summary = read_metadata(file).get("metadata", {})
            keys = pq.read_table(file, columns=["run_id", "model"]).slice(0, 1).to_pylist()
        except (OSError, ValueError, KeyError):
            continue
        if keys and summary.get("model") is not None:
            summaries[str(keys[0]["run_id"]), str(keys[0]["model"])] = summary
    return summaries


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
        # The baselines table describes the study as a whole (run_id = study name): not a run of its own.
        wanted = [] if name == "baselines" else ["model", "run_id", "seed"]
        wanted += ["step"] if name in _CHECKPOINT_TABLES else []
        for column in (c for c in wanted if c in columns):
            values = connection.execute(f'SELECT DISTINCT "{column}" FROM "{name}" ORDER BY 1').fetchall()
            overview.setdefault(column, set()).update(v[0] for v in values if v[0] is not None)
    overview = {k: sorted(v) if isinstance(v, set) else v for k, v in overview.items()}
    if data.training is not None and not data.training.empty:
        overview["training_steps"] = int(data.training["step"].max())
    if data.summary is not None and not data.summary.empty:
        overview["shapes"] = layer_head_shapes(data.summary)
    return replace(data, overview=overview)


def layer_head_shapes(summary: pd.DataFrame) -> dict[str, tuple[int, int | None]]:
    """(layers, heads) of each run in ``summary`` (heads None where only pooled records exist), by run_id: a
    study holds runs of different models (a tiny GPT and a pretrained reference), each with its own shape."""
    shapes: dict[str, tuple[int, int | None]] = {}
    for run, part in summary.groupby("run_id", sort=True):
        heads = part.loc[part["head"] != ALL_HEADS, "head"]
        shapes[str(run)] = (int(part["layer"].max()) + 1, None if heads.empty else int(heads.max()) + 1)
    return shapes
