"""DuckDB SQL over a run directory: every table of the run is a view named after it.

Every ``*.parquet`` file below the run directory belongs to one table: the table recorded in its attnsens
metadata (files written with ``write_parquet(..., schema=...)``), otherwise the first directory below the run
directory whose name is an identifier (``rows/seed=0/step=000100.parquet`` → ``rows``), otherwise the file's
own name (``seed=0/training.parquet`` → ``training``). So a table may be a directory of files, nested per seed
or step, single files, or both. Files of one table are read together with ``union_by_name``, so files written
by different versions with extra nullable columns combine.

Before a folder is read it is checked against its manifest (``attnsens.store.verify``): a missing, changed,
misplaced, unreadable or extra unit stops the read with one line naming it, unless ``force`` is given; even
then unreadable files are left out, so one truncated file never blocks the other tables.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow.parquet as pq

from attnsens.errors import FileFormatError, QueryError
from attnsens.store.parquet import METADATA_KEY
from attnsens.store.verify import RunCheck, verify_run

if TYPE_CHECKING:
    import duckdb

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def discover_tables(run_dir: str | os.PathLike[str], *, skip: frozenset[Path] = frozenset()) -> dict[str, list[Path]]:
    """Tables of ``run_dir``: view name → its Parquet files (sorted), without those in ``skip``.

    Raises FileFormatError if the dir is missing.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise FileFormatError(f"run directory {str(root)!r} does not exist; pass the --out directory of a run")
    tables: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*.parquet")):
        parts = path.relative_to(root).parts
        if any(part.startswith(".") for part in parts) or not path.is_file() or path in skip:
            continue
        name = _table_name(path, parts)
        if name is not None:
            tables.setdefault(name, []).append(path)
    return dict(sorted(tables.items()))


def _table_name(path: Path, parts: tuple[str, ...]) -> str | None:
    try:
        raw = (pq.read_schema(path).metadata or {}).get(METADATA_KEY)
        recorded = json.loads(raw).get("table") if raw else None
    except (OSError, ValueError):
        recorded = None
    if isinstance(recorded, str) and _IDENTIFIER.match(recorded):
        return recorded
    for directory in parts[:-1]:
        if _IDENTIFIER.match(directory):
            return directory
    return path.stem if _IDENTIFIER.match(path.stem) else None


def connect(
    run_dir: str | os.PathLike[str], *, force: bool = False, check: RunCheck | None = None
) -> tuple[duckdb.DuckDBPyConnection, dict[str, list[Path]]]:
    """An in-memory DuckDB connection with one view per table of ``run_dir``, and the tables' files.

    The folder is verified first (or ``check``, a :func:`verify_run` result, is used). Raises RunIntegrityError
    when it fails and ``force`` is False; FileFormatError when the directory is missing or holds no tables.
    """
    import duckdb

    if check is None:
        check = verify_run(run_dir)
    if not force:
        check.raise_if_bad()
    tables = discover_tables(run_dir, skip=check.unreadable)
    if not tables:
        raise FileFormatError(
            f"no Parquet tables under {str(run_dir)!r} (expected e.g. rows/*.parquet); run audit or study first"
        )
    connection = duckdb.connect(":memory:")
    for name, files in tables.items():
        listed = ", ".join("'" + file.as_posix().replace("'", "''") + "'" for file in files)
        try:
            connection.execute(
                f'CREATE VIEW "{name}" AS SELECT * FROM '
                f"read_parquet([{listed}], union_by_name = true, hive_partitioning = false)"
            )
        except duckdb.Error as err:
            connection.close()
            raise FileFormatError(
                f"cannot read table {name!r} ({len(files)} file(s) under {str(run_dir)!r}): {_one_line(err)}; "
                "rewrite or remove the bad file"
            ) from None
    return connection, tables


def query(
    run_dir: str | os.PathLike[str], sql: str, *, force: bool = False, check: RunCheck | None = None
) -> pd.DataFrame:
    """Run ``sql`` (DuckDB dialect) over the tables of ``run_dir`` and return the result as a DataFrame.

    The folder must pass :func:`attnsens.store.verify.verify_run` unless ``force`` (see :func:`connect`).

    >>> query("runs/tiny", "SELECT layer, median(theta_lower) FROM rows GROUP BY layer")  # doctest: +SKIP
    """
    import duckdb

    if not sql.strip():
        raise QueryError('the SQL query is empty; pass e.g. "SELECT * FROM summary LIMIT 10"')
    connection, tables = connect(run_dir, force=force, check=check)
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
