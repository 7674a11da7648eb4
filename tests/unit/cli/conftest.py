"""Fixtures for the command-line tests: a micro training run and a two-seed study folder built from it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.unit.train.conftest import micro_model_config, synthetic_text


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Micro models gain nothing from intra-op threads."""


@pytest.fixture(scope="session")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "verse.txt"
    path.write_text(synthetic_text(12_000))
    return path


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Path:
    """What ``attnsens train`` writes: a micro GPT trained 2 steps (checkpoints 0, 1, 2) with its tokenizer."""
    from attnsens.train.data import DataConfig
    from attnsens.train.run import train
    from attnsens.train.trainer import TrainConfig

    model = micro_model_config()
    out = tmp_path_factory.mktemp("train") / "micro"
    data = DataConfig(source=str(text_file), vocab_size=model.vocab_size, block_size=model.max_positions)
    train(model, TrainConfig(steps=2, seed=3, batch_size=2, warmup_steps=1), data, out)
    return out


def _study(root: Path, run_dir: Path, runs: list[str]) -> Path:
    for relative in runs:
        shutil.copytree(run_dir / "checkpoints", root / "runs" / relative / "checkpoints")
    (root / "data").mkdir()
    shutil.copy(run_dir / "tokenizer.json", root / "data" / "tokenizer.json")
    return root


@pytest.fixture(scope="session")
def study_dir(tmp_path_factory: pytest.TempPathFactory, run_dir: Path) -> Path:
    """The layout ``attnsens study`` writes (runs/placement=P/seed=S/checkpoints, data/tokenizer.json): pre-LN,
    seeds 0 and 1."""
    return _study(tmp_path_factory.mktemp("study") / "tiny", run_dir, ["placement=pre/seed=0", "placement=pre/seed=1"])


@pytest.fixture(scope="session")
def placements_study_dir(tmp_path_factory: pytest.TempPathFactory, run_dir: Path) -> Path:
    """A study of two placements (pre, post) of seed 0."""
    return _study(
        tmp_path_factory.mktemp("study") / "sides", run_dir, ["placement=pre/seed=0", "placement=post/seed=0"]
    )


@pytest.fixture(scope="session")
def legacy_study_dir(tmp_path_factory: pytest.TempPathFactory, run_dir: Path) -> Path:
    """The older study layout runs/seed=S/checkpoints."""
    return _study(tmp_path_factory.mktemp("study") / "old", run_dir, ["seed=0", "seed=4"])
