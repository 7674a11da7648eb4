"""Streaming capture: reduce every selected attention row to statistics during the forward pass (docs/math.md A5).

The adapter's query/key tap hands us each layer's (post-rotary) queries and keys as the layer runs; rows are
recomputed in float32 for one chunk of queries at a time, in one pair of buffers that every chunk of every layer
reuses (when every head is captured), and reduced by :func:`row_statistics`; rows computed outside those buffers
(a subset of heads, a layer's own scores) are fresh tensors, whose freed heap pages go back to the operating
system after each layer once a chunk reaches ``TRIM_WORKING_SET`` (:mod:`attnsens.capture.allocator`). Nothing
of size layers × n² ever exists: the extra peak memory of the rows is one chunk's working set
(``RowSelection.max_memory``), whatever the number of layers. The blocks' MLPs run ``TOKEN_CHUNK`` tokens at a time
(:mod:`attnsens.models.tokenwise`), so that their [n, d_ff] intermediates are not what grows with n either; and when
every row of every layer is captured, causal decoder layers run ``QUERY_SLICE`` queries at a time
(:mod:`attnsens.models.query_slices`), each slice's rows and output computed here from its own queries and the keys
and values of the slices so far, so that a layer's [n, d_model] temporaries exist only a slice at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
from einops import rearrange
from torch import Tensor

from attnsens.capture.allocator import release_free_memory
from attnsens.capture.selection import RowSelection
from attnsens.capture.statistics import RowStats, row_statistics
from attnsens.errors import UnsupportedModelError
from attnsens.models import query_slices
from attnsens.models.adapter import ModelAdapter, StopForward
from attnsens.models.attention import (
    KEY_ALIGNMENT,
    AttentionCall,
    RowWorkspace,
    aligned_span,
    attention_output,
    chunked_rows,
    key_padding_mask_of,
)
from attnsens.models.tokenwise import in_token_chunks

TRIM_WORKING_SET = 64 * 2**20
"""Layers whose rows are fresh tensors (not in the shared buffers) trim the heap after each layer
(``allocator``) once a chunk's scores and probabilities reach this many bytes; below it a layer's freed buffers
are few and small, the next layer reuses them, and the trim is skipped. Rows in the shared buffers leave nothing
to trim: there, trimming after each layer cost 10 % of SmolLM2's audit at 8,192 tokens (two alternating runs,
129 s against 117 s for the pair; its 30 calls alone 0.38 s at 4,096 tokens, the rest the forward's pages
faulted in again) and changed the peak extra memory by 8 MiB (752 against 760 MiB)."""


@dataclass(frozen=True, kw_only=True)
class RowBlock:
    """Statistics of the rows of one chunk: ``stats`` fields are ``[batch, head, query]``."""

    layer: int
    heads: tuple[int, ...]
    query_positions: Tensor  # [batch, query]
    stats: RowStats

    def grid(self) -> dict[str, Tensor]:
        """Every column (layer, head, batch, query and every statistic) as a CPU tensor that broadcasts to the
        rows' [batch, head, query] grid: ``layer`` a scalar, ``head`` [1, head, 1], ``batch`` [batch, 1, 1],
        ``query`` [batch, 1, query], the statistics their own [batch, head, query]."""
        batch = self.stats.p_max.shape[0]
        out = {
            "layer": torch.tensor(self.layer, dtype=torch.int64),
            "head": torch.as_tensor(self.heads, dtype=torch.int64).view(1, -1, 1),
            "batch": torch.arange(batch).view(batch, 1, 1),
            "query": rearrange(self.query_positions.cpu(), "batch query -> batch 1 query"),
        }
        for f in fields(self.stats):
            out[f.name] = getattr(self.stats, f.name).cpu()
        return out

    def columns(self) -> dict[str, Tensor]:
        """One flat CPU tensor per column (layer, head, batch, query and every statistic), row-major."""
        shape = self.stats.p_max.shape
        return {name: values.expand(shape).reshape(-1) for name, values in self.grid().items()}


def capture_row_statistics(
    model: ModelAdapter,
    input_ids: Tensor,
    *,
    selection: RowSelection | None = None,
    attention_mask: Tensor | None = None,
    on_block: Callable[[RowBlock], None] | None = None,
    exact_support: int | None = None,
) -> list[RowBlock]:
    """Run ``model`` once on ``input_ids`` [batch, n] and reduce the selected rows to RowStats, chunk by chunk.

    Args:
        model: a ModelAdapter (attnsens.models.load).
        input_ids: token ids [batch, n].
        selection: layers, heads, query positions and chunk size (default: every row).
        attention_mask: optional [batch, n] padding mask (1 = token); padded keys get probability 0.
        on_block: called with each RowBlock as soon as it is computed (e.g. to write or aggregate it); when
            given, blocks are not kept and an empty list is returned.
        exact_support: prove every row of at most this many non-zero keys exact (``row_statistics``; 24–48).

    Returns:
        The RowBlocks in the order computed (layer by layer, then chunk by chunk); rows agree with the model's
        eager attention to float32 rounding.
    """
    from attnsens.theta.certificate import enumeration_support

    enumeration_support(exact_support)  # refused before the forward pass, not in its first chunk
    selection = selection or RowSelection()
    input_ids = model.check_input_ids(input_ids)
    layers = set(model.select_layers(selection.layers))
    heads = model.select_heads(selection.heads)
    batch, n = model.sequence_shape(input_ids)
    positions = selection.query_positions(batch, n, device=input_ids.device)
    key_mask = key_padding_mask_of(attention_mask, input_ids)
    # Chunks are sized by the memory budget over every key, whatever the mask, so the budget holds for any layer;
    # each chunk then computes only the keys the layer's own mask (causal, padding, window) allows to its rows,
    # so no key is dropped on the adapter's word.
    bounds = selection.chunk_bounds(positions, heads=len(heads), n=n, causal=False)
    spans = [(first, stop) for first, stop, _keys in bounds]
    kept: list[RowBlock] = []
    sink = on_block or kept.append

    every_row = bool(key_mask is None and heads == tuple(range(model.spec.n_head)) and positions.shape[1] == n)
    every_row = every_row and bool((positions == torch.arange(n, device=positions.device)).all())

    reduced: set[int] = set()

    slice_tokens = query_slices.QUERY_SLICE
    slice_layers, causal_bounds, slice_spans = _query_slicing(
        model, selection, positions, n, every_row=every_row and len(layers) == model.spec.n_layer, heads=len(heads)
    )
    # One pair of score and probability buffers for every chunk of every layer (the budget's 8 bytes per score),
    # as large as the largest chunk: its rows times all n keys, or a causal chunk's keys widened for alignment.
    widest = max(
        [(stop - first) * n for first, stop in spans]
        + [(stop - first) * _aligned_width(keys, n) for first, stop, keys in causal_bounds]
    )
    workspace = RowWorkspace(batch * len(heads) * widest)
    large_chunks = 8 * workspace.elements >= TRIM_WORKING_SET

    def reduce_layer(layer: int, query: Tensor, key: Tensor, call: AttentionCall) -> Tensor | None:
        if layer not in layers:
            return None
        start, stop = call.queries or (0, n)
        final = stop == n  # the layer's last call: its last slice, or its only call
        last = final and len(reduced | {layer}) == len(layers)  # the forward pass stops after this layer's rows
        if call.sinks is not None:
            raise UnsupportedModelError(
                f"layer {layer} of {model.name!r} has attention sinks: its rows sum to less than 1 and the row "
                "statistics (θ, entropy) assume rows that sum to 1; stream_attention gives the rows themselves"
            )
        model.check_call_heads(layer, query, key)
        query, key = query.detach(), key.detach()
        # The mask is the one the layer itself used (causal, padding, sliding window), read row by row.
        layer_spans = spans if call.queries is None else [span for span in slice_spans if start <= span[0] < stop]
        chunks = chunked_rows(
            query, key, call, positions, layer_spans, heads=heads, key_padding_mask=key_mask, narrow_keys=True,
            workspace=workspace, align_keys=KEY_ALIGNMENT, query_start=start,
        )  # fmt: skip
        # With every row of a float32 layer at hand, its output is computed from them in place of the layer's own
        # call (float32 rows: the output agrees with the layer's own to float32 rounding, not more precise than it).
        fused = every_row and call.scores is None and query.shape[2] == stop - start and key.shape[2] == n
        fused = fused and query.dtype == torch.float32
        # No layer reads the last one's output; a sliced layer's slices each need theirs, the last layer's too.
        fused = fused and (not last or call.queries is not None)
        value = call.value if fused else None
        batch, n_head = query.shape[:2]
        # The values' head size, which need not be the queries' (DeepSeek's latent attention, a partial rotary
        # that widens the rotated queries and keys).
        output = None if value is None else value.new_empty(batch, stop - start, n_head, value.shape[-1])
        fresh = False  # whether some chunk's rows were a tensor of their own, outside the workspace
        for chunk, probs, n_keys, key_start in chunks:
            fresh = fresh or not workspace.holds(probs)
            if output is not None and value is not None:
                first = int(chunk[0, 0])
                output[:, first - start : first - start + chunk.shape[1]] = attention_output(probs, value, key_start)
            n_keys = rearrange(n_keys, "batch query -> batch 1 query").expand(-1, len(heads), -1)
            # Rows computed in the workspace have their logits beside them: the entropy without a logarithm a key.
            logits = workspace.logits_of(probs)
            stats = row_statistics(probs, n_keys=n_keys, exact_support=exact_support, logits=logits)
            if key_start:  # the chunk's rows start at key key_start; every key before it has probability 0
                stats = replace(stats, argmax=stats.argmax + key_start)
            sink(RowBlock(layer=layer, heads=heads, query_positions=chunk, stats=stats))
            del probs
        if large_chunks and fresh:
            release_free_memory()
        if final:
            reduced.add(layer)
        if last:
            raise StopForward
        return output

    with (
        model.inference(),
        model.query_key_tap(reduce_layer),
        in_token_chunks(model.tokenwise_modules()),
        query_slices.in_query_slices(slice_layers, slice_tokens, overwrite=True),
        enumeration_workspaces(exact_support),
    ):
        model.forward_until_stopped(input_ids, attention_mask)
    model.check_every_layer_called(layers, reduced)
    return kept


def _query_slicing(
    model: ModelAdapter, selection: RowSelection, positions: Tensor, n: int, *, every_row: bool, heads: int
) -> tuple[list[torch.nn.Module], list[tuple[int, int, int]], list[tuple[int, int]]]:
    """``(layers run in query slices, their causal chunk bounds, the chunk spans split at the slices' bounds)``,
    all empty unless ``every_row`` of every layer of a float32 causal decoder is audited.

    Such a decoder's layers run in query slices (``in_query_slices``), each slice's rows and output computed by
    the capture; the chunks then end at the slices' bounds. A sliced layer's attention is plain causal attention
    (the tap refuses any other), so its chunks are sized by the keys up to their last query: the early chunks hold
    more rows, and there are fewer chunks to pay a chunk's fixed cost. Each layer writes its output over its
    input: the model passes it on to the next layer and reads no layer's input again, and the forward stops after
    the last layer (so one residual stream, not three, at long context)."""
    slice_layers = model.query_sliceable_layers() if every_row else []
    slice_layers = slice_layers if all(p.dtype == torch.float32 for p in model.module.parameters()) else []
    causal_bounds = selection.chunk_bounds(positions, heads=heads, n=n, causal=True) if slice_layers else []
    slice_spans = _split_at_multiples([(first, stop) for first, stop, _keys in causal_bounds], query_slices.QUERY_SLICE)
    return slice_layers, causal_bounds, slice_spans


def _aligned_width(keys: int, n: int) -> int:
    """Keys a chunk over keys 0..``keys`` − 1 computes, widened to a multiple of ``KEY_ALIGNMENT`` where n allows."""
    start, stop = aligned_span((0, keys), n, KEY_ALIGNMENT)
    return stop - start


def _split_at_multiples(spans: list[tuple[int, int]], every: int) -> list[tuple[int, int]]:
    """``spans`` cut at every multiple of ``every``: no span crosses the bound between two query slices."""
    cut = []
    for first, stop in spans:
        while first < stop:
            end = min(stop, (first // every + 1) * every)
            cut.append((first, end))
            first = end
    return cut


def enumeration_workspaces(exact_support: int | None) -> contextlib.AbstractContextManager[None]:
    """Under ``exact_support``, the chunks' θ kernels share their enumeration workspaces (0.5 GiB a thread at 48
    keys, faulted in once instead of once per chunk: a SmolLM2 audit at 512 tokens 36 → 27 s); otherwise nothing."""
    if exact_support is None:
        return contextlib.nullcontext()
    try:
        from attnsens.theta.kernels import holding_workspaces
    except ImportError:  # no numba: the torch path has no such buffers
        return contextlib.nullcontext()
    return holding_workspaces()
