"""Progress of long commands without a terminal: plain lines (first, every interval, last) with ETA."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.cli.progress import ProgressReport, format_duration

runner = CliRunner()


def _report(interval: float, unit: str = "layers") -> tuple[ProgressReport, io.StringIO]:
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=False, markup=False, highlight=False, width=200)
    return ProgressReport("bounding", unit, console=console, interval=interval), sink


def test_plain_lines_first_last_and_eta() -> None:
    report, sink = _report(interval=3600.0)
    with report:
        for done in range(1, 5):
            report.update(done, 4, detail="[layer] done")
    lines = sink.getvalue().splitlines()
    assert len(lines) == 2  # the first and the last; the interval suppresses the rest
    assert lines[0].startswith("bounding: 1/4 layers, ") and ", ETA " in lines[0] and lines[0].endswith("[layer] done")
    assert lines[1].startswith("bounding: 4/4 layers, ") and "ETA" not in lines[1]


def test_disabled_report_prints_nothing() -> None:
    sink = io.StringIO()
    with ProgressReport("x", "y", console=Console(file=sink), enabled=False) as report:
        report.update(1, 2)
    assert sink.getvalue() == ""


def test_durations() -> None:
    assert [format_duration(s) for s in (0.4, 59, 61, 3 * 3600 + 7 * 60)] == ["0 s", "59 s", "1 min 01 s", "3 h 07 min"]


def test_train_prints_loss_and_tokens_per_second_then_extends(tmp_path: Path, text_file: Path) -> None:
    out = tmp_path / "run"
    args = ["train", "--steps", "2", "--batch-size", "2", "--data", str(text_file), "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("training: ")]
    assert lines[-1].startswith("training: 2/2 steps, ") and ", loss " in lines[-1] and "tokens/s" in lines[-1]

    extended = runner.invoke(app, [*args[:2], "3", *args[3:], "--resume", "--json"])
    assert extended.exit_code == 0, extended.output
    summary = json.loads(extended.stdout)
    assert summary["final_step"] == 3 and summary["checkpoints"] == [0, 1, 2, 3]
    shorter = runner.invoke(app, [*args[:2], "1", *args[3:], "--resume"])
    assert shorter.exit_code == 1
    assert shorter.output.strip() == f"error: cannot extend {out} from 3 to 1 steps; give --steps 3 or more"


def test_bounds_and_audit_report_layers(run_dir: Path, text_file: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["bounds", str(run_dir), "--seq-len", "8", "--queries", "1", "--iterations", "1"])
    assert result.exit_code == 0, result.output
    assert "bounding: 2/2 layers, " in result.stderr
    assert "certified bounds of micro@2" in result.stdout and "3 significant digits" in result.stdout
    result = runner.invoke(app, ["audit", str(run_dir), "--text", str(text_file), "--seq-len", "8", "--batch", "2",
                                 "--out", str(tmp_path / "a")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "auditing: 4/4 layers (2 sequences), " in result.stderr  # 2 layers of each of 2 sequences


def test_study_reports_each_seed_training(tmp_path: Path, text_file: Path) -> None:
    from attnsens.cli.study import SeedProgress
    from attnsens.study.study import run_study
    from tests.helpers.study import micro_study

    report, sink = _report(interval=0.0, unit="steps")
    with report:
        run_study(micro_study(text_file, bounds=False), tmp_path / "study", callbacks=[SeedProgress(report, 4)])
    lines = sink.getvalue().splitlines()
    for seed in (0, 1):
        label = f"micro-pre seed {seed}: training"
        ours = [line for line in lines if line.startswith(f"{label}: ")]
        assert [line.split(",")[0] for line in ours] == [f"{label}: {s}/4 steps" for s in (1, 2, 3, 4)]
        assert "loss " in ours[-1] and "tokens/s" in ours[-1]


def test_terminal_bar_shows_label_and_detail_literally() -> None:
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=True, width=120)
    with ProgressReport("training", "steps", console=console) as report:
        report.label = "seed 1: training"
        report.update(4, 10, detail="loss [1.0]")
    assert "seed 1: training" in sink.getvalue() and "loss [1.0]" in sink.getvalue()


def test_influence_reports_each_length() -> None:
    result = runner.invoke(app, ["influence", "--lengths", "8,16,32", "--samples", "1"])
    assert result.exit_code == 0, result.output
    assert "measuring influence: 3/3 lengths, " in result.stderr and "log–log slope" in result.stdout


def test_bounds_says_when_the_text_is_shorter_than_the_seq_len(tmp_path: Path) -> None:
    import attnsens as A

    text = tmp_path / "line.txt"
    text.write_text("To be, or not to be, that is the question.")
    args = ["bounds", "builtin:lnfree", "--queries", "1", "--iterations", "1", "--text", str(text)]
    short = runner.invoke(app, [*args, "--seq-len", "1000"])
    assert short.exit_code == 0, short.output
    tokens = A.models.load("builtin:lnfree").encode(text.read_text()).shape[1]
    assert f"note: the text gives {tokens} tokens, fewer than --seq-len 1000; bounding those" in short.stderr
    enough = runner.invoke(app, [*args, "--seq-len", str(tokens)])
    assert enough.exit_code == 0 and "note:" not in enough.stderr


def test_study_reference_loads_without_transformers_progress_bars(
    tmp_path: Path, text_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers.utils import logging as hf_logging

    monkeypatch.setattr(hf_logging, "_tqdm_active", True)  # on, as in a fresh process, whatever ran before
    args = ["study", "--config", "tiny", "--seeds", "0", "--steps", "2", "--no-bounds", "--reference", "minilm"]
    result = runner.invoke(app, [*args, "--data", str(text_file), "--out", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    assert "reference minilm: " in result.output and "Loading weights" not in result.output
