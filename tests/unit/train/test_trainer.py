"""Trainer: schedule, weight-decay groups, gradient-norm log, callbacks, bit-identical resume."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnsens.errors import CheckpointError, ConfigError
from attnsens.store import get_schema
from attnsens.train.checkpoint import load_checkpoint
from attnsens.train.data import DataConfig, prepare_data
from attnsens.train.model import GPT
from attnsens.train.run import train
from attnsens.train.trainer import TrainConfig, gradient_group, parameter_groups
from tests.helpers.trainer import Recorder, run
from tests.unit.train.conftest import micro_model_config


def test_lr_schedule_warmup_then_cosine_to_floor() -> None:
    config = TrainConfig(steps=20, lr=1e-3, warmup_steps=4, min_lr_ratio=0.1)
    assert [config.lr_at(s) for s in (1, 2, 4)] == pytest.approx([2.5e-4, 5e-4, 1e-3])
    assert config.lr_at(12) == pytest.approx(1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi * 0.5)))
    assert config.lr_at(20) == pytest.approx(1e-4)
    lrs = [config.lr_at(s) for s in range(4, 21)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_weight_decay_only_on_linear_matrices() -> None:
    model = GPT(micro_model_config())
    decay, no_decay = parameter_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in decay["params"]) == sorted(
        n for n, p in model.named_parameters() if p.ndim == 2 and not n.startswith(("wte", "wpe"))
    )
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {"wte.weight", "wpe.weight", "blocks.0.ln_1.weight", "blocks.0.attn.c_attn.bias"} <= {
        names[id(p)] for p in no_decay["params"]
    }


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("wte.weight", (-1, "embedding")),
        ("ln_f.bias", (-1, "ln")),
        ("blocks.3.ln_2.weight", (3, "ln")),
        ("blocks.0.attn.c_attn.weight", (0, "attn_qkv")),
        ("blocks.1.attn.c_proj.bias", (1, "attn_out")),
        ("blocks.2.mlp.c_fc.weight", (2, "mlp_in")),
        ("blocks.2.mlp.c_proj.weight", (2, "mlp_out")),
    ],
)
def test_gradient_groups_follow_the_schema_vocabulary(name: str, expected: tuple[int, str]) -> None:
    assert gradient_group(name) == expected


def test_callbacks_log_and_parquet_tables(corpus_file: Path, tmp_path: Path) -> None:
    recorder = Recorder()
    result = run(corpus_file, tmp_path, callbacks=[recorder])
    assert recorder.steps == list(range(1, 13))
    assert recorder.checkpoints == [0, 1, 2, 4, 8, 12] == result.checkpoint_steps
    training = pd.read_parquet(tmp_path / "training.parquet")
    assert list(training.columns) == list(get_schema("training").names)
    assert training["step"].tolist() == list(range(1, 13))
    assert training["eval_loss"].notna().tolist() == [s in (1, 2, 4, 8, 12) for s in range(1, 13)]
    assert training["loss"].iloc[-3:].mean() < training["loss"].iloc[:3].mean()
    grads = pd.read_parquet(tmp_path / "grad_norms.parquet")
    assert list(grads.columns) == list(get_schema("grad_norms").names)
    assert len(grads) == 12 * (2 + 2 * 5)  # layer -1: embedding and final LN; 5 groups in each of 2 layers
    per_step = grads.groupby("step")["grad_norm"].apply(lambda g: math.sqrt((g**2).sum()))
    torch.testing.assert_close(torch.tensor(per_step.values), torch.tensor(training["grad_norm_global"].values))


def test_global_grad_norm_is_measured_before_clipping(corpus_file: Path, tmp_path: Path) -> None:
    result = run(corpus_file, tmp_path, steps=2)
    torch.manual_seed(7)  # the trainer seeds the initialization with the run's seed
    model = GPT(micro_model_config())
    data = prepare_data(DataConfig(source=str(corpus_file), vocab_size=300, block_size=16, eval_sequences=3), tmp_path)
    x, y = data.train_batch(7, 1, 4)
    model.loss(x, y).backward()
    expected = torch.sqrt(sum(p.grad.square().sum() for p in model.parameters()))
    assert result.training[0]["grad_norm_global"] == pytest.approx(expected.item(), rel=1e-5)


def test_interrupted_run_resumes_bit_identically(corpus_file: Path, tmp_path: Path) -> None:
    straight = run(corpus_file, tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        run(corpus_file, tmp_path / "resumed", callbacks=[Recorder(stop_after=10)])  # last checkpoint: step 8
    recorder = Recorder()
    resumed = run(corpus_file, tmp_path / "resumed", resume=True, callbacks=[recorder])
    assert recorder.steps == [9, 10, 11, 12]
    assert [r["loss"] for r in resumed.training] == [r["loss"] for r in straight.training]
    assert [r["grad_norm_global"] for r in resumed.training] == [r["grad_norm_global"] for r in straight.training]
    final_a = load_checkpoint(tmp_path / "straight", 12)
    final_b = load_checkpoint(tmp_path / "resumed", 12)
    for name, tensor in final_a["model"].items():
        assert torch.equal(final_b["model"][name], tensor), name
    for index, values in final_a["optimizer"]["state"].items():
        for key, value in values.items():
            assert torch.equal(final_b["optimizer"]["state"][index][key], value)


def test_resume_of_a_finished_run_is_a_no_op(corpus_file: Path, tmp_path: Path) -> None:
    first = run(corpus_file, tmp_path, steps=3)
    recorder = Recorder()
    again = run(corpus_file, tmp_path, steps=3, resume=True, callbacks=[recorder])
    assert recorder.steps == [] and again.training == first.training


def test_existing_run_needs_resume_and_same_settings(corpus_file: Path, tmp_path: Path) -> None:
    run(corpus_file, tmp_path, steps=3)
    with pytest.raises(CheckpointError, match="--resume"):
        run(corpus_file, tmp_path, steps=3)
    with pytest.raises(CheckpointError, match="train_config"):
        run(corpus_file, tmp_path, steps=5, resume=True)


@pytest.mark.parametrize(
    "overrides",
    [{"steps": 0}, {"warmup_steps": -1}, {"lr": 0.0}, {"grad_clip": 0.0}, {"checkpoints": (0, 11)}, {"beta2": 1.0}],
)
def test_invalid_train_configs(overrides: dict) -> None:
    with pytest.raises(ConfigError):
        TrainConfig(**{"steps": 10, **overrides})


def test_block_size_beyond_learned_positions_is_refused(corpus_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_positions"):
        train(
            micro_model_config(),
            TrainConfig(steps=2, batch_size=2),
            DataConfig(source=str(corpus_file), vocab_size=300, block_size=32),
            tmp_path,
        )


def test_gradient_accumulation_matches_the_whole_batch(corpus_file: Path, tmp_path: Path) -> None:
    data_config = DataConfig(source=str(corpus_file), vocab_size=300, block_size=16, eval_sequences=3)
    results = {}
    for micro in (None, 1, 3):
        config = TrainConfig(steps=4, batch_size=6, lr=3e-3, warmup_steps=2, seed=5, micro_batch_size=micro)
        results[micro] = train(micro_model_config(), config, data_config, tmp_path / f"micro{micro}", device="cpu")
    losses = {micro: torch.tensor([r["loss"] for r in result.training]) for micro, result in results.items()}
    torch.testing.assert_close(losses[1], losses[None], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses[3], losses[None], rtol=1e-5, atol=1e-6)
    final = {micro: load_checkpoint(tmp_path / f"micro{micro}", 4)["model"] for micro in results}
    for name, tensor in final[None].items():
        torch.testing.assert_close(final[1][name], tensor, rtol=1e-4, atol=1e-5)
