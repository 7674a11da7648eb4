"""Attention rows recomputed from captured queries and keys (MATH.md §2.6, A5).

Pure tensor functions: the capture machinery and ``ModelAdapter.stream_attention`` feed them the queries and keys
a model actually used, so the rows agree with the model's own (eager) attention to float32 rounding whatever
attention implementation (eager, sdpa, ...) the model runs with.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from einops import rearrange
from torch import Tensor

from attnsens.errors import ShapeError


def attention_rows(
    query: Tensor,
    key: Tensor,
    *,
    tau: float,
    query_positions: Tensor,
    heads: Sequence[int],
    causal: bool,
    key_padding_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Rows p = softmax(q_t · K^T / tau) over the allowed keys of each selected query position t, in float32.

    Allowed keys: every non-padding key (bidirectional) or keys j ≤ t (causal). Query head h reads key head
    ``h // (head / kv_head)`` (grouped-query attention).

    Args:
        query: [batch, head, n, d_head] queries after any rotary embedding.
        key: [batch, kv_head, n, d_head] keys after any rotary embedding.
        tau: softmax temperature (sqrt(d_head) for scaled dot-product attention).
        query_positions: [batch, query] 0-based positions of the rows to compute.
        heads: 0-based query heads to compute.
        causal: whether key j > t is masked.
        key_padding_mask: optional bool [batch, n], True for real tokens.

    Returns:
        ``(probs, n_keys)``: float32 probs [batch, len(heads), query, n] with masked keys exactly zero
        (MATH.md §2.6), and n_keys [batch, query] the number of allowed keys of each row.
    """
    batch, n_head, n, d_head = query.shape
    if key.ndim != 4 or key.shape[0] != batch or key.shape[2:] != (n, d_head) or n_head % key.shape[1]:
        raise ShapeError(
            f"key must be [batch, kv_head, {n}, {d_head}] with kv_head dividing {n_head}, "
            f"got query {tuple(query.shape)} and key {tuple(key.shape)}"
        )
    group = n_head // key.shape[1]
    head_index = torch.as_tensor(list(heads), dtype=torch.long, device=query.device)
    rows = query_positions.shape[1]
    gather_index = rearrange(query_positions, "batch query -> batch 1 query 1").expand(batch, len(heads), rows, d_head)
    q = torch.gather(query[:, head_index].float(), 2, gather_index)  # [batch, head, query, d_head]
    k = key[:, head_index // group].float()  # [batch, head, key, d_head]
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / tau)  # [batch, head, query, key]
    allowed = _allowed_keys(query_positions, n, causal=causal, key_padding_mask=key_padding_mask)
    scores = scores.masked_fill(~rearrange(allowed, "batch query key -> batch 1 query key"), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return probs, allowed.sum(dim=-1)


def _allowed_keys(query_positions: Tensor, n: int, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
    """Bool [batch, query, key]: which keys each row may attend to."""
    batch, rows = query_positions.shape
    keys = torch.arange(n, device=query_positions.device)
    if causal:
        allowed = keys.view(1, 1, n) <= query_positions.unsqueeze(-1)
    else:
        allowed = torch.ones(batch, rows, n, dtype=torch.bool, device=query_positions.device)
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask.view(batch, 1, n)
    return allowed


def key_padding_mask_of(attention_mask: Tensor | None, input_ids: Tensor) -> Tensor | None:
    """A user's [batch, n] attention mask (1 = token) as a bool key mask, or None when every key is real."""
    if attention_mask is None:
        return None
    mask = torch.as_tensor(attention_mask, device=input_ids.device).bool()
    if mask.shape != input_ids.shape:
        raise ShapeError(
            f"attention_mask shape {tuple(mask.shape)} must equal input_ids shape {tuple(input_ids.shape)}"
        )
    return None if bool(mask.all()) else mask
