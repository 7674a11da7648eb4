"""``builtin:lnfree``: a small seeded GPT inside the influence theorem's assumptions (docs/math.md §10.1).

A built-in model of ``attnsens.models.load`` (beside the packaged aliases), so it lives with the loaders; the
influence experiments re-export it as ``attnsens.influence.builtin_lnfree``.

LN-free blocks (X ← X + Attn(X); X ← X + MLP(X)), unmasked attention, bounded sinusoidal positions (amplitude
0.5, so ‖p_j‖₂ = 0.5·√(d/2) for every j), ReLU MLP, no biases, N(0, 0.1²) weights: small enough that the
certified C stays in the hundreds (C ≈ 10^2.4 for seed 0) while the measured n·‖Δy_n‖ is ≈ 0.1.

Text reaches it through a byte-level fallback tokenizer (token id = UTF-8 byte mod 32, ``ByteTokenizer``), so
``attnsens audit builtin:lnfree --text FILE`` and ``attnsens bounds builtin:lnfree`` work like any other model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from attnsens.models.own_gpt import OwnGPTAdapter
from attnsens.train.model import GPT, GPTConfig

LNFREE_CONFIG = GPTConfig(
    vocab_size=32,
    n_layer=2,
    n_head=2,
    d_model=16,
    max_positions=1 << 16,
    norm="none",
    positions="sinusoidal",
    position_scale=0.5,
    causal=False,
    activation="relu",
    bias=False,
    init_std=0.1,
)


class ByteTokenizer:
    """Text → token ids of a model with ``vocab_size`` ids: each UTF-8 byte b becomes b mod ``vocab_size``.

    >>> ByteTokenizer(32).encode("AB")
    [1, 2]
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [byte % self.vocab_size for byte in text.encode("utf-8")]


def builtin_lnfree(seed: int = 0, **overrides: Any) -> GPT:
    """The ``builtin:lnfree`` GPT with weights drawn from a generator seeded by ``seed`` (``overrides``: GPTConfig
    fields, e.g. ``causal=True`` for the masked twin)."""
    config = replace(LNFREE_CONFIG, **overrides)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = GPT(config)
    finally:
        torch.random.set_rng_state(state)
    return model.eval()


def load_builtin_lnfree(*, device: Any = "cpu", dtype: torch.dtype = torch.float32) -> OwnGPTAdapter:
    """``attnsens.models.load("builtin:lnfree")``: the seed-0 model wrapped in the own-GPT adapter."""
    model = builtin_lnfree().to(device=device, dtype=dtype)
    return OwnGPTAdapter(model, name="builtin:lnfree", tokenizer=ByteTokenizer(LNFREE_CONFIG.vocab_size))
