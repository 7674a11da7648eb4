"""``attnsens influence``: table, --json shape, --out Parquet, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from attnsens.cli import app

runner = CliRunner()
ARGS = ["influence", "--model", "builtin:lnfree", "--lengths", "8,16,32,64", "--samples", "1"]


def test_json_shape() -> None:
    result = runner.invoke(app, [*ARGS, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert {"slope", "slope_ci", "certified_C", "log10_certified_C", "measured"} <= set(payload)
    assert payload["certified_C"] == 10 ** payload["log10_certified_C"]
    assert [row["n"] for row in payload["measured"]] == [8, 16, 32, 64]
    for row in payload["measured"]:
        assert set(row) == {"n", "influence", "certified_bound", "tv"}
        assert row["influence"] <= row["certified_bound"]
        assert math.isclose(row["certified_bound"], payload["certified_C"] / row["n"], rel_tol=1e-9)
    low, high = payload["slope_ci"]
    assert low < payload["slope"] < high


def test_table_and_parquet_output(tmp_path: Path) -> None:
    from attnsens.store import read_table

    result = runner.invoke(app, [*ARGS, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "certified" in result.output and "slope" in result.output
    frame = read_table(tmp_path / "influence" / "builtin_lnfree.parquet")
    assert len(frame) == 4 * 3 and set(frame.model) == {"builtin:lnfree"}
    assert (frame.influence_max <= frame.influence_upper_bound).all()


def test_bad_lengths_are_one_red_line() -> None:
    result = runner.invoke(app, ["influence", "--lengths", "8,x"])
    assert result.exit_code == 1
    assert "comma-separated integers" in result.output
