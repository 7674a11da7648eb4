"""schema.py: every table round-trips through Parquet and DuckDB with its dtypes; names follow the house rules."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from attnsens.errors import ConfigError
from attnsens.store import TABLES, get_schema, write_parquet
from attnsens.store.parquet import conform
from attnsens.store.query import connect

_DUCKDB_TYPES = {
    "string": "VARCHAR",
    "int64": "BIGINT",
    "int32": "INTEGER",
    "int8": "TINYINT",
    "double": "DOUBLE",
    "bool": "BOOLEAN",
}


def _example(schema, n: int = 7) -> pa.Table:
    """n records with a distinct, type-appropriate value in every column (nulls in every other nullable cell)."""
    rng = np.random.default_rng(3)
    arrays = []
    for column in schema.columns:
        if pa.types.is_string(column.dtype):
            values = [f"{column.name}-{i}" for i in range(n)]
        elif pa.types.is_boolean(column.dtype):
            values = [bool(i % 2) for i in range(n)]
        elif pa.types.is_integer(column.dtype):
            values = [int(v) for v in rng.integers(-1, 100, n)]
        else:
            values = [float(v) for v in rng.random(n)]
        if column.nullable:
            values = [v if i % 2 else None for i, v in enumerate(values)]
        arrays.append(pa.array(values, type=column.dtype))
    return pa.Table.from_arrays(arrays, schema=schema.arrow_schema())


@pytest.mark.parametrize("name", sorted(TABLES))
def test_table_round_trips_through_parquet_and_duckdb(tmp_path, name):
    schema = get_schema(name)
    table = _example(schema)
    write_parquet(table, tmp_path / name / "part.parquet", schema=name)

    import pyarrow.parquet as pq

    back = pq.read_table(tmp_path / name / "part.parquet")
    assert back.schema.equals(schema.arrow_schema(), check_metadata=False)
    assert back.replace_schema_metadata(None).equals(table)

    connection, _ = connect(tmp_path)
    described = dict(connection.execute(f'SELECT column_name, column_type FROM (DESCRIBE "{name}")').fetchall())
    assert list(described) == list(schema.names)
    assert described == {c.name: _DUCKDB_TYPES[str(c.dtype)] for c in schema.columns}
    from_duckdb = connection.sql(f'SELECT * FROM "{name}"').to_arrow_table()
    assert from_duckdb.to_pylist() == table.to_pylist()


def test_columns_follow_naming_rules():
    for schema in TABLES.values():
        for column in schema.columns:
            assert column.name == column.name.lower() and " " not in column.name, column.name
            assert column.doc, f"{schema.name}.{column.name} needs a doc"
            # bounds and estimates say what they are
            if "bound" in column.name:
                assert column.name.endswith(("_upper_bound", "_lower_bound")), column.name
        for key in ("layer", "head"):
            if key in schema.names:
                assert pa.types.is_integer(schema.column(key).dtype)


def test_conform_casts_and_rejects_with_a_named_fix():
    schema = get_schema("training")
    good = {
        "run_id": ["r"],
        "seed": np.array([0], dtype=np.int32),
        "step": [3],
        "loss": [1],
        "lr": [0.1],
        "grad_norm_global": [1.0],
        "tokens_seen": [10],
        "wall_time_s": [0.5],
    }
    table = conform(good, schema)
    assert table.schema.field("seed").type == pa.int64()
    assert table.schema.field("loss").type == pa.float64()
    assert table.column("eval_loss").null_count == 1
    with pytest.raises(ValueError, match="needs column 'loss'"):
        conform({k: v for k, v in good.items() if k != "loss"}, schema)
    with pytest.raises(ValueError, match=r"\['extra'\].*schema.py"):
        conform({**good, "extra": [1]}, schema)
    with pytest.raises(ValueError, match="'step'"):
        conform({**good, "step": [2.5]}, schema)
    with pytest.raises(ValueError, match="'loss' has 1 nulls"):
        conform({**good, "loss": [None]}, schema)


def test_unknown_table_names_the_known_ones():
    with pytest.raises(ConfigError, match="rows, summary"):
        get_schema("rowz")
