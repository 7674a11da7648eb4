"""``attnsens train``: a thin command over attnsens.train.run.train; domain errors become one line and exit 1."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from attnsens.cli import app
from tests.unit.train.conftest import synthetic_text


def test_train_then_resume_then_refuse_without_resume(tmp_path: Path) -> None:
    corpus = tmp_path / "verse.txt"
    corpus.write_text(synthetic_text(20_000))
    out = tmp_path / "run"
    args = ["train", "--config", "tiny", "--seed", "1", "--steps", "3", "--batch-size", "2", "--data", str(corpus)]
    runner = CliRunner()

    first = runner.invoke(app, [*args, "--out", str(out), "--json"])
    assert first.exit_code == 0, first.output
    summary = json.loads(first.output)
    assert summary["final_step"] == 3 and summary["checkpoints"] == [0, 1, 2, 3]
    assert (out / "training.parquet").exists() and (out / "tokenizer.json").exists()

    again = runner.invoke(app, [*args, "--out", str(out), "--resume"])
    assert again.exit_code == 0, again.output
    assert again.output.strip().splitlines()[-1] == str(out)

    refused = runner.invoke(app, [*args, "--out", str(out)])
    assert refused.exit_code == 1
    assert "pass --resume" in refused.output and "Traceback" not in refused.output


def test_unknown_preset_is_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--config", "enormous", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "unknown GPT preset 'enormous'" in result.output


def test_a_new_run_refuses_the_folder_of_another_run(tmp_path: Path) -> None:
    """Training into an audit's (or a study's) folder would add the new run's logs to that folder's tables and
    report; it is one line naming the fix, and nothing is written. A folder holding other files trains as before."""
    from attnsens.store import Manifest
    from tests.unit.store.synthetic import write_synthetic_run

    corpus = tmp_path / "verse.txt"
    corpus.write_text(synthetic_text(20_000))
    args = ["train", "--config", "tiny", "--steps", "2", "--batch-size", "2", "--data", str(corpus)]
    runner = CliRunner()

    audited = write_synthetic_run(tmp_path / "audited")
    units = dict(Manifest.load(audited).units)
    refused = runner.invoke(app, [*args, "--out", str(audited)])
    assert refused.exit_code == 1, refused.output
    lines = refused.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {audited} is the folder of another attnsens run")
    assert lines[0].endswith("choose a new --out directory")
    assert dict(Manifest.load(audited).units) == units and not (audited / "checkpoints").exists()

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "readme.txt").write_text("my notes")
    trained = runner.invoke(app, [*args, "--out", str(notes)])
    assert trained.exit_code == 0, trained.output
    assert (notes / "training.parquet").exists() and (notes / "readme.txt").read_text() == "my notes"


def test_tensorboard_writes_event_files_beside_the_parquet_log(tmp_path: Path) -> None:
    import pandas as pd
    import pytest

    pytest.importorskip("google.protobuf")
    from tests.unit.train.event_files import read_scalars

    corpus = tmp_path / "verse.txt"
    corpus.write_text(synthetic_text(20_000))
    out = tmp_path / "run"
    args = ["train", "--config", "tiny", "--steps", "4", "--batch-size", "2", "--data", str(corpus), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--tensorboard", "--monitor-every", "2", "--json"])
    assert result.exit_code == 0, result.output

    versions, scalars = read_scalars(out)
    assert versions == ["brain.Event:2"]
    training = pd.read_parquet(out / "training.parquet")
    for name in ("loss", "lr", "grad_norm_global"):
        assert [step for step, _ in scalars[f"train/{name}"]] == [1, 2, 3, 4]
        assert [value for _, value in scalars[f"train/{name}"]] == pytest.approx(training[name].tolist(), rel=1e-6)
    checkpointed = training.dropna(subset=["eval_loss"])
    assert [step for step, _ in scalars["train/eval_loss"]] == checkpointed["step"].tolist()
    assert [value for _, value in scalars["train/eval_loss"]] == pytest.approx(checkpointed["eval_loss"].tolist())

    # The sensitivity monitor's per-layer figures, every 2 steps, for every layer of the tiny GPT.
    from attnsens.train.model import preset

    n_layer = preset("tiny").n_layer
    figures = ("theta_lower_median", "p_max_median", "entropy_mean", "fraction_dominant")
    assert {tag for tag in scalars if tag.startswith("attnsens/")} == {
        f"attnsens/layer_{layer}/{figure}" for layer in range(n_layer) for figure in figures
    }
    for layer in range(n_layer):
        theta = scalars[f"attnsens/layer_{layer}/theta_lower_median"]
        assert [step for step, _ in theta] == [2, 4]
        assert all(0.0 <= value <= 1.0 for _, value in theta)
        assert all(0.0 < value <= 1.0 for _, value in scalars[f"attnsens/layer_{layer}/p_max_median"])

    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return
    accumulator = EventAccumulator(str(out))
    accumulator.Reload()
    assert [event.step for event in accumulator.Scalars("train/loss")] == [1, 2, 3, 4]


def test_monitor_every_needs_tensorboard(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "run"), "--monitor-every", "5"])
    assert result.exit_code == 1
    assert "--monitor-every writes its figures to the TensorBoard event files; add --tensorboard" in result.output
    assert not (tmp_path / "run").exists()
