"""attnsens query: Python API and CLI (table, --json, --csv, errors)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.errors import FileFormatError, QueryError
from attnsens.store import write_parquet
from attnsens.store.query import discover_tables, query
from tests.unit.store.synthetic import SEEDS, STEPS, write_synthetic_run

runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("run"))


def test_every_table_is_a_view(run_dir):
    assert set(discover_tables(run_dir)) == {"rows", "summary", "training", "grad_norms", "bounds", "influence"}
    counts = query(run_dir, "SELECT seed, step, count(*) AS n FROM rows GROUP BY ALL ORDER BY ALL")
    assert len(counts) == len(SEEDS) * len(STEPS)
    assert counts.n.nunique() == 1


def test_nested_and_top_level_files_are_read(tmp_path):
    write_parquet({"a": [1]}, tmp_path / "t" / "x.parquet")
    write_parquet({"a": [2], "b": [3]}, tmp_path / "t" / "deep" / "er" / "y.parquet")
    write_parquet({"c": [4]}, tmp_path / "single.parquet")
    # A hand-made folder has no manifest: read with force.
    assert query(tmp_path, "SELECT a, b FROM t ORDER BY a", force=True).fillna(-1).values.tolist() == [[1, -1], [2, 3]]
    assert query(tmp_path, "SELECT c FROM single", force=True).c.tolist() == [4]


def test_tables_are_found_by_metadata_or_path_in_any_layout(tmp_path):
    training = {
        "run_id": ["r"],
        "seed": [0],
        "step": [1],
        "loss": [2.0],
        "lr": [0.1],
        "grad_norm_global": [1.0],
        "tokens_seen": [8],
        "wall_time_s": [0.1],
    }
    for seed in (0, 1):
        write_parquet({**training, "seed": [seed]}, tmp_path / f"seed={seed}" / "log.parquet", schema="training")
        write_parquet({"x": [seed]}, tmp_path / f"seed={seed}" / "extra" / "part.parquet")
    write_parquet({"y": [1]}, tmp_path / f"seed={seed}" / "loose.parquet")
    (tmp_path / ".hidden").mkdir()
    write_parquet({"z": [1]}, tmp_path / ".hidden" / "t.parquet")
    tables = discover_tables(tmp_path)
    assert {name: len(files) for name, files in tables.items()} == {"extra": 2, "loose": 1, "training": 2}
    assert query(tmp_path, "SELECT seed FROM training ORDER BY seed", force=True).seed.tolist() == [0, 1]


def test_a_corrupt_file_is_named(tmp_path):
    write_parquet({"a": [1]}, tmp_path / "t" / "good.parquet")
    (tmp_path / "t" / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(FileFormatError, match="cannot read table 't'"):
        query(tmp_path, "SELECT * FROM t")


def test_errors(tmp_path, run_dir):
    with pytest.raises(FileFormatError, match="does not exist"):
        query(tmp_path / "nope", "SELECT 1")
    with pytest.raises(FileFormatError, match="no Parquet tables"):
        query(tmp_path, "SELECT 1")
    with pytest.raises(QueryError, match=r"tables in this run: .*rows"):
        query(run_dir, "SELECT * FROM rowz")
    with pytest.raises(QueryError, match="empty"):
        query(run_dir, "  ")


def test_cli_table_json_csv(run_dir):
    sql = "SELECT layer, median(theta_lower) AS theta_lower_median FROM rows GROUP BY layer ORDER BY layer"
    result = runner.invoke(app, ["query", str(run_dir), sql])
    assert result.exit_code == 0, result.output
    assert "theta_lower_median" in result.output and "3 row(s)" in result.output

    result = runner.invoke(app, ["query", str(run_dir), sql, "--json"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.output)
    assert [r["layer"] for r in records] == [0, 1, 2]
    assert all(0.0 <= r["theta_lower_median"] <= 1.0 for r in records)

    result = runner.invoke(app, ["query", str(run_dir), sql, "--csv"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == "layer,theta_lower_median" and len(lines) == 4


def test_cli_errors_are_one_line(tmp_path, run_dir):
    result = runner.invoke(app, ["query", str(run_dir), "SELEC * FROM rows"])
    assert result.exit_code == 1
    assert "error:" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1

    result = runner.invoke(app, ["query", str(tmp_path / "missing"), "SELECT 1"])
    assert result.exit_code == 1 and "does not exist" in result.output


def test_cli_does_not_interpret_markup_in_values(tmp_path):
    write_parquet({"name": ["[bold]x[/bold]"]}, tmp_path / "t" / "a.parquet")
    result = runner.invoke(app, ["query", str(tmp_path), "SELECT name FROM t", "--force"])
    assert "[bold]x[/bold]" in result.output
