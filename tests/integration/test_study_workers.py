"""Runs trained side by side in worker processes equal runs trained one after another with the same threads, and a
study with a LayerNorm-free placement measures influence on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnsens.errors import CheckpointError
from attnsens.report import write_findings
from attnsens.store import read_table
from attnsens.store.parquet import read_metadata
from attnsens.study import workers
from attnsens.study.study import StudyConfig, influence_path, run_study
from tests.helpers.study import micro_study

TRAINING_COLUMNS = ["run_id", "seed", "step", "loss", "eval_loss", "lr", "grad_norm_global", "tokens_seen"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.unit.train.conftest import synthetic_text

    path = tmp_path_factory.mktemp("workers_corpus") / "verse.txt"
    path.write_text(synthetic_text(6000))
    return path


def _config(corpus: Path) -> StudyConfig:
    return micro_study(corpus, placements=("none",), bounds=False, influence_samples=3)


def test_threads_per_run_depend_on_the_configuration_and_machine_only() -> None:
    assert workers.threads_per_run(4, threads=2) == 1
    assert workers.threads_per_run(1, threads=2) == 2
    assert workers.threads_per_run(3, threads=8) == 2
    assert workers.threads_per_run(0, threads=2) == 2


def test_side_by_side_equals_one_after_another(corpus: Path, tmp_path: Path) -> None:
    config = _config(corpus)
    lines: list[str] = []
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # two runs, one thread each: side by side in two worker processes
    try:
        run_study(config, tmp_path / "parallel", log=lines.append)
    finally:
        torch.set_num_threads(previous)
    assert any("side by side, 2 at a time, 1 thread(s) each" in line for line in lines), lines
    assert sum("checkpoint" in line for line in lines) >= 2 * len(config.train.checkpoint_schedule)

    torch.set_num_threads(1)  # the same threads per run, in this process
    try:
        run_study(config, tmp_path / "serial", log=lines.append)
    finally:
        torch.set_num_threads(previous)
    parallel = read_table(tmp_path / "parallel" / "training").sort_values(["seed", "step"])
    serial = read_table(tmp_path / "serial" / "training").sort_values(["seed", "step"])
    columns = [c for c in TRAINING_COLUMNS if c in parallel]
    assert parallel[columns].reset_index(drop=True).equals(serial[columns].reset_index(drop=True))
    rows = [read_table(tmp_path / name / "rows").sort_values(["seed", "step", "layer", "head", "batch", "query"])
            for name in ("parallel", "serial")]  # fmt: skip
    assert rows[0]["theta_lower"].to_numpy().tobytes() == rows[1]["theta_lower"].to_numpy().tobytes()


def test_a_worker_error_reaches_the_caller_as_itself(corpus: Path, tmp_path: Path) -> None:
    config = _config(corpus)
    out = tmp_path / "study"
    run_study(config, out)
    checkpoint = out / "runs" / "placement=none" / "seed=1" / "checkpoints" / "step_000004"
    (checkpoint / "model.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        run_study(config, out)


def test_the_ln_free_placement_gets_the_influence_experiment(corpus: Path, tmp_path: Path) -> None:
    config = _config(corpus)
    run_study(config, tmp_path)
    unit = tmp_path / influence_path("none", config.seeds[0])
    table = read_table(unit)
    assert sorted(table["n"].unique()) == list(config.influence_lengths()) == [4, 8, 16]
    assert (table["n_samples"] == 3).all() and (table["run_id"] == "micro-none").all()
    summary = read_metadata(unit)["metadata"]
    layers = summary["layers"]
    assert [layer["layer"] for layer in layers] == [0, 1]
    for layer in layers:
        # what the audited inputs reach lies within what the certificate allows any input
        assert layer["A_k_observed"] <= layer["A_k"] and layer["input_norm_observed"] <= layer["input_norm_bound"]
        assert layer["p_max_n_median"] >= 1.0
    assert summary["input_set_log10_C"] <= summary["log10_certified_C"]

    _, findings = write_findings(tmp_path)
    (influence,) = [f for f in findings if f["finding"] == "influence"]
    assert influence["run_id"] == "micro-none" and influence["n_sequences"] == 3
    assert influence["input_set_log10_C"] == summary["input_set_log10_C"]
    assert "Median p_max·n per layer" in influence["measured"]
    report = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Input-set constant" in report and "A_k (certified recursion)" in report
    json.dumps(findings, allow_nan=False)
