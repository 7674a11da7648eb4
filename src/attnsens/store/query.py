"""DuckDB SQL over a run directory: every table of the run is a view named after it.

A table is a directory of Parquet files directly under the run directory (``RUN_DIR/rows/**/*.parquet``,
possibly nested per seed or step) or a single file ``RUN_DIR/<table>.parquet``. Files of one table are read
together with ``union_by_name``, so files written by different versions with extra nullable columns combine.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from attnsens.errors import FileFormatError, QueryError

if TYPE_CHECKING:
    import duckdb

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def discover_tables(run_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Tables of ``run_dir``: view name → DuckDB glob of its Parquet files. FileFormatError if the dir is missing."""
    root = Path(run_dir)
    if not root.is_dir():
        raise FileFormatError(f"run directory {str(root)!r} does not exist; pass the --out directory of a run")
    tables: dict[str, str] = {}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or not _IDENTIFIER.match(entry.stem):
            continue
        if entry.is_dir() and any(p.is_file() and not p.name.startswith(".") for p in entry.rglob("*.parquet")):
            tables[entry.name] = (entry / "**" / "*.parquet").as_posix()
        elif entry.is_file() and entry.suffix == ".parquet" and entry.stem not in tables:
            tables[entry.stem] = entry.as_posix()
    return tables


def connect(run_dir: str | os.PathLike[str]) -> tuple[duckdb.DuckDBPyConnection, dict[str, str]]:
    """An in-memory DuckDB connection with one view per table of ``run_dir``, and the table globs.

    Raises FileFormatError when the directory is missing or holds no Parquet tables.
    """
    import duckdb

    tables = discover_tables(run_dir)
    if not tables:
        raise FileFormatError(
            f"no Parquet tables under {str(run_dir)!r} (expected e.g. rows/*.parquet); run audit or study first"
        )
    connection = duckdb.connect(":memory:")
    for name, pattern in tables.items():
        quoted = pattern.replace("'", "''")
        try:
            connection.execute(
                f'CREATE VIEW "{name}" AS SELECT * FROM '
                f"read_parquet('{quoted}', union_by_name = true, hive_partitioning = false)"
            )
        except duckdb.Error as err:
            connection.close()
            raise FileFormatError(f"cannot read table {name!r} at {pattern!r}: {_one_line(err)}; rewrite it") from None
    return connection, tables


def query(run_dir: str | os.PathLike[str], sql: str) -> pd.DataFrame:
    """Run ``sql`` (DuckDB dialect) over the tables of ``run_dir`` and return the result as a DataFrame.

    >>> query("runs/tiny", "SELECT layer, median(theta_lower) FROM rows GROUP BY layer")  # doctest: +SKIP
    """
    import duckdb

    if not sql.strip():
        raise QueryError('the SQL query is empty; pass e.g. "SELECT * FROM summary LIMIT 10"')
    connection, tables = connect(run_dir)
    try:
        result = connection.execute(sql)
        if result.description is None:
            return pd.DataFrame()
        return result.df()
    except duckdb.Error as err:
        raise QueryError(f"{_one_line(err)} (tables in this run: {', '.join(tables)}); fix the SQL") from None
    finally:
        connection.close()


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())
