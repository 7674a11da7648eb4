"""Parquet files of the results store: validated against schema.py, written atomically, with provenance.

A file is either the old one or the complete new one, never a mix: the data go to a hidden temporary file in
the same directory, are flushed to disk (fsync), then renamed over the target (``os.replace`` is atomic on
POSIX and Windows). Temporary names start with ``.`` and end with ``.tmp``, so readers never pick them up.
A write that fails (disk full, read-only folder) removes its temporary file and raises OutputWriteError, one
line naming the folder: the folder is exactly as it was before the write began.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from attnsens.errors import FileFormatError, InputError, OutputWriteError
from attnsens.provenance import provenance
from attnsens.store.schema import TableSchema, get_schema

METADATA_KEY = b"attnsens"


def to_arrow(data: pa.Table | pd.DataFrame | Mapping[str, Any]) -> pa.Table:
    """``data`` as a pyarrow Table (a DataFrame loses its index; a dict maps column names to sequences)."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pd.DataFrame):
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, Mapping):
        try:
            return pa.table({name: _as_array(values) for name, values in data.items()})
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise InputError(
                f"cannot build a table from the given columns ({err}); give equal-length 1-D columns"
            ) from None
    raise InputError(f"cannot write {type(data).__name__} as Parquet; give a pyarrow.Table, DataFrame or dict")


def _as_array(values: Any) -> Any:
    # torch tensors and numpy arrays both expose .numpy()/__array__; tensors must leave the GPU first.
    if hasattr(values, "detach"):
        return values.detach().cpu().numpy()
    return values


