"""attnsens query is read-only and confined to the run: DuckDB's own settings refuse every write, attach,
extension and configuration change, and every file outside the run; each refusal is one line naming what is
allowed. A folder without a manifest is refused unless forced."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.errors import QueryError, RunIntegrityError
from attnsens.store import write_parquet
from attnsens.store.manifest import sha256_file
from attnsens.store.query import connect, query
from tests.unit.store.synthetic import write_synthetic_run

runner = CliRunner()
UNIT = "rows/seed=0/step=000010.parquet"
ALLOWED = "only SELECT statements over this run's tables"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_run(tmp_path_factory.mktemp("run"))


def _refused(run_dir: Path, sql: str) -> str:
    with pytest.raises(QueryError) as caught:
        query(run_dir, sql)
    message = str(caught.value)
    assert "\n" not in message and ALLOWED in message and "(rows, summary" not in message, message
    return message


def test_copy_over_a_unit_is_refused_and_the_unit_is_unchanged(run_dir, tmp_path) -> None:
    before = sha256_file(run_dir / UNIT)
    for options in ("(FORMAT parquet)", "(FORMAT parquet, USE_TMP_FILE false)"):
        message = _refused(run_dir, f"COPY (SELECT 'junk' AS x) TO '{run_dir / UNIT}' {options}")
        assert "COPY" in message
    assert sha256_file(run_dir / UNIT) == before
    _refused(run_dir, f"COPY (SELECT 1 AS x) TO '{tmp_path / 'x.csv'}'")
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize(
    "statement",
    [
        "ATTACH '{tmp}/x.duckdb'",
        "EXPORT DATABASE '{tmp}/export'",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET allowed_directories = ['/']",
        "RESET lock_configuration",
        "PRAGMA enable_profiling",
        "IMPORT DATABASE '{tmp}/export'",
        "CREATE TABLE t AS SELECT 1",
        "CALL pragma_version()",
        "EXPLAIN ANALYZE COPY (SELECT 1) TO '{tmp}/y.csv'",
        "UPDATE EXTENSIONS",
        "SELECT 1; COPY (SELECT 1) TO '{tmp}/z.csv'",
    ],
)
def test_every_statement_but_select_is_refused(run_dir, tmp_path, statement) -> None:
    _refused(run_dir, statement.format(tmp=tmp_path))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM read_parquet('{outside}')",
    ],
)
def test_files_outside_the_run_are_not_read(run_dir, tmp_path, sql) -> None:
    outside = tmp_path / "outside.parquet"
    write_parquet({"secret": [42]}, outside)
    message = _refused(run_dir, sql.format(outside=outside))
    assert "42" not in message


def test_selects_over_the_run_still_work(run_dir) -> None:
    """DESCRIBE, SUMMARIZE, FROM-first queries and reading a run's own file by path are SELECTs over the run."""
    assert len(query(run_dir, "DESCRIBE rows")) > 5
    assert len(query(run_dir, "FROM summary LIMIT 3")) == 3
    assert query(run_dir, f"SELECT count(*) AS n FROM read_parquet('{run_dir / UNIT}')").n.item() > 0


def test_the_connection_cannot_be_widened(run_dir) -> None:
    """The guarantee rests on DuckDB's locked settings, whatever runs on the connection (report reads use it)."""
    import duckdb

    connection, _ = connect(run_dir)
    try:
        settings = dict(connection.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN ('enable_external_access', 'lock_configuration', "
            "'autoinstall_known_extensions', 'autoload_known_extensions')"
        ).fetchall())  # fmt: skip
        assert settings == {
            "enable_external_access": "false", "lock_configuration": "true",
            "autoinstall_known_extensions": "false", "autoload_known_extensions": "false",
        }  # fmt: skip
        with pytest.raises(duckdb.Error):
            connection.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.PermissionException):
            connection.execute("SELECT * FROM read_csv('/etc/passwd')")
    finally:
        connection.close()


def test_cli_refusals_are_one_line(run_dir) -> None:
    before = sha256_file(run_dir / UNIT)
    result = runner.invoke(app, ["query", str(run_dir), f"COPY (SELECT 'junk' AS x) TO '{run_dir / UNIT}'"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and ALLOWED in result.output
    assert sha256_file(run_dir / UNIT) == before


def test_a_folder_without_a_manifest_is_refused_unless_forced(tmp_path) -> None:
    write_parquet({"a": [1, 2]}, tmp_path / "t" / "x.parquet")
    with pytest.raises(RunIntegrityError, match=r"has no manifest\.json.*pass --force"):
        query(tmp_path, "SELECT * FROM t")
    assert query(tmp_path, "SELECT sum(a) AS s FROM t", force=True).s.item() == 3

    refused = runner.invoke(app, ["query", str(tmp_path), "SELECT * FROM t"])
    assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1
    assert "no manifest.json" in refused.output and "--force" in refused.output
    forced = runner.invoke(app, ["query", str(tmp_path), "SELECT count(*) AS n FROM t", "--csv", "--force"])
    assert forced.exit_code == 0, forced.output
    assert forced.stdout.splitlines() == ["n", "2"]
    assert "warning:" in forced.stderr and "not verified" in forced.stderr
