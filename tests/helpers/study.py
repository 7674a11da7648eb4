"""A micro study configuration: two seeds of a tiny GPT, a few steps, small audits and bounds."""

from __future__ import annotations

from pathlib import Path

from attnsens.study.study import StudyConfig
from attnsens.train.data import DataConfig
from attnsens.train.model import GPTConfig
from attnsens.train.trainer import TrainConfig


def micro_study(corpus: Path, **overrides: object) -> StudyConfig:
    values = dict(
        name="micro",
        model=GPTConfig(vocab_size=300, n_layer=2, n_head=2, d_model=16, d_ff=24, max_positions=16),
        train=TrainConfig(steps=4, batch_size=4, lr=3e-3, warmup_steps=2),
        data=DataConfig(source=str(corpus), vocab_size=300, block_size=16, eval_sequences=3),
        seeds=(0, 1),
        audit_sequences=2,
        rows_per_sequence=5,
        min_query=4,
        bound_tokens=8,
        bound_queries=2,
        bound_iterations=2,
    )
    return StudyConfig(**{**values, **overrides})
