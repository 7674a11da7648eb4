"""Attention rows recomputed from captured queries and keys (docs/math.md §2.6, A5).

Pure tensor functions: the capture machinery and ``ModelAdapter.stream_attention`` feed them the queries and keys
a model actually used, so the rows agree with the model's own (eager) attention to float32 rounding whatever
attention implementation (eager, sdpa, ...) the model runs with.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from einops import rearrange
from torch import Tensor

from attnsens.errors import ShapeError, UnsupportedModelError


@dataclass(frozen=True, kw_only=True)
class AttentionCall:
    """What one attention layer was asked to compute, as the model passed it to its attention function.

    ``mask`` is the model's own ``attention_mask`` argument, [batch | 1, 1, query, key]: bool (True = attend) or
    additive float (0 or a large negative number per key, plus any additive bias such as ALiBi); it already holds
    the causal, padding and sliding-window pattern, so ``window`` is not applied again. Without a mask the pattern
    is ``causal`` (sdpa's ``is_causal``) or every key, narrowed by ``window`` (keys t − window < j ≤ t, or
    |t − j| < window in a bidirectional call, ModernBERT's) for kernels that apply the window themselves (flash
    attention). ``softcap`` c turns scores s into c·tanh(s/c);
    ``sinks`` [head] are logits of one extra key per head that takes probability mass and is not reported.
    ``scores`` [batch, head, query, key] are the layer's own pre-softmax scores where a model exposes them
    (TransformerLens' ``hook_attn_scores``): scaling, softcap, biases and masks (keys at the float minimum) are
    already in them, so the rows are their softmax and nothing else of the call is used.

    ``value`` [batch, kv_head, key, d_head] are the layer's values where the tap lets the callback compute the
    layer's output in its place (the Hugging Face attention interface, without dropout or returned weights): a
    callback that returns the output [batch, query, head, d_head], softmax(rows)·V in the query's dtype, replaces
    the layer's own attention call, so the rows it reduces are the ones the forward goes on with.

    ``queries`` = ``(start, stop)`` marks a call of one slice of a layer run in query slices
    (``attnsens.models.query_slices``): the query tensor then holds the slice's queries alone, [batch, head,
    stop − start, d_head], the key and value tensors every token's, those from ``stop`` on not yet computed; the
    pattern is causal, and the output is that of the queries [start, stop) alone.
    """

    tau: float
    mask: Tensor | None = None
    causal: bool = False
    window: int | None = None
    softcap: float | None = None
    sinks: Tensor | None = None
    scores: Tensor | None = None
    value: Tensor | None = None
    queries: tuple[int, int] | None = None

    def allowed(
        self,
        query_positions: Tensor,
        n: int,
        *,
        key_padding_mask: Tensor | None = None,
        keys: tuple[int, int] | None = None,
    ) -> tuple[Tensor | None, Tensor | None, Tensor]:
        """``(allowed, bias, n_keys)`` of the rows at ``query_positions`` [batch, query]: bool [batch, query, n]
        (None = every key), an additive float [batch, query, n] bias or None, and the keys allowed per row.

        ``keys`` = ``(start, stop)`` from :meth:`key_span` (a call without a mask of its own): ``allowed`` then
        covers those keys only, [batch, query, stop − start]."""
        if self.mask is None:
            allowed, n_keys = allowed_keys(
                query_positions, n, causal=self.causal, key_padding_mask=key_padding_mask, window=self.window,
                keys=keys,
            )  # fmt: skip
            return allowed, None, n_keys
        if keys is not None:
            raise ValueError("keys applies to a call without a mask of its own (see key_span)")
        mask = self.mask
        if mask.ndim != 4 or mask.shape[1] != 1 or mask.shape[-1] != n:
            raise UnsupportedModelError(
                f"attention mask of shape {tuple(mask.shape)} is not [batch, 1, query, {n}]; attnsens recomputes rows "
                "only under one mask shared by every head"
            )
        batch, rows = query_positions.shape
        per_query = mask[:, 0].expand(batch, -1, -1)  # [batch, query or 1, key]
        if per_query.shape[1] == 1:  # one row of the mask for every query (LayoutLM's [batch, 1, 1, n] padding)
            picked = per_query.expand(batch, rows, n)
        else:
            index = rearrange(query_positions, "batch query -> batch query 1").expand(batch, rows, n)
            picked = torch.gather(per_query, 1, index)  # [batch, query, key]
        if picked.dtype == torch.bool:
            allowed, bias = picked, None
        else:
            allowed = picked > torch.finfo(picked.dtype).min / 2
            bias = torch.where(allowed, picked.float(), 0.0)
            bias = bias if bool(bias.any()) else None
        if key_padding_mask is not None:
            allowed = allowed & key_padding_mask.view(batch, 1, n)
        return allowed, bias, allowed.sum(dim=-1)

    def key_span(self, query_positions: Tensor, n: int) -> tuple[int, int] | None:
        """``(start, stop)``: the keys from the first to one past the last that the call allows to some row at
        ``query_positions``, from the positions alone, for a call without a mask of its own (causal: keys up to
        the last query, from the first query's window start; bidirectional: all n, or from the first query's window
        start to the last one's window end). None when the call carries a
        mask, which only :func:`allowed_span` can read. Padding is the caller's: it can only narrow the span."""
        if self.mask is not None:
            return None
        first, last = int(query_positions.min()), int(query_positions.max())
        if not self.causal:
            return (0, n) if self.window is None else (max(0, first - self.window + 1), min(n, last + self.window))
        return (0 if self.window is None else max(0, first - self.window + 1)), last + 1


class RowWorkspace:
    """Two float32 buffers, for the scores and the probabilities of one chunk, reused by every chunk of every layer.

    Chunks of a causal layer grow key by key, so fresh tensors for each one would all differ in size, and glibc
    would carve the small tensors a capture keeps out of the freed ones, so that the heap grew with the number of
    chunks and layers. With one pair of buffers, sized for the largest chunk when first used, the rows of a chunk
    live in them until the next chunk is computed.
    """

    def __init__(self, elements: int) -> None:
        self.elements = elements
        self._buffers: list[Tensor] = []
        self._last: tuple[Tensor, Tensor] | None = None

    def views(self, shape: tuple[int, ...], device: torch.device) -> tuple[Tensor, Tensor] | None:
        """Contiguous float32 ``shape`` views of the two buffers, or None when they would not fit."""
        count = 1
        for size in shape:
            count *= size
        if count > self.elements:
            return None
        if not self._buffers or self._buffers[0].device != device:
            self._buffers = [torch.empty(self.elements, dtype=torch.float32, device=device) for _ in range(2)]
        scores, probs = (buffer[:count].view(shape) for buffer in self._buffers)
        self._last = (scores, probs)
        return scores, probs

    def logits_of(self, probs: Tensor) -> Tensor | None:
        """The scores whose softmax ``probs`` is, when ``probs`` is the probabilities view of the latest
        :meth:`views` (``attention_rows`` writes the softmax of that scores view there, and no call since has
        overwritten either); else None."""
        if self._last is None:
            return None
        scores, latest = self._last
        same = probs.data_ptr() == latest.data_ptr() and probs.shape == latest.shape
        return scores if same and probs.stride() == latest.stride() else None

    def holds(self, tensor: Tensor) -> bool:
        """Whether ``tensor`` lives in one of the two buffers, rather than being a fresh tensor of its own."""
        storage = tensor.untyped_storage().data_ptr()
        return any(buffer.untyped_storage().data_ptr() == storage for buffer in self._buffers)


class RowChunk(NamedTuple):
    """One chunk of recomputed rows: ``probs`` [batch, head, query, key] holds keys ``key_start`` onwards."""

    query_positions: Tensor  # [batch, query]
    probs: Tensor  # float32 [batch, head, query, key]; masked keys exactly zero
    n_keys: Tensor  # [batch, query]: allowed keys of each row
    key_start: int  # probs[..., j] is key key_start + j


KEY_ALIGNMENT = 16
"""Keys a narrowed chunk of the capture is widened to a multiple of (``chunked_rows``' ``align_keys``): 64 bytes
of float32, one vector register of the widest SIMD and one cache line. The scores' product QKᵀ writes rows of
that many keys; when their length is not a multiple of it, every row starts off the cache line and MKL's kernel
slows. Measured on this project's 2-core VM: a SmolLM2 audit at 8,192 tokens cuts each layer into chunks of 221
queries, whose spans end at multiples of 221 keys; one layer's chunks replayed alone (227 queries a chunk):
QKᵀ 0.62–0.68 s against 0.34 s for PV, the same number of multiply-adds; one product of 681 × 64 by 64 × k:
21.5 ms at k = 4,103 against 8.9 ms at k = 4,112."""


def chunked_rows(
    query: Tensor,
    key: Tensor,
    call: AttentionCall,
    positions: Tensor,
    spans: Sequence[tuple[int, int]],
    *,
    heads: Sequence[int],
    key_padding_mask: Tensor | None,
    narrow_keys: bool = False,
    workspace: RowWorkspace | None = None,
    align_keys: int = 1,
    query_start: int = 0,
) -> Iterator[RowChunk]:
    """A :class:`RowChunk` of each chunk ``positions[:, first:stop]`` of one layer's rows, for every (first, stop)
    in ``spans``: the one loop that recomputes rows chunk by chunk (``stream_attention`` yields them,
    ``capture_row_statistics`` reduces them). A chunk's tensors are released before the next is computed, so with a
    consumer that drops its own reference at most one chunk of probabilities exists at once.

    With ``narrow_keys`` a chunk's rows cover only the keys from the first to the last one that the layer's own
    mask allows to some row of the chunk (a causal chunk stops at its last query's key; a sliding window also
    starts late): every key outside that span is masked for every row of the chunk, so its probability is exactly
    0 and it is not computed. Otherwise every chunk spans all keys (``key_start`` 0).

    With ``align_keys`` (with ``narrow_keys``) that span is widened to a multiple of so many keys where the n keys
    allow (``KEY_ALIGNMENT``): the keys it adds are masked for every row of the chunk, so their probabilities are
    exactly 0, as they are outside the span.

    With a ``workspace`` the scores and probabilities are computed in its buffers: a chunk's ``probs`` are then
    overwritten by the next chunk, so the consumer must be done with them before it asks for the next.

    ``query`` may hold the queries from position ``query_start`` on only (a slice of a layer run in query slices):
    position t's query is then ``query[:, :, t − query_start]``."""
    for first, stop in spans:
        chunk = positions[:, first:stop]
        probs, n_keys, key_start = _chunk_rows(
            query, key, call, query_positions=chunk, heads=heads, key_padding_mask=key_padding_mask,
            narrow_keys=narrow_keys, workspace=workspace, align_keys=align_keys, query_start=query_start,
        )  # fmt: skip
        yield RowChunk(chunk, probs, n_keys, key_start)
        del probs, n_keys


def call_rows(
    query: Tensor,
    key: Tensor,
    call: AttentionCall,
    *,
    query_positions: Tensor,
    heads: Sequence[int] | None = None,
    key_padding_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The rows of ``call`` at ``query_positions``: :func:`attention_rows` under the call's mask, bias, softcap
    and sinks, or the softmax of the call's own ``scores``. Returns ``(probs [batch, head, query, n] float32,
    n_keys [batch, query])``."""
    probs, n_keys, _ = _chunk_rows(
        query, key, call, query_positions=query_positions, heads=heads, key_padding_mask=key_padding_mask
    )
    return probs, n_keys


def _chunk_rows(
    query: Tensor,
    key: Tensor,
    call: AttentionCall,
    *,
    query_positions: Tensor,
    heads: Sequence[int] | None,
    key_padding_mask: Tensor | None,
    narrow_keys: bool = False,
    workspace: RowWorkspace | None = None,
    align_keys: int = 1,
    query_start: int = 0,
) -> tuple[Tensor, Tensor, int]:
    """``call_rows`` over all keys, or with ``narrow_keys`` over the span of keys the mask allows to some row
    (widened to a multiple of ``align_keys`` where n allows); also returns the span's first key. A call carrying
    its own ``scores`` spans all keys."""
    if call.scores is not None:
        probs, n_keys = _rows_of_scores(call.scores, query_positions, heads, key_padding_mask)
        return probs, n_keys, 0
    n = key.shape[2]
    # Without a mask or padding the span follows from the positions, and the key mask is built over it alone.
    span = call.key_span(query_positions, n) if narrow_keys and key_padding_mask is None else None
    if span is not None:
        span = aligned_span(span, n, align_keys)
    allowed, bias, n_keys = call.allowed(query_positions, n, key_padding_mask=key_padding_mask, keys=span)
    if span is not None:
        start, stop = span
    else:
        start, stop = aligned_span(allowed_span(allowed, n), n, align_keys) if narrow_keys else (0, n)
        if allowed is not None and (start, stop) != (0, n):
            allowed = allowed[..., start:stop]
            bias = None if bias is None else bias[..., start:stop]
    probs = attention_rows(
        query, key, tau=call.tau, query_positions=query_positions, allowed=allowed, heads=heads, bias=bias,
        softcap=call.softcap, sinks=call.sinks, keys=(start, stop), workspace=workspace, query_start=query_start,
    )  # fmt: skip
    return probs, n_keys, start


def aligned_span(span: tuple[int, int], n: int, alignment: int) -> tuple[int, int]:
    """``span`` = ``(start, stop)`` of n keys widened to a multiple of ``alignment`` keys: its stop moved later,
    and where that passes n, its start moved earlier; as wide as n allows when n is shorter."""
    start, stop = span
    width = -(-(stop - start) // alignment) * alignment
    stop = start + width
    if stop > n:
        start, stop = max(0, n - width), n
    return start, stop


def allowed_span(allowed: Tensor | None, n: int) -> tuple[int, int]:
    """``(start, stop)``: the first key and one past the last key of n that ``allowed`` [..., n] allows to any row
    (all n when ``allowed`` is None, or when it allows no key at all, so that fully masked rows stay as they were).
    """
    if allowed is None:
        return 0, n
    return _column_span(allowed.reshape(-1, n).any(dim=0)) or (0, n)


def _column_span(columns: Tensor) -> tuple[int, int] | None:
    """``(first, stop)``: the first True of the bool vector ``columns`` and one past its last, or None."""
    indices = torch.nonzero(columns).flatten()
    if indices.numel() == 0:
        return None
    return int(indices[0]), int(indices[-1]) + 1


def _rows_of_scores(
    scores: Tensor, query_positions: Tensor, heads: Sequence[int] | None, key_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Softmax rows of a layer's own scores [batch, head, n, n] at ``query_positions``; keys whose score is below
    half the float minimum are masked (exact zeros), as are padding keys."""
    picked = _rows_of(scores, query_positions).float()  # [batch, head, query, n]
    if heads is not None and tuple(heads) != tuple(range(scores.shape[1])):
        picked = picked[:, list(heads)]
    allowed = picked > torch.finfo(scores.dtype).min / 2
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask.view(scores.shape[0], 1, 1, -1)
    if not bool((allowed == allowed[:, :1]).all()):
        raise UnsupportedModelError("the model's scores mask different keys in different heads; attnsens recomputes "
                                    "rows only under one mask shared by every head")  # fmt: skip
    probs = torch.softmax(picked.masked_fill(~allowed, float("-inf")), dim=-1)
    return probs, allowed[:, 0].sum(dim=-1)


def attention_rows(
    query: Tensor,
    key: Tensor,
    *,
    tau: float,
    query_positions: Tensor,
    allowed: Tensor | None,
    heads: Sequence[int] | None = None,
    bias: Tensor | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    keys: tuple[int, int] | None = None,
    workspace: RowWorkspace | None = None,
    query_start: int = 0,
) -> Tensor:
    """Rows p = softmax(q_t · K^T / tau) over the allowed keys of each selected query position t, in float32.

    Query head h reads key head ``h // (head / kv_head)`` (grouped-query attention). With ``softcap`` c the scores
    s become c·tanh(s/c), then ``bias`` is added (the order of transformers' eager attention); with ``sinks`` each
    head's row is normalised together with one extra logit per head that is then dropped (the row sums to < 1).

    Args:
        query: [batch, head, n, d_head] queries after any rotary embedding (or those of positions
            ``query_start`` onwards only).
        key: [batch, kv_head, n, d_head] keys after any rotary embedding.
        tau: softmax temperature (sqrt(d_head) for scaled dot-product attention).
        query_positions: [batch, query] 0-based positions of the rows to compute.
        allowed: bool [batch, query, n] (or broadcastable) from :func:`allowed_keys`; None = every key.
        heads: 0-based query heads to compute (default: all).
        bias: optional additive float [batch, query, n] (ALiBi or any bias the model adds to its scores).
        softcap: optional logit cap c.
        sinks: optional [head] sink logits (one per query head, before selecting ``heads``).
        keys: ``(start, stop)``: compute only keys start ≤ j < stop, which must hold every key that ``allowed``
            allows to any of the rows (the rest have probability exactly 0); ``allowed`` and ``bias`` then cover
            those keys only. Default: all n.
        workspace: compute the scores and probabilities in its buffers (the result is a view of one of them,
            valid until the workspace is used again); without sinks only, else ignored.
        query_start: the position of ``query``'s first query (a slice of a layer run in query slices).

    Returns:
        float32 probs [batch, len(heads), query, n] (or [..., stop − start] with ``keys``) with masked keys exactly
        zero (docs/math.md §2.6).
    """
    batch, n_head, n_query, d_head = query.shape
    n_kv = key.shape[1] if key.ndim == 4 else 0
    if key.ndim != 4 or key.shape[0] != batch or key.shape[3] != d_head or n_kv == 0 or n_head % n_kv:
        raise ShapeError(
            f"key must be [batch, kv_head, n, {d_head}] with kv_head dividing {n_head}, "
            f"got query {tuple(query.shape)} and key {tuple(key.shape)}"
        )
    n = key.shape[2]
    relative = query_positions - query_start
    outside = relative.numel() > 0 and (int(relative.min()) < 0 or int(relative.max()) >= n_query)
    if query_start < 0 or query_start + n_query > n or outside:
        raise ShapeError(
            f"query positions {query_positions.min().item() if query_positions.numel() else '(none)'}.."
            f"{query_positions.max().item() if query_positions.numel() else ''} must lie within the {n_query} "
            f"queries from position {query_start}, and those within the {n} keys"
        )
    group = n_head // n_kv
    if keys is not None and tuple(keys) != (0, n):
        start, stop = keys
        if not 0 <= start < stop <= n:
            raise ShapeError(f"keys {tuple(keys)} must satisfy 0 <= start < stop <= {n}")
        key = key[:, :, start:stop]
    # Scaling the few queries instead of the many scores saves a pass over [head, query, key].
    q = _rows_of(query, relative).float() * (1.0 / tau)  # [batch, head, query, d_head]
    head_list = list(range(n_head)) if heads is None else list(heads)
    every_head = head_list == list(range(n_head))
    views = None
    if workspace is not None and sinks is None and every_head:
        views = workspace.views((batch, n_head, q.shape[2], key.shape[2]), query.device)
    if views is not None:
        scores, probs = views
        # One product per sequence and key head, its query heads stacked, written into the workspace.
        stacked = rearrange(q, "batch (kv group) query d_head -> (batch kv) (group query) d_head", kv=n_kv)
        keys_t = rearrange(key.float(), "batch kv key d_head -> (batch kv) d_head key")
        torch.bmm(stacked, keys_t, out=scores.view(batch * n_kv, group * q.shape[2], key.shape[2]))
    elif every_head:
        # Grouped heads share one key tensor through broadcasting: no copy of the keys per query head.
        q = rearrange(q, "batch (kv group) query d_head -> batch kv group query d_head", kv=n_kv)
        k = rearrange(key, "batch kv key d_head -> batch kv 1 d_head key")
        scores = rearrange(torch.matmul(q.float(), k.float()), "batch kv group query key -> batch (kv group) query key")
    else:
        index = torch.as_tensor(head_list, dtype=torch.long, device=query.device)
        scores = torch.matmul(q[:, index], key[:, index // group].float().transpose(-1, -2))
    if softcap is not None:  # in place: c·tanh(s/c), the same operations as out of place
        scores.div_(softcap).tanh_().mul_(softcap)
    if bias is not None:
        scores.add_(rearrange(bias, "batch query key -> batch 1 query key"))
    if allowed is not None:  # scores: [batch, head, query, key]
        # Only the keys that some row may not attend need the fill (a causal chunk's last few, not its prefix).
        first, stop = _masked_span(allowed)
        if first < stop:
            band = rearrange(allowed[..., first:stop], "batch query key -> batch 1 query key")
            scores[..., first:stop].masked_fill_(band.logical_not(), float("-inf"))
    if sinks is not None:
        chosen = sinks.float()[head_list]
        column = rearrange(chosen, "head -> 1 head 1 1").expand(*scores.shape[:-1], 1)
        return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    if views is not None:
        return torch.softmax(scores, dim=-1, out=probs)
    return torch.softmax(scores, dim=-1)


def attention_output(probs: Tensor, value: Tensor, key_start: int = 0) -> Tensor:
    """The attention output of rows ``probs`` [batch, head, query, key] (keys ``key_start`` onwards) over ``value``
    [batch, kv_head, n, d_head]: Σ_j p_j·v_j per row, [batch, query, head, d_head] in the values' dtype, as the
    Hugging Face attention interface returns it. Query head h reads key head h // (head / kv_head); the product
    is one float32 batched matrix product per sequence and key head, its query heads stacked."""
    batch, n_head, n_query, n_key = probs.shape
    n_kv = value.shape[1]
    span = value[:, :, key_start : key_start + n_key].float()
    stacked = probs.reshape(batch * n_kv, (n_head // n_kv) * n_query, n_key)
    out = torch.bmm(stacked, span.reshape(batch * n_kv, n_key, value.shape[3]))
    out = rearrange(out, "(batch kv) (group query) d -> batch query (kv group) d", batch=batch, query=n_query)
    return out.to(value.dtype)


def _masked_span(allowed: Tensor) -> tuple[int, int]:
    """``(first, stop)``: the keys from the first to the last one that ``allowed`` [..., key] denies to some row
    (first == stop when every row may attend every key)."""
    return _column_span(~allowed.reshape(-1, allowed.shape[-1]).all(dim=0)) or (0, 0)


def _rows_of(query: Tensor, positions: Tensor) -> Tensor:
    """query[:, :, positions]: a slice when every sequence uses the same consecutive positions, else a gather."""
    rows = positions.shape[1]
    first = positions[0, 0]
    consecutive = torch.arange(rows, device=positions.device) + first
    if bool((positions == consecutive).all()):
        start = int(first)
        return query[:, :, start : start + rows]
    batch, n_head, _, d_head = query.shape
    index = rearrange(positions, "batch query -> batch 1 query 1").expand(batch, n_head, rows, d_head)
    return torch.gather(query, 2, index)


def allowed_keys(
    query_positions: Tensor,
    n: int,
    *,
    causal: bool,
    key_padding_mask: Tensor | None = None,
    window: int | None = None,
    keys: tuple[int, int] | None = None,
) -> tuple[Tensor | None, Tensor]:
    """Which keys each row may attend to: every non-padding key (bidirectional) or keys j ≤ t (causal), and
    with a sliding ``window`` only keys t − window < j ≤ t (causal) or |t − j| < window (bidirectional).

    ``keys`` = ``(start, stop)``, a span holding every key allowed to some row (``AttentionCall.key_span``):
    the mask then covers those keys only.

    Returns:
        ``(allowed, n_keys)``: bool [batch, query, n] or [batch, query, stop − start] (None when every key is
        allowed) and the number of allowed keys of each row, [batch, query].
    """
    batch, rows = query_positions.shape
    start, stop = keys or (0, n)
    width = stop - start
    padding = None if key_padding_mask is None else key_padding_mask[:, start:stop].reshape(batch, 1, width)
    allowed = None
    index = torch.arange(start, stop, device=query_positions.device).view(1, 1, width)
    if causal:
        allowed = index <= query_positions.unsqueeze(-1)
        if window is not None:
            allowed = allowed & (index > query_positions.unsqueeze(-1) - window)
    elif window is not None:
        allowed = (index - query_positions.unsqueeze(-1)).abs() < window
    if padding is not None:
        allowed = padding if allowed is None else allowed & padding
    if allowed is None or (padding is None and window is None):  # every key, or keys 0..t: counted from t
        return allowed, query_positions + 1 if causal else torch.full_like(query_positions, n)
    return allowed, allowed.expand(batch, rows, width).sum(dim=-1)


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
