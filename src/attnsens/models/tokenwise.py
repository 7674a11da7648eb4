"""Token-wise modules run a slice of tokens at a time, so that long inputs never hold their widest activations.

A block's MLP maps every token's hidden state on its own, so running it on consecutive slices of the tokens and
writing each slice's output into one [batch, n, d] tensor gives the same output, token for token (up to the
rounding of matrix products of another shape), while its [n, d_ff] intermediates exist only a slice at a time.
The audit does this for the modules an adapter names (``ModelAdapter.tokenwise_modules``): at 8,192 tokens, SmolLM2's
MLP otherwise holds three [8192, 1536] float32 tensors (144 MiB) at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

TOKEN_CHUNK = 1024
"""Tokens per slice: SmolLM2's MLP then holds about 18 MiB of intermediates instead of 144 MiB at 8,192 tokens, and
its matrix products stay as fast per token (products of 1,024 rows)."""


@contextlib.contextmanager
def in_token_chunks(modules: Sequence[torch.nn.Module], tokens: int | None = None) -> Iterator[None]:
    """While active, each of ``modules`` called with one tensor [batch, n, d] of n > ``tokens`` runs on slices of
    ``tokens`` tokens, its outputs written into one [batch, n, d_out] tensor. Any other call (more arguments, another
    shape, an output that is not one tensor of the slice's tokens) runs as the module's own single call. Forward
    hooks of the modules see the whole call, as before. ``tokens`` defaults to ``TOKEN_CHUNK``."""
    tokens = TOKEN_CHUNK if tokens is None else tokens
    with forwards_replaced(modules, lambda forward: _in_slices(forward, tokens)):
        yield


@contextlib.contextmanager
def forwards_replaced(
    modules: Sequence[torch.nn.Module], wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> Iterator[None]:
    """While active, each of ``modules`` runs ``wrap(its forward)`` in place of its forward, set on the instance
    and removed on exit (also after an error), so its hooks still see every call as before. A module whose forward
    is replaced on the instance already, or that keeps its attributes elsewhere (a TransformerLens bridge
    component), is left as it is."""
    installed = []
    try:
        for module in modules:
            if "forward" in vars(module) or type(module).__setattr__ is not torch.nn.Module.__setattr__:
                continue
            module.forward = wrap(module.forward)
            installed.append(module)
        yield
    finally:
        for module in installed:
            del module.forward


def _in_slices(forward: Callable[..., Any], tokens: int) -> Callable[..., Any]:
    def run(hidden: Any, *args: Any, **kwargs: Any) -> Any:
        n = hidden.shape[1] if isinstance(hidden, Tensor) and hidden.ndim == 3 else 0
        if args or kwargs or n <= tokens:
            return forward(hidden, *args, **kwargs)
        # Contiguous slices: some modules view their input flat (GPT-2's Conv1D); one sequence's slices are already.
        first = forward(hidden[:, :tokens].contiguous())
        if not isinstance(first, Tensor) or first.ndim != 3 or tuple(first.shape[:2]) != (hidden.shape[0], tokens):
            return forward(hidden)  # not a token-wise output: the module's own call
        out = first.new_empty(hidden.shape[0], n, first.shape[2])
        out[:, :tokens] = first
        del first
        for start in range(tokens, n, tokens):
            out[:, start : start + tokens] = forward(hidden[:, start : start + tokens].contiguous())
        return out

    return run
