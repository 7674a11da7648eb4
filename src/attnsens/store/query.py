"""DuckDB SQL over a run directory: every table of the run is a view named after it.

Every ``*.parquet`` file below the run directory belongs to one table: the table recorded in its attnsens
metadata (files written with ``write_parquet(..., schema=...)``), otherwise the first directory below the run
directory whose name is an identifier (``rows/seed=0/step=000100.parquet`` → ``rows``), otherwise the file's
own name (``seed=0/training.parquet`` → ``training``). So a table may be a directory of files, nested per seed
or step, single files, or both. Files of one table are read together with ``union_by_name``, so files written
by different versions with extra nullable columns combine.

Before a folder is read it is checked against its manifest (``attnsens.store.verify``): a missing, changed,
misplaced, unreadable or extra unit stops the read with one line naming it, unless ``force`` is given; even
then unreadable files are left out, so one truncated file never blocks the other tables. :func:`query` also
refuses a folder without a manifest unless ``force``.

Confinement (guaranteed by DuckDB's own settings, not by reading the SQL text): once the views exist, the
connection may read only the run's own Parquet files (``allowed_paths``, ``enable_external_access = false``),
installs and loads no extension (autoinstall and autoload off), and its configuration is locked
(``lock_configuration``), so no statement can widen any of this. :func:`query` runs only statements that
DuckDB's parser classifies as SELECT: COPY, EXPORT, ATTACH, INSTALL/LOAD, SET, PRAGMA, CREATE and the rest are
refused before they run, so nothing is written, attached or configured.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow.parquet as pq

from attnsens.errors import FileFormatError, QueryError, RunIntegrityError
from attnsens.store.manifest import MANIFEST_NAME
from attnsens.store.parquet import METADATA_KEY
from attnsens.store.verify import IncompleteRunWarning, RunCheck, verify_run

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

    The folder is verified first (or ``check``, a :func:`verify_run` result, is used). The connection can read the
    tables' files and nothing else, and cannot change that (module docstring). Raises RunIntegrityError when the
    check fails and ``force`` is False; FileFormatError when the directory is missing or holds no tables.
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
    connection = duckdb.connect(
        ":memory:", config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    tables = {name: [file.absolute() for file in files] for name, files in tables.items()}
    for name, files in tables.items():
        listed = ", ".join(_literal(file.as_posix()) for file in files)
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
    _confine(connection, [file for files in tables.values() for file in files])
    return connection, tables


def _confine(connection: duckdb.DuckDBPyConnection, files: list[Path]) -> None:
    """Let ``connection`` read ``files`` and nothing else, for good (the order matters: the lock comes last)."""
    allowed = ", ".join(_literal(file.as_posix()) for file in files)
    connection.execute(f"SET allowed_paths = [{allowed}]")
    connection.execute("SET enable_external_access = false")
    connection.execute("SET lock_configuration = true")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def query(
    run_dir: str | os.PathLike[str], sql: str, *, force: bool = False, check: RunCheck | None = None
) -> pd.DataFrame:
    """Run ``sql`` (DuckDB dialect, SELECT statements only) over the tables of ``run_dir``; the result as a DataFrame.

    The folder must have a manifest and pass :func:`attnsens.store.verify.verify_run` unless ``force`` (see
    :func:`connect`). Guarantees: only the run's own Parquet files are read, and nothing is written, attached,
    installed or configured (module docstring). A run that is not complete (planned units absent, a writer still
    running) is read, with an :class:`~attnsens.store.verify.IncompleteRunWarning` naming what it lacks.

    Raises:
        QueryError naming what is allowed for any statement other than a SELECT and for a read outside the run;
        QueryError for SQL that fails; RunIntegrityError for a folder without a manifest (unless ``force``).

    >>> query("runs/tiny", "SELECT layer, median(theta_lower) FROM rows GROUP BY layer")  # doctest: +SKIP
    """
    import duckdb

    if not sql.strip():
        raise QueryError('the SQL query is empty; pass e.g. "SELECT * FROM summary LIMIT 10"')
    if check is None:
        check = verify_run(run_dir)
        if not check.complete:  # (a caller that passes its check, as the command line does, says it its own way)
            warnings.warn(check.incompleteness(), IncompleteRunWarning, stacklevel=2)
    connection, tables = connect(run_dir, force=force, check=check)
    if not check.has_manifest and not force:
        connection.close()
        raise RunIntegrityError(
            f"run folder {str(run_dir)!r} has no {MANIFEST_NAME}, so its files cannot be verified; query the --out "
            "folder of an attnsens run, or pass --force to read them anyway"
        )
    allowed = f"only SELECT statements over this run's tables ({', '.join(tables)}) are allowed"
    try:
        _refuse_all_but_select(connection, sql, allowed)
        result = connection.execute(sql)
        if result.description is None:
            return pd.DataFrame()
        return result.df()
    except duckdb.PermissionException as err:
        raise QueryError(f"{_one_line(err).split(' LINE ')[0]}: {allowed}, reading the run's own files") from None
    except duckdb.Error as err:
        raise QueryError(f"{_one_line(err)} (tables in this run: {', '.join(tables)}); fix the SQL") from None
    finally:
        connection.close()


def _refuse_all_but_select(connection: duckdb.DuckDBPyConnection, sql: str, allowed: str) -> None:
    """QueryError for any statement of ``sql`` that DuckDB's parser does not classify as a SELECT (DESCRIBE, SHOW,
    SUMMARIZE, VALUES and FROM-first queries are SELECTs)."""
    import duckdb

    kinds: list[duckdb.StatementType | None]
    try:
        statements = connection.extract_statements(sql)
        kinds = [statement.type for statement in statements]
    except ValueError:  # a statement kind the Python binding cannot name (UPDATE EXTENSIONS)
        kinds = [None]
    for kind in kinds:
        if kind != duckdb.StatementType.SELECT:
            what = "this statement" if kind is None else f"a {kind.name} statement"
            raise QueryError(f"{what} is refused: {allowed}; nothing is written, attached, installed or configured")


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())
