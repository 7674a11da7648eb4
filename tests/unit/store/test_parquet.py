"""Atomic Parquet writes: provenance in metadata, no partial file after an interrupted write."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from attnsens.errors import FileFormatError, InputError
from attnsens.store import parquet, read_metadata, read_table, write_parquet


def test_metadata_holds_provenance_and_config(tmp_path):
    path = write_parquet(pd.DataFrame({"a": [1, 2]}), tmp_path / "t.parquet", metadata={"config": {"lr": 0.1}})
    record = read_metadata(path)
    assert record["metadata"] == {"config": {"lr": 0.1}}
    assert {"argv", "git_sha", "versions", "created_utc"} <= set(record["provenance"])
    assert "pyarrow" in record["provenance"]["versions"]
    json.dumps(record)


class _Boom(RuntimeError):
    pass


def test_interrupted_write_keeps_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "data" / "t.parquet"
    write_parquet({"a": [1, 2, 3]}, target)
    before = target.read_bytes()

    real_write_table = pq.write_table

    def write_half_then_fail(table, where, **kwargs):
        real_write_table(table.slice(0, 1), where, **kwargs)
        raise _Boom("disk full")

    monkeypatch.setattr(parquet.pq, "write_table", write_half_then_fail)
    with pytest.raises(_Boom):
        write_parquet({"a": [7, 8, 9, 10]}, target)

    assert target.read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir()) == ["t.parquet"]
    assert read_table(target)["a"].tolist() == [1, 2, 3]


def test_interrupted_first_write_leaves_nothing(tmp_path, monkeypatch):
    def fail(table, where, **kwargs):
        with open(where, "wb") as handle:
            handle.write(b"PAR1 partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(parquet.pq, "write_table", fail)
    with pytest.raises(KeyboardInterrupt):
        write_parquet({"a": [1]}, tmp_path / "t.parquet")
    assert list(tmp_path.iterdir()) == []


def test_read_table_unions_nested_files_and_ignores_temporaries(tmp_path):
    write_parquet({"a": [1], "b": ["x"]}, tmp_path / "seed=0" / "p.parquet")
    write_parquet({"a": [2]}, tmp_path / "seed=1" / "p.parquet")
    (tmp_path / "seed=1" / ".p.parquet.123.tmp").write_bytes(b"junk")
    frame = read_table(tmp_path)
    assert frame["a"].tolist() == [1, 2]
    assert frame["b"].tolist()[0] == "x" and pd.isna(frame["b"].tolist()[1])


def test_read_errors_name_the_path(tmp_path):
    with pytest.raises(FileFormatError, match="no Parquet file or directory"):
        read_table(tmp_path / "missing")
    with pytest.raises(FileFormatError, match=r"no \*\.parquet files"):
        read_table(tmp_path)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(FileFormatError, match="cannot read Parquet"):
        read_table(tmp_path / "bad.parquet")


_PARTS = [
    {"run_id": ["r"], "seed": [0], "step": [0], "loss": [1.0], "lr": [0.1], "grad_norm_global": [1.0],
     "tokens_seen": [64], "wall_time_s": [0.5]},
    {"run_id": ["r", "r"], "seed": [0, 0], "step": [1, 2], "loss": [0.9, 0.8], "lr": [0.1, 0.1],
     "grad_norm_global": [2.0, 3.0], "tokens_seen": [128, 192], "wall_time_s": [1.0, 1.5]},
]  # fmt: skip


def test_a_file_written_in_parts_is_the_file_written_whole_with_a_row_group_per_part(tmp_path):
    whole = write_parquet(pd.concat([pd.DataFrame(p) for p in _PARTS]), tmp_path / "whole.parquet", schema="training",
                          metadata={"config": {"lr": 0.1}})  # fmt: skip
    with parquet.parquet_parts(tmp_path / "parts.parquet", schema="training", metadata={"config": {"lr": 0.1}}) as put:
        for part in _PARTS:
            put(part)
    parts = tmp_path / "parts.parquet"
    assert pq.ParquetFile(parts).num_row_groups == 2
    assert pq.read_table(parts).equals(pq.read_table(whole), check_metadata=False)
    assert pq.read_schema(parts).equals(pq.read_schema(whole), check_metadata=False)
    written, expected = read_metadata(parts), read_metadata(whole)
    assert written["table"] == expected["table"] == "training"
    assert written["metadata"] == expected["metadata"] == {"config": {"lr": 0.1}}


def test_parts_interrupted_keep_the_old_file_and_leave_no_temporary(tmp_path):
    target = tmp_path / "t.parquet"
    write_parquet(_PARTS[0], target, schema="training")
    before = target.read_bytes()
    with pytest.raises(KeyboardInterrupt), parquet.parquet_parts(target, schema="training") as put:
        put(_PARTS[1])
        raise KeyboardInterrupt
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]
    with (
        pytest.raises(InputError, match="step"),
        parquet.parquet_parts(tmp_path / "new.parquet", schema="training") as put,
    ):
        put({**_PARTS[0], "step": [0.5]})  # a part that does not fit the schema fails like a whole table would
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]
