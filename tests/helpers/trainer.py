"""A short training run on a corpus and a callback that records what the trainer reports."""

from __future__ import annotations

from pathlib import Path

import torch

from attnsens.train.data import DataConfig
from attnsens.train.model import GPT
from attnsens.train.run import train
from attnsens.train.trainer import TrainConfig
from tests.unit.train.conftest import micro_model_config


class Recorder:
    def __init__(self, stop_after: int | None = None) -> None:
        self.steps: list[int] = []
        self.checkpoints: list[int] = []
        self.stop_after = stop_after

    def on_step_end(self, step: int, model: GPT, batch: torch.Tensor) -> None:
        assert isinstance(model, GPT) and batch.shape == (4, 16)
        self.steps.append(step)
        if self.stop_after is not None and step == self.stop_after:
            raise KeyboardInterrupt

    def on_checkpoint(self, step: int, model: GPT, path: Path) -> None:
        assert isinstance(model, GPT) and path.name == f"step_{step:06d}"
        self.checkpoints.append(step)


def run(corpus: Path, out: Path, *, resume: bool = False, callbacks=(), steps: int = 12):
    return train(
        micro_model_config(),
        TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup_steps=3, seed=7),
        DataConfig(source=str(corpus), vocab_size=300, block_size=16, eval_sequences=3),
        out,
        resume=resume,
        callbacks=callbacks,
        device="cpu",
    )
