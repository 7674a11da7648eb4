"""Random multi-head attention instances for the attention-bound tests (weights batched along an instance axis)."""

from __future__ import annotations

import torch

F64 = torch.float64


def _instances(n: int, n_query: int, d_model: int, n_head: int, n_kv: int, d_head: int, seed: int) -> dict:
    """n random instances; weight scales spread over two decades so rows range from diffuse to one-hot."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.empty(n, 1, 1, 1, dtype=F64).uniform_(-1.5, 1.5, generator=g))
    r = lambda *s: torch.randn(n, *s, generator=g, dtype=F64)  # noqa: E731
    return {
        "X": r(n_query, d_model) * scale[..., 0], "Wq": r(n_head, d_head, d_model) * scale,
        "Wk": r(n_kv, d_head, d_model) * scale, "Wv": r(n_kv, d_head, d_model), "Wo": r(d_model, n_head * d_head),
        "bq": r(n_head, d_head) * scale[..., 0], "bk": r(n_kv, d_head) * scale[..., 0] * 3, "bv": r(n_kv, d_head),
        "bo": r(d_model),
    }  # fmt: skip
