"""Fixtures for the training tests: a small synthetic corpus and a micro GPT that trains in milliseconds."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from attnsens.train.model import GPTConfig

WORDS = "the king queen sword crown night day love death speak thee thou hath doth cold fire".split()


def synthetic_text(n_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n_words // 6)]
    return "\n".join(lines) + "\n"


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Micro models gain nothing from intra-op threads (shared ``one_torch_thread`` fixture, tests/conftest.py)."""


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "verse.txt"
    path.write_text(synthetic_text(12_000))
    return path


def micro_model_config(**overrides: object) -> GPTConfig:
    base = dict(vocab_size=300, n_layer=2, n_head=2, d_model=16, d_ff=24, max_positions=16)
    return GPTConfig(**{**base, **overrides})
