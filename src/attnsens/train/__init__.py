"""attnsens' own GPT, its data pipeline, trainer and checkpoints (the early-training study, docs/math.md §9)."""

from __future__ import annotations

from attnsens.train.model import GPT, GPTConfig, HookPoint, preset

__all__ = ["GPT", "GPTConfig", "HookPoint", "preset"]
