"""``attnsens warmup`` readies every kernel and says so, stage by stage."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnsens.cli import app

pytest.importorskip("numba")
runner = CliRunner()


def test_warmup_reports_each_stage_and_a_second_run_compiles_nothing() -> None:
    from attnsens.warmup import warmup_stages

    names = [name for name, _, _ in warmup_stages()]
    first = runner.invoke(app, ["warmup"])
    assert first.exit_code == 0, first.output
    progress = [line for line in first.stderr.splitlines() if line.startswith("[")]
    assert progress == [f"[{i}/{len(names)}] {name} …" for i, name in enumerate(names, start=1)]
    assert "note: compiling" not in first.stderr  # the stages say it themselves
    assert first.stdout.splitlines()[-1].startswith("kernels ready in ")
    again = runner.invoke(app, ["warmup", "--json"])
    assert again.exit_code == 0, again.output
    summary = json.loads(again.stdout)
    assert [stage["name"] for stage in summary["stages"]] == names
    assert not any(stage["compiled"] for stage in summary["stages"])
    assert summary["cache"].rsplit("/", 1)[-1].startswith("kernels-")
