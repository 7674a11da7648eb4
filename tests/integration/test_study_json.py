"""``attnsens study --json`` prints the run's summary, and nothing else, on stdout."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from attnsens.cli import app
from tests.unit.train.conftest import synthetic_text


def test_study_json_prints_the_run_summary(tmp_path: Path) -> None:
    corpus = tmp_path / "verse.txt"
    corpus.write_text(synthetic_text(20_000))
    out = tmp_path / "study"
    args = ["study", "--config", "tiny", "--seeds", "0", "--steps", "2", "--batch-size", "2", "--no-bounds"]
    result = CliRunner().invoke(app, [*args, "--data", str(corpus), "--threads", "1", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output

    summary = json.loads(result.stdout)
    assert summary["out_dir"] == str(out)
    assert Path(summary["report"]).is_file() and Path(summary["report"]).parent == out
    assert summary["findings"] == str(out / "findings.json") and (out / "findings.json").is_file()
    assert summary["seeds"] == [0] and summary["placements"] == ["pre"] and summary["steps"] == 2
    assert summary["train_seconds"] > 0 and summary["audit_seconds"] > 0
    assert summary["config"]["seeds"] == [0] and summary["config"]["bounds"] is False
