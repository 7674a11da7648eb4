"""The results store: fixed table schemas, atomic Parquet files with provenance, run manifests, DuckDB queries.

Typical use by a pipeline::

    from attnsens.store import Manifest
    manifest = Manifest.open(out_dir, config=asdict(config))
    unit = f"rows/seed={seed}/step={step:06d}.parquet"
    if not manifest.is_done(unit):
        manifest.write_unit(unit, rows_frame, schema="rows")
"""

from __future__ import annotations

from attnsens.store.manifest import Manifest, sha256_file
from attnsens.store.parquet import conform, read_metadata, read_table, write_parquet
from attnsens.store.schema import TABLES, Column, TableSchema, get_schema
from attnsens.store.summary import ALL_HEADS, summarize_rows

__all__ = [
    "ALL_HEADS",
    "TABLES",
    "Column",
    "Manifest",
    "TableSchema",
    "conform",
    "get_schema",
    "read_metadata",
    "read_table",
    "sha256_file",
    "summarize_rows",
    "write_parquet",
]