def conform(data: pa.Table | pd.DataFrame | Mapping[str, Any], schema: str | TableSchema) -> pa.Table:
    """``data`` cast to ``schema``: columns in schema order and dtype, absent nullable columns filled with null.

    Raises InputError for a missing required column, an unknown column, a null in a required column, or a
    value that does not fit the column's dtype (e.g. 2.5 into an integer column).
    """
    table_schema = get_schema(schema)
    table = to_arrow(data)
    unknown = [name for name in table.column_names if name not in table_schema.names]
    if unknown:
        raise InputError(
            f"columns {unknown} are not in the {table_schema.name!r} table; "
            f"drop them or add them to attnsens/store/schema.py"
        )
    arrays = []
    for column in table_schema.columns:
        if column.name not in table.column_names:
            if not column.nullable:
                raise InputError(f"the {table_schema.name!r} table needs column {column.name!r} ({column.doc})")
            arrays.append(pa.nulls(table.num_rows, type=column.dtype))
            continue
        values = table.column(column.name)
        try:
            values = values.cast(column.dtype, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
            raise InputError(
                f"column {column.name!r} of type {values.type} does not fit {column.dtype} ({err}); convert it first"
            ) from None
        if not column.nullable and values.null_count:
            raise InputError(f"column {column.name!r} has {values.null_count} nulls; it is required, fill it")
        arrays.append(values)
    return pa.Table.from_arrays(arrays, schema=table_schema.arrow_schema())


def write_parquet(
    data: pa.Table | pd.DataFrame | Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    schema: str | TableSchema | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``data`` to ``path`` atomically, with provenance and ``metadata`` in the Parquet file metadata.

    Args:
        data: a pyarrow Table, a pandas DataFrame or a dict of equal-length columns.
        path: target file; its directory is created.
        schema: a table name from schema.TABLES (or a TableSchema) to validate and cast against.
        metadata: JSON-serialisable extras (typically the run config); stored under ``"metadata"``.

    Returns:
        The path written. Read the metadata back with :func:`read_metadata`.
    """
    target = Path(path)
    table = conform(data, schema) if schema is not None else to_arrow(data)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), METADATA_KEY: _record(schema, metadata)})
    atomic_write(target, lambda tmp: pq.write_table(table, tmp))
    return target


@contextlib.contextmanager
def parquet_parts(
    path: str | os.PathLike[str], *, schema: str | TableSchema, metadata: Mapping[str, Any] | None = None
) -> Iterator[Callable[[pa.Table | pd.DataFrame | Mapping[str, Any]], None]]:
    """Write one Parquet file part by part: yields ``write(data)``, each call one row group of the table ``schema``.

    The file holds what :func:`write_parquet` would write for the parts concatenated (the same table, schema,
    provenance and ``metadata``; only the string columns get dictionary pages), and is as atomic: it appears at
    ``path`` only when the block ends without an error; on any error (also KeyboardInterrupt) the temporary file is
    removed and ``path`` keeps what it held. Nothing but the part being written is held in memory, so a table
    larger than memory can be written as it is produced.
    """
    target = Path(path)
    table_schema = get_schema(schema)
    arrow_schema = table_schema.arrow_schema()
    arrow_schema = arrow_schema.with_metadata(
        {**(arrow_schema.metadata or {}), METADATA_KEY: _record(schema, metadata)}
    )
    # Dictionary pages for the string columns only (run ids, model names: a few values repeated): the numeric
    # columns of a rows table have as many values as rows, and their dictionaries only cost time (a 553k-row table
    # written in 30 parts took 244 ms with all columns dictionary-encoded, 111 ms with only these, 29 MB both).
    strings = [field.name for field in arrow_schema if pa.types.is_string(field.type)]
    with _atomic_target(target) as tmp, pq.ParquetWriter(tmp, arrow_schema, use_dictionary=strings) as writer:

        def write(data: pa.Table | pd.DataFrame | Mapping[str, Any]) -> None:
            writer.write_table(conform(data, table_schema))

        yield write


def _record(schema: str | TableSchema | None, metadata: Mapping[str, Any] | None) -> bytes:
    """The attnsens record stored in a file's schema metadata: table name, provenance and ``metadata``."""
    record = {
        "table": get_schema(schema).name if schema is not None else None,
        "provenance": provenance(),
        "metadata": dict(metadata or {}),
    }
    try:
        return json.dumps(record, default=str, sort_keys=True).encode()
    except (TypeError, ValueError) as err:
        raise InputError(
            f"metadata is not JSON-serialisable ({err}); pass plain dicts, lists, numbers, strings"
        ) from None


def atomic_write(target: Path, write: Any) -> None:
    """Call ``write(tmp_path)``, fsync, and rename over ``target``; on any failure remove the temporary file.

    Raises OutputWriteError (naming the folder) when the file system refuses the write.
    """
    with _atomic_target(target) as tmp:
        write(tmp)


@contextlib.contextmanager
def _atomic_target(target: Path) -> Iterator[Path]:
    """A temporary path next to ``target`` to write; when the block ends without an error it is fsynced and renamed
    over ``target``, otherwise removed (see ``atomic_write``)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise output_write_error(target, err) from None
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(err, OSError):
            raise output_write_error(target, err) from None
        raise
    _fsync_dir(target.parent)


def output_write_error(target: Path, err: BaseException) -> OutputWriteError:
    """One line naming the folder that refused a write and what to do about it."""
    reason = err.strerror if isinstance(err, OSError) and err.strerror else " ".join(str(err).split())
    return OutputWriteError(
        f"cannot write {target.name} in {str(target.parent)!r} ({reason}); the folder is left as it was before "
        "this write: free some space or make it writable, then rerun the same command (or choose another --out)"
    )


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; directories cannot be opened this way on Windows.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def parquet_files(path_or_dir: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files at ``path_or_dir``: the file itself, or every ``*.parquet`` below the directory, sorted."""
    path = Path(path_or_dir)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileFormatError(f"no Parquet file or directory at {str(path)!r}; check the path")
    return sorted(p for p in path.rglob("*.parquet") if p.is_file() and not p.name.startswith("."))


def read_table(path_or_dir: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> pd.DataFrame:
    """Read one Parquet file, all of them below a directory, or the listed files in order (columns unioned by
    name), as a DataFrame."""
    if isinstance(path_or_dir, str | os.PathLike):
        files = parquet_files(path_or_dir)
        where = str(path_or_dir)
    else:
        files = [Path(f) for f in path_or_dir]
        if not files:
            raise InputError("read_table was given an empty list of files; give a file, a directory or some files")
        where = str(files[0].parent)
    if not files:
        raise FileFormatError(f"no *.parquet files under {where!r}; run the command that writes them")
    try:
        tables = [pq.read_table(f) for f in files]
    except (OSError, pa.ArrowInvalid) as err:
        raise FileFormatError(f"cannot read Parquet under {where!r} ({err}); rewrite the file") from None
    table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    return table.replace_schema_metadata(None).to_pandas()


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The attnsens record of a file written by :func:`write_parquet`: table, provenance, metadata."""
    try:
        raw = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid) as err:
        raise FileFormatError(f"cannot read Parquet metadata of {str(path)!r} ({err}); check the file") from None
    if METADATA_KEY not in raw:
        raise FileFormatError(f"{str(path)!r} carries no attnsens metadata; it was not written by attnsens")
    return json.loads(raw[METADATA_KEY])
