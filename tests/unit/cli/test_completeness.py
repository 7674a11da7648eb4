"""Verified and complete: a run's manifest records what was planned; verify, report and query name the planned
units that are absent and a live writer; verify checks a study's checkpoints; the advice for a manifest that lacks
an entry rebuilds that unit, followed literally."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.report import build_report
from attnsens.store import Manifest
from attnsens.store.parquet import read_table
from attnsens.store.verify import verify_run
from tests.helpers.study import micro_study

REPO = Path(__file__).resolve().parents[3]
runner = CliRunner()
SEQUENCE_1 = "rows/sequence=000001.parquet"


def _attnsens(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]), "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "attnsens", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done


def _edit_manifest(run: Path, edit) -> None:
    payload = json.loads((run / "manifest.json").read_text())
    edit(payload)
    (run / "manifest.json").write_text(json.dumps(payload))


def _follow(advice: str, marker: str, cwd: Path) -> None:
    """Run the command quoted in ``advice`` after ``marker`` (between backticks), as a user would."""
    command = shlex.split(advice.split(f"{marker} `")[1].split("`")[0])
    assert command[0] == "attnsens"
    done = _attnsens(*command[1:], cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]


def _rows(path: Path) -> pd.DataFrame:
    return read_table(path).drop(columns=["wall_time_s"], errors="ignore")


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``attnsens audit`` of the built-in model, two sequences, written by the command line."""
    out = tmp_path_factory.mktemp("audit") / "run"
    done = _attnsens("audit", "builtin:lnfree", "--seq-len", "16", "--batch", "2", "--out", str(out), cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_an_audit_records_its_plan_and_verifies_complete(audited):
    manifest = Manifest.load(audited)
    assert manifest.planned_units == ["rows/sequence=000000.parquet", SEQUENCE_1, "summary/summary.parquet"]
    check = verify_run(audited)
    assert check.ok and check.complete and not check.absent and check.writer is None


@pytest.mark.parametrize("planned", [True, False], ids=["with_plan", "manifest_without_plan"])
def test_a_unit_left_out_of_the_manifest_is_rebuilt_by_following_the_advice(audited, tmp_path, planned):
    run = shutil.copytree(audited, tmp_path / "run")
    expected = _rows(run / SEQUENCE_1)

    def leave_out(payload: dict) -> None:
        del payload["units"][SEQUENCE_1]
        if not planned:  # a manifest written before plans were recorded
            del payload["planned"]

    _edit_manifest(run, leave_out)
    result = runner.invoke(app, ["verify", str(run)])
    assert result.exit_code == 1
    advice = result.output.strip().splitlines()[-1]
    assert "remove" not in advice and "delete" not in advice, advice
    if planned:
        assert f"absent     {SEQUENCE_1} (planned, not recorded)" in result.output
        assert "is not complete: 1 planned unit(s) absent (rows/sequence=000001.parquet)" in advice
        _follow(advice, "finish it with", cwd=tmp_path)
    else:
        assert f"extra      {SEQUENCE_1} (not in the manifest)" in result.output
        assert "(it recomputes and records the extra units;" in advice
        _follow(advice, "rebuild with", cwd=tmp_path)
    check = verify_run(run, rehash=True)
    assert check.ok and check.complete, check
    assert SEQUENCE_1 in Manifest.load(run).units
    pd.testing.assert_frame_equal(_rows(run / SEQUENCE_1), expected)  # the rows are back, not gone


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Path:
    from attnsens.study.study import run_study

    out = tmp_path_factory.mktemp("study") / "micro"
    run_study(micro_study(text_file, bounds=False, seeds=(0,)), out)
    return out


def test_a_finished_study_has_every_planned_unit_and_checkpoint(study):
    manifest = Manifest.load(study)
    assert manifest.planned_checkpoints == {"runs/placement=pre/seed=0": [0, 1, 2, 4]}
    assert set(manifest.planned_units) <= set(manifest.units)
    check = verify_run(study, rehash=True)
    assert check.ok and check.complete and check.checkpoints == 4, check
    result = runner.invoke(app, ["verify", str(study)])
    assert result.exit_code == 0, result.output
    assert "4 checkpoint(s) match their manifests" in result.output


def test_verify_checks_a_studys_checkpoints(study, tmp_path):
    run = shutil.copytree(study, tmp_path / "micro")
    checkpoints = run / "runs/placement=pre/seed=0/checkpoints"
    weights = checkpoints / "step_000002/model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + bytes([weights.read_bytes()[-1] ^ 1]))
    shutil.rmtree(checkpoints / "step_000004")
    shutil.copytree(checkpoints / "step_000001", checkpoints / "step_000004")
    registered = json.loads((checkpoints / "manifest.json").read_text())
    registered["step_000004"]["files"] = registered["step_000001"]["files"]
    (checkpoints / "manifest.json").write_text(json.dumps(registered))
    (checkpoints / "step_000000/rng.safetensors").unlink()

    check = verify_run(run)
    found = {(p.unit, p.kind) for p in check.problems}
    assert found == {
        ("runs/placement=pre/seed=0/checkpoints/step_000002/model.safetensors", "changed"),
        ("runs/placement=pre/seed=0/checkpoints/step_000004/state.json", "misplaced"),
        ("runs/placement=pre/seed=0/checkpoints/step_000000/rng.safetensors", "missing"),
    }
    result = runner.invoke(app, ["verify", str(run)])
    assert result.exit_code == 1
    advice = result.output.strip().splitlines()[-1]
    assert "holds step 1, its place says step 4 of seed 0" in result.output
    named = "runs/placement=pre/seed=0/checkpoints/step_000000, runs/placement=pre/seed=0/checkpoints/step_000002"
    assert f"delete the damaged checkpoint folder(s) {named}, runs/placement=pre/seed=0/checkpoints/step_000004" in (
        advice
    )
    assert "training resumes from the last good checkpoint" in advice


def test_an_incomplete_study_is_named_by_verify_report_and_query(study, tmp_path):
    run = shutil.copytree(study, tmp_path / "micro")
    audit_unit = "rows/placement=pre/seed=0/step=000004.parquet"
    (run / audit_unit).unlink()
    _edit_manifest(run, lambda payload: payload["units"].pop(audit_unit))
    checkpoints = run / "runs/placement=pre/seed=0/checkpoints"
    registered = json.loads((checkpoints / "manifest.json").read_text())
    del registered["step_000004"]
    (checkpoints / "manifest.json").write_text(json.dumps(registered))
    shutil.rmtree(checkpoints / "step_000004")

    check = verify_run(run)
    assert check.ok and not check.complete
    assert check.absent == (audit_unit, "runs/placement=pre/seed=0/checkpoints/step_000004")
    result = runner.invoke(app, ["verify", str(run)])
    assert result.exit_code == 1
    assert f"absent     {audit_unit} (planned, not recorded)" in result.output
    assert "is not complete: 2 planned unit(s) absent" in result.output

    page = build_report(run).read_text(encoding="utf-8")
    assert page.index("This run is not complete.") < page.index('id="findings"')
    assert "Findings, as measured (provisional: the run is not complete)" in page
    assert "step_000004" in page
    records = json.loads((run / "findings.json").read_text(encoding="utf-8"))
    assert records and all(record["provisional"] is True for record in records)

    queried = runner.invoke(app, ["query", str(run), "SELECT count(*) AS n FROM rows"])
    assert queried.exit_code == 0, queried.output
    warning = [line for line in queried.output.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "is not complete: 2 planned unit(s) absent" in warning[0]

    complete = build_report(study, out=tmp_path / "complete.html").read_text(encoding="utf-8")
    assert "not complete" not in complete and "provisional" not in complete
    records = json.loads((tmp_path / "complete.findings.json").read_text(encoding="utf-8"))
    assert records and all(record["provisional"] is False for record in records)


def test_a_live_writer_is_named(study, tmp_path):
    run = shutil.copytree(study, tmp_path / "micro")
    hold = (
        "import sys, time\nfrom attnsens.store.lock import writer_lock\n"
        "with writer_lock(sys.argv[1], command='study'):\n    print('held', flush=True)\n    time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        check = verify_run(run)
        assert check.ok and not check.complete and check.writer is not None
        assert f"pid {holder.pid} on host" in check.writer and "(attnsens study" in check.writer
        result = runner.invoke(app, ["verify", str(run)])
        assert result.exit_code == 1 and f"writer     pid {holder.pid}" in result.output
        assert "provisional until the writer finishes" in result.output
        page = build_report(run, out=tmp_path / "report.html").read_text(encoding="utf-8")
        assert "This run is not complete." in page and f"pid {holder.pid}" in page
    finally:
        holder.kill()
        holder.wait()
    assert verify_run(run).complete  # a killed writer writes nothing: only its record is left
