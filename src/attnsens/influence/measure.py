"""Measured influence of a nonfinal token on the last position versus sequence length (docs/math.md §10.5).

For each n: random inputs x ∈ vocab^n, a nonfinal position i < n ("first" = 0, "middle" = ⌊(n−1)/2⌋, "random"
uniform on 0…n−2) and a replacement token x'_i ≠ x_i. Recorded: ‖y_n − y'_n‖₂ of the last position's final hidden
state (the vector the unembedding reads — the quantity the theorem bounds) and the total variation
½‖p − p'‖₁ of the next-token distributions. All pairs of one length run batched, x and x' side by side.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from attnsens.errors import ConfigError, UnsupportedModelError
from attnsens.train.model import GPT

POSITION_KINDS = ("first", "middle", "random")
# tokens [batch, n] -> (hidden [batch, d], logits [batch, V] or None for a model without an unembedding)
LastPosition = Callable[[Tensor], tuple[Tensor, Tensor | None]]

# Attention scores per forward pass (batch · head · n²) kept below this many elements unless batch_size is given.
_SCORE_BUDGET = 1 << 25


def _own_gpt_last_position(gpt: GPT) -> LastPosition:
    """Hidden state and logits of the last position, computing only what they depend on.

    The unembedding runs on the last position only (hook_final). In unmasked models the last block's attention
    also runs for the last query only (hook_q keeps q[:, :, -1:]): its output [batch, 1, d_model] broadcasts over
    the residual stream, which leaves every other position wrong but the last one exact — and nothing after the
    last block mixes positions. This halves the attention work of a two-layer model; causal masks are built for
    the full query range, so causal models run in full.
    """

    def last_query(_module: Any, _inputs: Any, q: Tensor) -> Tensor:
        return q[:, :, -1:]  # (batch, head, 1, d_head)

    def run(tokens: Tensor) -> tuple[Tensor, Tensor]:
        kept: list[Tensor] = []

        def last_only(_module: Any, _inputs: Any, output: Tensor) -> Tensor:
            kept.append(output[:, -1])
            return output[:, -1:]

        handles = [gpt.hook_final.register_forward_hook(last_only)]
        if not gpt.config.causal:
            handles.append(gpt.blocks[-1].attn.hook_q.register_forward_hook(last_query))
        try:
            logits = gpt(tokens)[:, -1]
        finally:
            for handle in handles:
                handle.remove()
        return kept[0], logits

    return run


def _hf_last_position(module: Any, *, tied_head: bool) -> LastPosition:
    """Last hidden state (after any final norm) and logits; a causal LM's base model uses its tied embedding."""

    def run(tokens: Tensor) -> tuple[Tensor, Tensor | None]:
        out = module(input_ids=tokens, output_hidden_states=True, use_cache=False)
        hidden = out.hidden_states[-1][:, -1]
        logits = getattr(out, "logits", None)
        if logits is not None:
            return hidden, logits[:, -1]
        if tied_head:
            return hidden, hidden @ module.get_input_embeddings().weight.T
        return hidden, None

    return run


def _resolve(model: Any, *, decoder: bool) -> tuple[LastPosition, int, int | None, int, torch.device]:
    """(last-position function, vocab size, max length or None, heads, device) of an own GPT or HF model."""
    module = getattr(model, "module", model)
    if not isinstance(module, torch.nn.Module):
        raise UnsupportedModelError(f"measure needs a torch model or adapter, got {type(model).__name__}")
    device = next(module.parameters()).device
    if isinstance(module, GPT):
        config = module.config
        max_length = config.max_positions if config.positions == "learned" else None
        return _own_gpt_last_position(module), config.vocab_size, max_length, config.n_head, device
    hf_config = getattr(module, "config", None)
    if hf_config is None or not hasattr(hf_config, "vocab_size"):
        raise UnsupportedModelError(
            f"cannot measure {type(module).__name__}: expected attnsens' own GPT or a transformers model "
            "(load it with attnsens.models.load)"
        )
    max_length = getattr(hf_config, "max_position_embeddings", None)
    heads = getattr(hf_config, "num_attention_heads", 1)
    # A decoder's tied unembedding is its input embedding; an encoder's (BERT) MLM head is more than that.
    tied_head = bool(getattr(hf_config, "tie_word_embeddings", False)) and decoder
    return _hf_last_position(module, tied_head=tied_head), hf_config.vocab_size, max_length, heads, device


