"""``attnsens influence``: table, --json shape, --out Parquet, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.errors import InputError

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


def test_the_model_may_be_named_as_in_audit_and_bounds() -> None:
    """``attnsens influence MODEL`` as ``attnsens audit MODEL``: the same run as ``--model MODEL``."""
    by_option = json.loads(runner.invoke(app, [*ARGS, "--json"]).stdout)
    positional = runner.invoke(app, ["influence", "builtin:lnfree", *ARGS[3:], "--json"])
    assert positional.exit_code == 0, positional.output
    assert json.loads(positional.stdout) == by_option
    both = runner.invoke(app, ["influence", "minilm", *ARGS[1:]])
    assert both.exit_code == 1
    assert "MODEL 'minilm' and --model 'builtin:lnfree' name two models" in both.output


def test_the_default_lengths_stop_at_the_context() -> None:
    from types import SimpleNamespace

    from attnsens.cli.influence import _DEFAULT_LENGTHS, _within_context

    def adapter(context: int) -> SimpleNamespace:
        return SimpleNamespace(name="m", spec=SimpleNamespace(max_positions=context))

    assert _within_context(None, adapter(1 << 16), quiet=True) == list(_DEFAULT_LENGTHS)
    assert _within_context(None, adapter(512), quiet=True) == [16, 32, 64, 128, 256, 512]
    assert _within_context(None, adapter(300), quiet=True) == [16, 32, 64, 128, 256]
    assert _within_context([8, 16, 300], adapter(300), quiet=True) == [8, 16, 300]
    with pytest.raises(
        InputError, match=r"holds 2 of the default lengths, fewer than the 3 of a slope; give --lengths, e\.g\. 8,16,32"
    ):
        _within_context(None, adapter(40), quiet=True)


def test_a_model_without_an_output_distribution_has_no_tv() -> None:
    result = runner.invoke(app, ["influence", "minilm", "--lengths", "8,16,32", "--samples", "1"])
    assert result.exit_code == 0, result.output
    assert "nan" not in result.output
    assert "max TV: none, minilm has no language-model head" in " ".join(result.output.split())
