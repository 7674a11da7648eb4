"""Output people and scripts can read: query precision and width, strict JSON, help that matches the flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import attnsens
from attnsens.cli import app
from attnsens.store import Manifest, write_parquet

runner = CliRunner()
NEAR_ONE = 0.9999999999999999  # the float just below 1


@pytest.fixture
def results(tmp_path: Path) -> Path:
    columns = {"layer": [0, 1, 2], "theta_lower": [0.99999987, 1.0, NEAR_ONE]}
    columns.update({f"a_rather_long_column_name_{i}": [0.123456789, 2.5, float("nan")] for i in range(6)})
    write_parquet(columns, tmp_path / "rows" / "part.parquet")
    Manifest.open(tmp_path).record("rows/part.parquet", table="rows")  # query reads only verified folders
    return tmp_path


def test_query_table_keeps_the_digits_that_tell_theta_from_one(results: Path) -> None:
    result = runner.invoke(app, ["query", str(results), "SELECT layer, theta_lower FROM rows ORDER BY layer"])
    assert result.exit_code == 0, result.output
    cells = [line.split("│")[2].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    assert cells == ["0.99999987", "1", repr(NEAR_ONE)]  # only the exact 1 prints as 1


def test_query_wide_json_csv_are_full_precision(results: Path) -> None:
    sql = "SELECT * FROM rows ORDER BY layer"
    wide = runner.invoke(app, ["query", str(results), sql, "--wide"], env={"COLUMNS": "80"})
    assert wide.exit_code == 0, wide.output
    assert "…" not in wide.stdout and "0.123456789" in wide.stdout
    assert max(len(line) for line in wide.stdout.splitlines()) > 80  # wider than the terminal, nothing cut
    records = json.loads(runner.invoke(app, ["query", str(results), sql, "--json"]).stdout)
    assert records[2]["theta_lower"] == NEAR_ONE and records[2]["a_rather_long_column_name_0"] is None
    csv = runner.invoke(app, ["query", str(results), sql, "--csv"]).stdout
    assert repr(NEAR_ONE) in csv


def test_query_narrow_terminal_wraps_instead_of_cutting(results: Path) -> None:
    result = runner.invoke(app, ["query", str(results), "SELECT * FROM rows"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    # Columns are shown whole, from the left, as many as fit; the rest are named (they used to be squeezed into
    # columns one character wide, every header and value folded letter by letter).
    table, note = result.stdout.split("row(s)")
    header = next(line for line in table.splitlines() if "layer" in line)
    assert "theta_lower" in header and "a_rather_long_column_name_0" in header
    assert "a_rather_long_column_name_5" not in table
    assert "columns do not fit in 80 characters and are not shown:" in note
    assert "a_rather_long_column_name_5" in note.replace("\n", "")
    wide = runner.invoke(app, ["query", str(results), "SELECT * FROM rows", "--wide"], env={"COLUMNS": "80"})
    assert "a_rather_long_column_name_5" in wide.stdout.split("row(s)")[0] and "do not fit" not in wide.stdout


def test_influence_json_is_strict() -> None:
    result = runner.invoke(app, ["influence", "--lengths", "8,16,32", "--samples", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert "NaN" not in result.stdout
    json.loads(result.stdout, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))


def test_help_shows_flags_without_a_value_and_arguments_by_name() -> None:
    """No ``<bool>`` after any flag (--help included), and the usage line names arguments as a shell user writes
    them (MODEL, not typer's ``{model}``, which a shell reads as a brace expansion)."""
    for command in ("query", "audit", "theta", "warmup"):
        help_text = runner.invoke(app, [command, "--help"], env={"COLUMNS": "160"}).stdout
        assert "<bool>" not in help_text, command
        assert "{" not in help_text.splitlines()[1], help_text.splitlines()[1]
    usage = runner.invoke(app, ["audit", "--help"], env={"COLUMNS": "160"}).stdout.splitlines()[1]
    assert "MODEL" in usage and "{model}" not in usage
    assert "<bool>" not in runner.invoke(app, ["--help"], env={"COLUMNS": "160"}).stdout


@pytest.mark.parametrize(
    ("args", "as_json"),
    [
        (["--json"], True),
        (["--json", "true"], True),
        (["--json", "True"], True),
        (["--json=yes"], True),
        (["--json", "1"], True),
        (["--json", "false"], False),
        (["--json=no"], False),
    ],
)
def test_a_flag_takes_an_explicit_true_or_false(args: list[str], as_json: bool) -> None:
    """``--json true`` (as Hugging Face's argument parser takes ``--fp16 True``) means ``--json``; false leaves it
    off. A value that is not a truth value stays an extra argument, a usage error."""
    result = runner.invoke(app, ["version", *args])
    assert result.exit_code == 0, result.output
    assert result.stdout.lstrip().startswith("{") is as_json, result.stdout
    assert runner.invoke(app, ["version", "--json", "maybe"]).exit_code == 2


def test_version_flag_and_module_entry_point() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"attnsens {attnsens.__version__}"
    module = subprocess.run([sys.executable, "-m", "attnsens", "--version"], capture_output=True, text=True)
    assert module.returncode == 0 and module.stdout.strip() == f"attnsens {attnsens.__version__}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_attention_certifies_with_the_default_tolerance(tmp_path: Path, dtype: str) -> None:
    import torch

    probabilities = torch.softmax(torch.randn(4, 2, 64, 64) * 4, -1).to(getattr(torch, dtype))
    if dtype == "bfloat16":
        assert float((probabilities.double().sum(-1) - 1).abs().max()) > 1e-3  # the old fixed tolerance refused it
    torch.save(probabilities, tmp_path / "attention.pt")
    result = runner.invoke(app, ["theta", str(tmp_path / "attention.pt"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == 4 * 2 * 64


def test_theta_exact_support_notes_the_rows_it_may_enumerate(tmp_path: Path) -> None:
    """Rows of 33–48 keys may take milliseconds each: one note on stderr says how many; the JSON records the flag."""
    import numpy as np
    import torch

    rows = torch.softmax(torch.randn(4, 40), dim=-1)
    rows[1, 35:] = 0.0
    rows = rows / rows.sum(-1, keepdim=True)
    path = tmp_path / "rows.npy"
    np.save(path, rows.numpy())
    result = runner.invoke(app, ["theta", str(path), "--exact-support", "40", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("note: 4 rows have 33–40 non-zero keys") == 1
    summary = json.loads(result.stdout)
    assert summary["exact_support"] == 40
    assert summary["exact_fraction"] == 1.0


def test_theta_of_a_tensor_without_rows_reports_none(tmp_path: Path) -> None:
    """A (0, n) tensor has nothing to certify: a summary of 0 rows and an empty rows file, not a traceback."""
    import numpy as np
    import pandas as pd

    np.save(tmp_path / "none.npy", np.zeros((0, 5), np.float32))
    result = runner.invoke(
        app, ["theta", str(tmp_path / "none.npy"), "--json", "--out", str(tmp_path / "rows.parquet")]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == 0
    assert len(pd.read_parquet(tmp_path / "rows.parquet")) == 0