def _changed_positions(kind: str, n: int, count: int, generator: torch.Generator) -> Tensor:
    if kind == "first":
        return torch.zeros(count, dtype=torch.long)
    if kind == "middle":
        return torch.full((count,), (n - 1) // 2, dtype=torch.long)
    return torch.randint(0, n - 1, (count,), generator=generator)


def measure(
    model: Any,
    lengths: Sequence[int],
    *,
    n_samples: int = 8,
    positions: Sequence[str] = POSITION_KINDS,
    seed: int = 0,
    batch_size: int | None = None,
    dtype: torch.dtype | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """max and median of ‖y_n − y'_n‖₂ and of TV(p, p') per (n, position kind) over ``n_samples`` random triples.

    Args:
        model: attnsens' own GPT, a transformers model, or an adapter from ``attnsens.models.load``.
        lengths: sequence lengths n ≥ 2.
        n_samples: (input, replacement) samples per length and position kind.
        positions: position kinds among "first", "middle", "random".
        seed: seed of the token, position and replacement draws.
        batch_size: (x, x') pairs per forward pass (default: as many as keep batch·head·n² ≤ 2^25 scores).
        dtype: run a copy of the model in this dtype (e.g. torch.float64 for tiny models), default as is.
        progress: called as ``progress(done, total)`` after each length (progress displays).

    Returns:
        One row per (n, position_kind): n, position_kind, influence_max, influence_median, tv_max, tv_median,
        n_samples (the ``influence`` table of attnsens.store.schema without run_id, model and the bound).
    """
    if n_samples < 1:
        raise ConfigError(f"n_samples must be >= 1, got {n_samples}")
    unknown = [kind for kind in positions if kind not in POSITION_KINDS]
    if unknown or not positions:
        raise ConfigError(f"positions must be a non-empty subset of {POSITION_KINDS}, got {list(positions)}")
    decoder = bool(getattr(getattr(model, "spec", None), "causal", False))  # adapters know; bare HF models: no TV
    if dtype is not None:
        model = copy.deepcopy(getattr(model, "module", model)).to(dtype)
    last_position, vocab, max_length, heads, device = _resolve(model, decoder=decoder)
    if vocab < 2:
        raise ConfigError(f"a replacement token needs vocab_size >= 2, got {vocab}")
    for n in lengths:
        if n < 2 or (max_length is not None and n > max_length):
            raise ConfigError(f"every length must be in [2, {max_length or '∞'}], got {n}; shorten --lengths")
    generator = torch.Generator().manual_seed(seed)
    records = []
    module = getattr(model, "module", model)
    was_training = module.training
    module.eval()
    try:
        with torch.inference_mode():
            for done, n in enumerate(lengths, start=1):
                count = n_samples * len(positions)
                tokens = torch.randint(0, vocab, (count, n), generator=generator)
                changed = torch.cat([_changed_positions(kind, n, n_samples, generator) for kind in positions])
                shift = torch.randint(1, vocab, (count,), generator=generator)
                replaced = tokens.clone()
                rows = torch.arange(count)
                replaced[rows, changed] = (tokens[rows, changed] + shift) % vocab
                pairs = batch_size or max(1, _SCORE_BUDGET // (2 * heads * n * n))
                influence, tv = _run_pairs(last_position, tokens.to(device), replaced.to(device), pairs)
                for k, kind in enumerate(positions):
                    part = slice(k * n_samples, (k + 1) * n_samples)
                    records.append(
                        {
                            "n": n,
                            "position_kind": kind,
                            "influence_max": float(influence[part].max()),
                            "influence_median": float(influence[part].median()),
                            "tv_max": float(tv[part].max()),
                            "tv_median": float(tv[part].median()),
                            "n_samples": n_samples,
                        }
                    )
                if progress is not None:
                    progress(done, len(lengths))
    finally:
        module.train(was_training)
    return pd.DataFrame.from_records(records)


def _run_pairs(last_position: LastPosition, tokens: Tensor, replaced: Tensor, pairs: int) -> tuple[Tensor, Tensor]:
    """‖Δy_n‖₂ and TV for every row pair, ``pairs`` pairs per forward pass. Returns two float64 [count] tensors
    (TV is NaN for a model without an unembedding)."""
    influence, tv = [], []
    for start in range(0, tokens.shape[0], pairs):
        x, x_prime = tokens[start : start + pairs], replaced[start : start + pairs]
        hidden, logits = last_position(torch.cat([x, x_prime]))
        half = x.shape[0]
        hidden = hidden.double()
        influence.append(torch.linalg.vector_norm(hidden[:half] - hidden[half:], dim=-1))
        if logits is None:
            tv.append(torch.full((half,), torch.nan, dtype=torch.float64, device=hidden.device))
            continue
        probs = torch.softmax(logits.double(), dim=-1)
        tv.append(0.5 * (probs[:half] - probs[half:]).abs().sum(dim=-1))
    return torch.cat(influence).cpu(), torch.cat(tv).cpu()
