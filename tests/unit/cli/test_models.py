"""Every run, checkpoint and study ``attnsens train``/``study`` writes is a MODEL argument; so is builtin:lnfree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import attnsens as A
from attnsens.cli import app
from attnsens.errors import CheckpointError, FileFormatError

runner = CliRunner()


def _audit(model: str, text_file: Path, out: Path, *extra: str):
    return runner.invoke(app, ["audit", model, "--text", str(text_file), "--seq-len", "8", "--out", str(out),
                               "--json", *extra])  # fmt: skip


@pytest.mark.parametrize(
    ("where", "extra", "step"),
    [
        ("run", [], 2),
        ("run", ["--step", "1"], 1),
        ("run/checkpoints/step_000001", [], 1),
        ("run/checkpoints/step_000000/model.safetensors", [], 0),
    ],
)
def test_audit_reads_a_training_run(run_dir, text_file, tmp_path, where, extra, step) -> None:
    model = str(run_dir) + where.removeprefix("run")
    result = _audit(model, text_file, tmp_path / "out", *extra)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == f"micro@{step}"
    rows = A.store.read_table(tmp_path / "out" / "rows")
    assert set(rows["step"]) == {step} and set(rows["seed"]) == {3}  # the run's training seed


def test_audit_reads_a_study_with_seed(study_dir, text_file, tmp_path) -> None:
    result = _audit(str(study_dir), text_file, tmp_path / "out", "--seed", "1", "--step", "2")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == "tiny/pre/seed=1@2"
    assert set(A.store.read_table(tmp_path / "out" / "rows")["seed"]) == {1}


def test_study_without_seed_and_unknown_step_are_one_line_errors(study_dir, run_dir, text_file, tmp_path) -> None:
    result = _audit(str(study_dir), text_file, tmp_path / "a")
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"error: study {study_dir} holds several runs (runs: pre seed 0, pre seed 1); choose one with --seed S (seed=)"
    )
    result = _audit(str(run_dir), text_file, tmp_path / "b", "--step", "7")
    assert result.exit_code == 1
    assert result.output.strip() == f"error: {run_dir} has no checkpoint of step 7; its saved steps are [0, 1, 2]"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_step_on_a_model_that_is_no_run(text_file, tmp_path) -> None:
    result = _audit("builtin:lnfree", text_file, tmp_path / "out", "--step", "1")
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: --step selects a checkpoint of a run or study written by attnsens train/study, and "
        "'builtin:lnfree' is neither; drop --step or give such a folder"
    )


def test_python_load_accepts_the_same_paths(run_dir, study_dir) -> None:
    adapter = A.models.load(str(run_dir), step=1)
    assert adapter.name == "micro@1" and adapter.family == "own_gpt"
    assert adapter.encode("the king").shape[0] == 1  # the run's tokenizer travels with it
    assert A.models.load(study_dir, seed=0).name == "tiny/pre/seed=0@2"
    with pytest.raises(FileFormatError, match="choose one with --seed"):
        A.models.load(study_dir)
    with pytest.raises(CheckpointError, match="not step 2"):
        A.models.load(run_dir / "checkpoints" / "step_000001", step=2)
    with pytest.raises(FileFormatError, match="step, seed and placement select a checkpoint"):
        A.models.load("builtin:lnfree", step=1)


def test_python_load_accepts_a_found_checkpoint(run_dir) -> None:
    from attnsens.train.saved import find_checkpoint

    saved = find_checkpoint(run_dir, step=1)
    adapter = A.models.load(saved, dtype=torch.float64)
    assert adapter.name == "micro@1" and adapter.tokenizer is not None
    assert adapter.module.wte.weight.dtype == torch.float64 and not adapter.module.training
    torch.testing.assert_close(
        adapter.layers[0].attention.w_q, A.models.load(str(run_dir), step=1).layers[0].attention.w_q
    )


def test_study_placements_and_the_older_layout(placements_study_dir, legacy_study_dir) -> None:
    assert A.models.load(placements_study_dir, placement="post").name == "sides/post/seed=0@2"
    with pytest.raises(
        FileFormatError,
        match=r"runs of seed 0 \(runs: post seed 0, pre seed 0\); choose one with --placement P \(placement=\)$",
    ):
        A.models.load(placements_study_dir, seed=0)
    with pytest.raises(
        FileFormatError,
        match=r"has no run of placement deepnorm \(runs: post seed 0, pre seed 0\); choose one with --placement P \(",
    ):
        A.models.load(placements_study_dir, placement="deepnorm")
    assert A.models.load(legacy_study_dir, seed=4).name == "old/seed=4@2"
    with pytest.raises(
        FileFormatError, match=r"has no run of seed 1 \(runs: seed 0, seed 4\); choose one with --seed S"
    ):
        A.models.load(legacy_study_dir, seed=1)
    run = A.models.load(placements_study_dir / "runs" / "placement=pre" / "seed=0", step=1)
    assert run.name == "sides/pre/seed=0@1" and run.tokenizer is not None  # the study's shared tokenizer


def test_bounds_on_a_study_run_by_placement(placements_study_dir) -> None:
    args = ["--placement", "pre", "--step", "1", "--seq-len", "6", "--queries", "1", "--iterations", "1"]
    result = runner.invoke(app, ["bounds", str(placements_study_dir), *args, "--no-placements", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["model"] == "sides/pre/seed=0@1" and {r["step"] for r in payload["records"]} == {1}


def test_corrupted_checkpoint_is_refused(run_dir, tmp_path, text_file) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    weights = copy / "checkpoints" / "step_000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    result = _audit(str(copy), text_file, tmp_path / "out")
    assert result.exit_code == 1 and "is corrupted" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_builtin_lnfree_audits_and_bounds_text(text_file, tmp_path) -> None:
    result = _audit("builtin:lnfree", text_file, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["n_rows"] == 2 * 2 * 8  # layers × heads × rows
    result = runner.invoke(app, ["bounds", "builtin:lnfree", "--seq-len", "6", "--queries", "1", "--iterations", "1",
                                 "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert {r["layer"] for r in json.loads(result.stdout)["records"]} == {0, 1}


def test_byte_fallback_tokenizer_of_builtin_lnfree() -> None:
    adapter = A.models.load("builtin:lnfree")
    torch.testing.assert_close(adapter.encode("A é"), torch.tensor([[65 % 32, 32 % 32, 0xC3 % 32, 0xA9 % 32]]))
