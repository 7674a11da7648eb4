"""Audit a model: every selected attention row of some token sequences → a per-row table and per-(layer, head)
summary (docs/math.md §9.4–9.5, A3), optionally written to a run directory that resumes after an interruption.

Run directory layout: ``manifest.json`` (config, provenance, finished units with sha256),
``rows/sequence=NNNNNN.parquet`` (one file per audited sequence: the unit of work) and
``summary/summary.parquet``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from torch import Tensor

from attnsens.capture import RowBlock, RowSelection, capture_row_statistics
from attnsens.capture.allocator import release_free_memory
from attnsens.capture.stream import enumeration_workspaces
from attnsens.errors import InputError
from attnsens.models import ModelAdapter, load
from attnsens.store.lock import writes_run_folder

TABLE_BYTES_PER_ROW = 520
"""Most bytes a row of the rows table takes at its peak: the columns while capturing (83), the DataFrame and the
summary's working arrays (tests/slow/test_audit_memory.py). Measured on the summary of a run folder: SmolLM2 at
4,096 tokens, nine layers' 331,776 rows at a time, peaked 165 MiB above the level before it (about 520 bytes a
row)."""
SUMMARY_MEMORY = 32 * 2**20
"""Bytes of rows (at ``TABLE_BYTES_PER_ROW`` each) that the summary of an audit written to a folder reads back at
once, or ``max_memory`` if smaller. With the whole budget, the summary at the end of the audit was its peak: on
SmolLM2 at 4,096 tokens, 165 MiB for the summary against about 140 MiB while capturing; with 32 MiB, 17–27 MiB, in
the same time (0.80–0.84 s, against 0.72–0.85 s with the whole budget; three calls each)."""
LAYER_SUMMARY_MEMORY = 2 * 2**20
"""Bytes of finished layers' summarized columns (58 a row) that an audit of one sequence written to a folder holds
before it summarizes them together (``_LayerSummaries``): a summary per layer would pay its fixed cost, a few
milliseconds of pandas, thirty times over where a layer's rows are few (SmolLM2 at 512 tokens, 4,608 a layer).
What is held, and the summary's working space on it, stays within the documented bound whatever the layer count:
with 8 MiB the folder audit of a tiny Llama at 3,072 tokens peaked at 27.6 MiB with 3 layers and 39.3 MiB with 12
(``tests/slow/test_audit_memory.py`` allows 8 MiB of growth), with 2 MiB at 27.3 and 26.0 MiB; SmolLM2's folder
audits took the same time with either (512 tokens: 0.973 and 0.978 s, 2,048: 4.86 and 4.89 s, fastest of six and
three alternating calls)."""
ProgressCallback = Callable[[int, int], None]
"""``progress(done, total)`` in units of (sequence, layer) pairs."""


@dataclass(frozen=True)
class AuditResult:
    """``summary``: the store's ``summary`` table (per head, and per layer with head = -1); ``rows``: one record per
    audited row (columns of the store's ``rows`` table); ``out_dir``: where they were written, if anywhere;
    ``n_rows``: the number of audited rows.

    An audit written to a run folder keeps its rows on disk only (``row_files``): ``rows`` reads them back on first
    access.
    """

    summary: pd.DataFrame
    n_rows: int
    out_dir: Path | None = None
    row_files: tuple[Path, ...] = ()
    """The Parquet files that hold the rows of an audit written to a folder, one per sequence, in order."""
    _rows: pd.DataFrame | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        """One line: rows audited, layers and heads, the range of the per-layer median θ lower bounds, and where the
        rows are (not the tables themselves)."""
        layers = self.layer_summary()
        theta = layers["theta_lower_median"] if "theta_lower_median" in layers else pd.Series(dtype=float)
        span = f"{theta.min():.9g}–{theta.max():.9g}" if len(theta) else "–"
        heads = self.summary.loc[self.summary["head"] >= 0, "head"].nunique()
        where = (
            f"rows in {len(self.row_files)} file(s) under {str(self.out_dir)!r}" if self.row_files else "rows in memory"
        )
        return (
            f"AuditResult(n_rows={self.n_rows}, layers={len(layers)}, heads={heads}, median θ lower bound by layer "
            f"{span}, {where})"
        )

    @cached_property
    def rows(self) -> pd.DataFrame:
        if self._rows is not None:
            return self._rows
        from attnsens.store import read_table

        return read_table(self.row_files)

    def layer_summary(self) -> pd.DataFrame:
        """The per-layer records (all heads pooled)."""
        from attnsens.store import ALL_HEADS

        return self.summary[self.summary["head"] == ALL_HEADS].reset_index(drop=True)


@writes_run_folder("out_dir", "audit")
def audit(
    model: Any,
    tokens: Tensor | str | Sequence[str],
    *,
    attention_mask: Tensor | None = None,
    seq_len: int | None = None,
    n_sequences: int | None = None,
    selection: RowSelection | None = None,
    out_dir: str | Path | None = None,
    run_id: str = "audit",
    step: int = 0,
    seed: int = 0,
    max_memory: int | None = None,
    exact_support: int | None = None,
    progress: ProgressCallback | None = None,
) -> AuditResult:
    """Reduce every selected attention row of ``tokens`` to its statistics and summarize them.

    Args:
        model: anything attnsens.models.load accepts (adapter, model object, path, hub id, alias).
        tokens: token ids [batch, n], a 1-D token stream, text, or a list of texts (tokenized with the model's
            tokenizer; a list is padded to its longest text, each text one model input with its special tokens);
            for a vision model, ``pixel_values`` [batch, channel, H, W] or one image [channel, H, W].
        attention_mask: [batch, n] padding mask of a [batch, n] tensor (1 = token, 0 = padding); the real tokens
            of each sequence must be contiguous (left or right padding). Padded keys get probability 0 in the
            rows, as in the model, and padded query positions are never audited.
        seq_len: cut a stream or text into consecutive non-overlapping windows of this many tokens, each a
            well-formed model input: the tokenizer's special tokens ([CLS] … [SEP], BOS) open and close every
            window (default: the whole input as one sequence, or the rows of a 2-D tensor).
        n_sequences: audit only the first this many sequences (default: all).
        selection: layers, heads, positions (RowSelection; default: every row).
        out_dir: run directory to write Parquet files and the manifest to; sequences already recorded there
            are kept instead of recomputed. The rows go to disk a layer at a time (one row group each) and the
            summary is built a few layers at a time (one sequence: from the finished layers' rows before they
            are written, ``LAYER_SUMMARY_MEMORY`` of them at a time; several: read back), so the rows table is
            never in memory: the result's ``rows`` reads it back when first asked for.
        run_id, step, seed: identifiers stored in every record.
        max_memory: working-set budget in bytes of one chunk of recomputed rows (default: the selection's,
            ``RowSelection.max_memory``, 128 MiB). Peak extra memory: the model's own forward pass (its MLPs
            on slices of ``attnsens.models.tokenwise.TOKEN_CHUNK`` = 1,024 tokens, where each is one module; when
            every row is audited, a causal decoder's layers on slices of ``attnsens.models.query_slices.QUERY_SLICE``
            = 1,024 queries, beside every token's keys and values of one layer), plus this budget (the rows'
            working set: one chunk of one layer, whatever the number of layers; by default the chunks hold at most
            16 MiB of scores, ``attnsens.capture.selection.SPEED_CHUNK_BYTES``, 32 MiB with the probabilities, at any
            length), plus the rows table at most 520 bytes per audited row (83 while the capture runs; the
            DataFrame and the summary at the end), plus some 64 MiB of library working space
            (tests/slow/test_audit_memory.py checks it).
            With ``out_dir``, instead of the table: one layer's rows of one sequence while capturing, then, for
            several sequences, while summarizing the rows of as many layers as ``SUMMARY_MEMORY`` (32 MiB, or the
            budget if smaller) holds at 520 bytes a row (at least one).
        exact_support: prove θ exact on every row of at most this many non-zero keys (24–48; ``certify``'s
            argument). Default: rows of up to 26 keys on the CPU (24 on the GPU and torch paths) and those a cheap
            proof settles; the others end at float32 resolution. At 48 a row costs up to ~0.1–0.3 s: a SmolLM2
            audit at 512 tokens takes about 20 s more.
        progress: called after each (sequence, layer) is done.

    Returns:
        AuditResult with the rows and summary tables (attnsens.store.schema ROWS / SUMMARY).
    """
    from attnsens.store import Manifest, summarize_rows
    from attnsens.store.verify import forget_untrusted
    from attnsens.study.finite import check_finite_module
    from attnsens.theta.certificate import enumeration_support

    enumeration_support(exact_support)  # an invalid value fails before the model loads
    adapter = load(model)
    check_finite_module(adapter.module, name=adapter.name)
    selection = selection or RowSelection()
    if max_memory is not None:
        selection = replace(selection, max_memory=max_memory)
    sequences, mask = model_inputs(
        adapter, tokens, attention_mask=attention_mask, seq_len=seq_len, n_sequences=n_sequences
    )
    layers = adapter.select_layers(selection.layers)
    n_positions = adapter.sequence_shape(sequences)[1]  # a vision model's patches and [CLS]
    identity: dict[str, Any] = {"run_id": run_id, "model": adapter.name, "step": step, "seed": seed}
    manifest = None
    if out_dir is not None:
        config = {
            **identity,
            "seq_len": n_positions,
            "n_sequences": int(sequences.shape[0]),
            "selection": asdict(selection),
            "tokens_sha": _token_digest(sequences),
            **({} if mask is None else {"attention_mask_sha": _token_digest(mask)}),
            **({} if exact_support is None else {"exact_support": exact_support}),
        }
        manifest = Manifest.open(out_dir, config=config)
        manifest.plan([*(_row_unit(index) for index in range(sequences.shape[0])), SUMMARY_UNIT])
        forget_untrusted(manifest, note=lambda message: print(f"note: {message}", file=sys.stderr))
    total, done = sequences.shape[0] * len(layers), 0

    def tick(count: int = 1) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    def capture(index: int, selection: RowSelection, columns: RowColumns, layer_done: Callable[[], None]) -> None:
        """Sequence ``index``'s rows into ``columns``; ``layer_done()`` after each layer's last block."""

        def keep(block: RowBlock) -> None:
            if columns.layers and columns.layers[-1] != block.layer:
                layer_done()
            columns.add(block)

        one_mask = None if mask is None else mask[index : index + 1]
        capture_row_statistics(
            adapter, sequences[index : index + 1], selection=selection, attention_mask=one_mask, on_block=keep,
            exact_support=exact_support,
        )  # fmt: skip
        layer_done()

    frames = []
    # One sequence written to a folder: each layer's summary records are every record of that layer, so they are
    # computed from its rows while they are in memory, before they go to disk, instead of read back at the end.
    one_sequence = manifest is not None and sequences.shape[0] == 1
    layer_summaries: _LayerSummaries | None = _LayerSummaries(identity) if one_sequence else None
    with enumeration_workspaces(exact_support):  # shared by every sequence's chunks
        for index in range(sequences.shape[0]):
            unit = _row_unit(index)
            if manifest is not None and manifest.is_done(unit):
                layer_summaries = None  # recorded by an earlier call: its rows are read back
                tick(len(layers))
                continue
            # Each sequence draws its own sampled positions (seed + sequence index), reproducibly, among its real
            # tokens.
            per_sequence = _real_positions(replace(selection, seed=selection.seed + index), mask, index)
            layer_rows = per_sequence.query_positions(1, n_positions).shape[1] * len(
                adapter.select_heads(per_sequence.heads)
            )
            if manifest is None:
                columns = RowColumns(capacity=len(layers) * layer_rows)
                capture(index, per_sequence, columns, tick)
                frames.append(columns.frame(batch_offset=index, **identity))
            else:
                # Written one layer at a time, a row group each: the folder's rows are never all in memory.
                columns = RowColumns(capacity=layer_rows)
                with manifest.unit_parts(unit, schema="rows") as write:
                    on_layer = partial(_write_layer, columns, write, index, identity, tick, layer_summaries)
                    capture(index, per_sequence, columns, on_layer)
            release_free_memory()
    if manifest is None:
        rows = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        return AuditResult(summary=summarize_rows(rows), n_rows=len(rows), _rows=rows)
    units = [_row_unit(index) for index in range(sequences.shape[0])]
    row_files = tuple(manifest.run_dir / unit for unit in units)
    n_rows = sum(int(manifest.units[unit]["num_rows"]) for unit in units)  # recorded with each unit
    if layer_summaries is not None:
        summary = layer_summaries.summary()
    else:
        summary = _summary_by_layers(row_files, layers, n_rows=n_rows, max_memory=selection.max_memory)
    manifest.write_unit(SUMMARY_UNIT, summary, schema="summary")
    return AuditResult(summary=summary, n_rows=n_rows, out_dir=manifest.run_dir, row_files=row_files)


def _write_layer(
    columns: RowColumns,
    write: Callable[[pa.Table], None],
    index: int,
    identity: dict[str, Any],
    tick: Callable[[], None],
    summaries: _LayerSummaries | None = None,
) -> None:
    """Write the layer of sequence ``index`` held in ``columns`` (emptying them), then count it done; first hand
    its rows to ``summaries`` when given (one sequence: they are all of the layer's rows)."""
    if summaries is not None:
        summaries.add(columns.held())
    write(columns.table(batch_offset=index, **identity))
    tick()


class _LayerSummaries:
    """The summary of an audit of one sequence written to a folder, from each layer's rows before they are written:
    every record pools rows of one layer, so finished layers are summarized together, as many as
    ``LAYER_SUMMARY_MEMORY`` holds, and nothing is read back from disk. The records equal ``summarize_rows`` of the
    whole rows table bit for bit."""

    def __init__(self, identity: dict[str, Any]) -> None:
        self._identity = identity
        self._held: list[dict[str, np.ndarray]] = []
        self._bytes = 0
        self._parts: list[pd.DataFrame] = []

    def add(self, columns: dict[str, np.ndarray]) -> None:
        """Keep a copy of the summarized columns of one layer's rows; summarize what is held once it fills the
        budget."""
        from attnsens.store.summary import SUMMARIZED_COLUMNS

        kept = {name: np.array(columns[name]) for name in SUMMARIZED_COLUMNS}
        self._held.append(kept)
        self._bytes += sum(values.nbytes for values in kept.values())
        if self._bytes >= LAYER_SUMMARY_MEMORY:
            self._summarize_held()

    def _summarize_held(self) -> None:
        from attnsens.store.summary import SUMMARIZED_COLUMNS, summarize_columns

        if self._held:
            merged = {name: np.concatenate([held[name] for held in self._held]) for name in SUMMARIZED_COLUMNS}
            self._parts.append(summarize_columns(merged, **self._identity))
            self._held, self._bytes = [], 0

    def summary(self) -> pd.DataFrame:
        """The summary table of every layer added."""
        self._summarize_held()
        return _concatenated(self._parts)


def _concatenated(summaries: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Summaries of disjoint groups of layers as one summary table, in the order of its key."""
    from attnsens.store.schema import SUMMARY

    summary = pd.concat(summaries, ignore_index=True) if len(summaries) > 1 else summaries[0]
    return summary.sort_values(list(SUMMARY.key), ignore_index=True)


SUMMARY_UNIT = "summary/summary.parquet"
"""The unit file of an audit folder's per-layer and per-head summary."""


def _row_unit(index: int) -> str:
    """The unit file of sequence ``index``'s rows in a run folder."""
    return f"rows/sequence={index:06d}.parquet"


def _summary_by_layers(
    row_files: Sequence[Path], layers: Sequence[int], *, n_rows: int, max_memory: int
) -> pd.DataFrame:
    """``summarize_rows`` of the rows table in ``row_files``, read and summarized a few layers at a time: as many as
    ``SUMMARY_MEMORY`` (or ``max_memory``, if smaller) holds at ``TABLE_BYTES_PER_ROW`` a row, at least one.

    Every summary record pools rows of one layer (one head, or all its heads), so the summaries of groups of
    layers concatenated are the whole table's summary, while only a group's rows are in memory at once. (One
    call per layer would cost summarize_rows' fixed ~10 ms thirty times over for a 30-layer model.)"""
    import pyarrow.dataset as ds

    from attnsens.store import summarize_rows

    dataset = ds.dataset([str(file) for file in row_files], format="parquet")
    per_layer = max(1, -(-n_rows // len(layers)))  # every layer has the same rows: heads × positions a sequence
    step = max(1, min(max_memory, SUMMARY_MEMORY) // TABLE_BYTES_PER_ROW // per_layer)
    parts = []
    for start in range(0, len(layers), step):
        table = dataset.to_table(filter=ds.field("layer").isin(list(layers[start : start + step])))
        parts.append(summarize_rows(table.replace_schema_metadata(None).to_pandas()))
        del table
    return _concatenated(parts)


class RowColumns:
    """The ``rows``-table columns of streamed RowBlocks, one array per column in the schema's dtypes.

    ``add`` is an ``on_block`` callback: each block's statistics are copied into the columns (83 bytes per row) as
    it arrives, so neither the blocks' RowStats nor a second copy of the table exists while the capture runs. The
    columns are allocated once for ``capacity`` rows (grown by doubling if more arrive): keeping each block's own
    small arrays instead left them scattered through the heap between the chunks' large transient buffers, which
    glibc then could not reuse or return, and the capture's extra memory at 2,048 tokens moved between 240 and
    740 MiB with the order of allocations.
    """

    def __init__(self, capacity: int = 0) -> None:
        from attnsens.store.schema import ROWS

        self._dtypes = {column.name: column.dtype.to_pandas_dtype() for column in ROWS.columns}
        self._capacity = max(int(capacity), 0)
        self._columns: dict[str, np.ndarray] = {}
        self._count = 0
        self.layers: list[int] = []

    def add(self, block: RowBlock) -> None:
        """Copy the block's rows into the columns: each column's slice, viewed as [batch, head, query], takes its
        values from ``RowBlock.grid`` by broadcasting (the columns of ``RowBlock.columns``, without building them
        first)."""
        if not self.layers or self.layers[-1] != block.layer:
            self.layers.append(block.layer)
        shape = tuple(block.stats.p_max.shape)
        count = int(np.prod(shape))
        self._reserve(self._count + count)
        for name, values in block.grid().items():
            if name not in self._columns:
                self._columns[name] = np.empty(self._capacity, dtype=self._dtypes[name])
            self._columns[name][self._count : self._count + count].reshape(shape)[...] = values.numpy()
        self._count += count

    def _reserve(self, rows: int) -> None:
        if rows <= self._capacity:
            return
        self._capacity = max(rows, 2 * self._capacity)
        for name, column in self._columns.items():
            grown = np.empty(self._capacity, dtype=column.dtype)
            grown[: self._count] = column[: self._count]
            self._columns[name] = grown

    def table(self, *, run_id: str, model: str, step: int, seed: int, batch_offset: int = 0) -> pa.Table:
        """The collected rows as an Arrow table of the store's ``rows`` table (empties the columns)."""
        from attnsens.store import conform

        columns = {name: column[: self._count] for name, column in self._columns.items()}
        self._columns = {}
        self._count = 0
        columns["batch"] += batch_offset
        count = len(columns["layer"])
        identity = {
            "run_id": pa.repeat(run_id, count),
            "model": pa.repeat(model, count),
            "step": np.full(count, step, dtype=np.int64),
            "seed": np.full(count, seed, dtype=np.int64),
        }
        # Through the schema, so fresh and resumed frames carry the same dtypes.
        return conform(pa.table({**identity, **columns}), "rows")

    def held(self) -> dict[str, np.ndarray]:
        """The collected rows' columns (views, valid until the columns are emptied or grow)."""
        return {name: column[: self._count] for name, column in self._columns.items()}

    def frame(self, *, run_id: str, model: str, step: int, seed: int, batch_offset: int = 0) -> pd.DataFrame:
        """The collected rows as a DataFrame with the columns of the store's ``rows`` table (empties the columns)."""
        table = self.table(run_id=run_id, model=model, step=step, seed=seed, batch_offset=batch_offset)
        return table.to_pandas(self_destruct=True)


def model_inputs(
    adapter: ModelAdapter,
    tokens: Tensor | str | Sequence[str],
    *,
    attention_mask: Tensor | None = None,
    seq_len: int | None = None,
    n_sequences: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The [batch, n] int64 token ids and padding mask (None: no padding) ``audit`` reads (see its arguments); for
    a float [batch, channel, H, W] or [channel, H, W] tensor, a vision model's images, checked by the adapter."""
    if isinstance(tokens, Tensor) and tokens.is_floating_point() and tokens.ndim in (3, 4):
        if attention_mask is not None or seq_len is not None:
            raise InputError("images are audited whole: drop attention_mask and seq_len")
        pixels = adapter.check_input_ids(tokens if tokens.ndim == 4 else tokens.unsqueeze(0))
        return pixels[:n_sequences], None
    if isinstance(tokens, list | tuple) and any(isinstance(item, str) for item in tokens):
        if attention_mask is not None or seq_len is not None:
            raise InputError("a list of texts is padded to its longest text; drop attention_mask and seq_len")
        if not all(isinstance(item, str) and item.strip() for item in tokens):
            raise InputError("every item of a list of texts to audit must be a non-empty string")
        texts = list(tokens)[:n_sequences] if n_sequences is not None else list(tokens)
        ids, mask = adapter.encode_batch(texts, max_length=adapter.spec.max_positions)
        return split_sequences(adapter, ids), _checked_mask(mask, ids)
    if attention_mask is None:
        return split_sequences(adapter, tokens, seq_len=seq_len, n_sequences=n_sequences), None
    if seq_len is not None:
        raise InputError("seq_len cuts a token stream into windows; with an attention_mask give [batch, n] as is")
    ids = split_sequences(adapter, tokens, n_sequences=n_sequences)
    return ids, _checked_mask(attention_mask, ids)


def _checked_mask(attention_mask: Any, ids: Tensor) -> Tensor | None:
    """The padding mask as int64 [batch, n] (None when nothing is padded), each row's tokens contiguous."""
    mask = torch.as_tensor(attention_mask)
    if mask.ndim == 1:
        mask = mask.unsqueeze(0)
    mask = mask[: ids.shape[0]]
    if mask.shape != ids.shape:
        raise InputError(f"attention_mask shape {tuple(mask.shape)} must equal the tokens' shape {tuple(ids.shape)}")
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise InputError("attention_mask must hold 1 for tokens and 0 for padding only")
    mask = mask.to(torch.long)
    counts = mask.sum(dim=1)
    if bool((counts == 0).any()):
        raise InputError(f"sequences {(counts == 0).nonzero().flatten().tolist()} are all padding; drop them")
    if bool(((mask[:, 1:] != mask[:, :-1]).sum(dim=1) > 1).any()):  # one 0/1 edge at most: left or right padding
        raise InputError("each sequence's tokens must be contiguous (left or right padding) in attention_mask")
    return None if bool((counts == mask.shape[1]).all()) else mask


def _real_positions(selection: RowSelection, mask: Tensor | None, index: int) -> RowSelection:
    """``selection`` narrowed to sequence ``index``'s real (unpadded) query positions."""
    if mask is None:
        return selection
    real = mask[index].nonzero().flatten()
    first, stop = int(real[0]), int(real[-1]) + 1
    start = max(selection.query_start, first)
    stop = stop if selection.query_stop is None else min(selection.query_stop, stop)
    if stop <= start:
        raise InputError(
            f"sequence {index} has no real token in the selected query positions [{selection.query_start}, "
            f"{selection.query_stop}); its tokens are at [{first}, {int(real[-1]) + 1})"
        )
    return replace(selection, query_start=start, query_stop=stop)


def split_sequences(
    adapter: ModelAdapter,
    tokens: Tensor | str | Sequence[Any],
    *,
    seq_len: int | None = None,
    n_sequences: int | None = None,
) -> Tensor:
    """The [batch, n] int64 token ids of unpadded ``tokens`` (see ``audit``'s ``tokens``, ``seq_len`` and
    ``n_sequences``); text cut into windows gets the tokenizer's special tokens in every window."""
    if isinstance(tokens, str):
        if not tokens.strip():
            raise InputError("the text to audit is empty; give a file or corpus with some text")
        if seq_len is None:
            tokens = adapter.encode(tokens)[0]
        else:
            _check_seq_len(adapter, seq_len)
            return _text_windows(adapter, tokens, seq_len=seq_len, n_sequences=n_sequences)
    try:
        tokens = torch.as_tensor(tokens)
    except (TypeError, ValueError, RuntimeError) as err:
        raise InputError(f"tokens must be text or integer token ids, got {type(tokens).__name__} ({err})") from err
    if tokens.ndim not in (1, 2) or tokens.numel() == 0:
        raise InputError(f"tokens must be a non-empty [n] stream or [batch, n] tensor, got shape {tuple(tokens.shape)}")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise InputError(f"tokens must be integer token ids, got dtype {tokens.dtype}; pass a torch.long tensor")
    low, high, vocab = int(tokens.min()), int(tokens.max()), adapter.spec.vocab_size
    if low < 0 or high >= vocab:
        raise InputError(
            f"token ids must lie in [0, {vocab}) for {adapter.name!r} (its vocabulary), got ids in [{low}, {high}]; "
            "encode with the model's own tokenizer"
        )
    if seq_len is not None:
        _check_seq_len(adapter, seq_len)
        stream = tokens.reshape(-1)
        count = stream.numel() // seq_len
        if count == 0:
            raise InputError(
                f"the input has {stream.numel()} tokens, fewer than seq_len {seq_len}; "
                "give more text or a shorter seq_len"
            )
        tokens = stream[: count * seq_len].reshape(count, seq_len)
    elif tokens.ndim == 1:
        tokens = tokens.unsqueeze(0)
    if n_sequences is not None:
        if n_sequences < 1:
            raise InputError(f"n_sequences must be >= 1, got {n_sequences}")
        tokens = tokens[:n_sequences]
    return tokens.to(torch.long)


def text_seq_len(adapter: ModelAdapter, text: str) -> int:
    """Tokens of ``text`` with the tokenizer's special tokens, at most the model's context: the ``seq_len`` that
    audits one window of all of a short text, or as much of a long one as the context holds. A long text is
    tokenized only that far (the 5 MB Shakespeare corpus whole took 6.6 s for SmolLM2's tokenizer)."""
    if not text.strip():
        raise InputError("the text to audit is empty; give a file or corpus with some text")
    prefix, suffix = adapter.special_tokens()
    context = adapter.spec.max_positions
    tokens = _encode_prefix(adapter, text, max(context - len(prefix) - len(suffix), 1)).numel()
    return min(context, tokens + len(prefix) + len(suffix))


def _check_seq_len(adapter: ModelAdapter, seq_len: int) -> None:
    if seq_len < 1:
        raise InputError(f"seq_len must be >= 1, got {seq_len}")
    if seq_len > adapter.spec.max_positions:
        raise InputError(
            f"seq_len {seq_len} exceeds the context of {adapter.name!r} ({adapter.spec.max_positions} positions); "
            f"use --seq-len {adapter.spec.max_positions} or less"
        )


def _text_windows(adapter: ModelAdapter, text: str, *, seq_len: int, n_sequences: int | None) -> Tensor:
    """``text`` as windows of ``seq_len`` tokens: prefix specials + consecutive tokens of the text + suffix."""
    prefix, suffix = adapter.special_tokens()
    content = seq_len - len(prefix) - len(suffix)
    if content < 1:
        raise InputError(
            f"seq_len {seq_len} leaves no room for text beside the {len(prefix) + len(suffix)} special tokens "
            f"of {adapter.name!r}'s tokenizer; use a longer seq_len"
        )
    needed = None if n_sequences is None else content * n_sequences
    stream = _encode_prefix(adapter, text, needed)
    if stream.numel() < content:
        count = stream.numel()
        raise InputError(
            f"the text has {count} token{'s' if count != 1 else ''}, fewer than the {content} of one window: "
            f"seq_len {seq_len} less the {len(prefix) + len(suffix)} special tokens of the tokenizer of "
            f"{adapter.name!r}; give more text or a shorter seq_len"
        )
    windows = split_sequences(adapter, stream, seq_len=content, n_sequences=n_sequences)
    around = [torch.tensor(ids, dtype=torch.long).expand(windows.shape[0], -1) for ids in (prefix, suffix)]
    return split_sequences(adapter, torch.cat([around[0], windows, around[1]], dim=1), seq_len=None)


def _encode_prefix(adapter: ModelAdapter, text: str, needed: int | None) -> Tensor:
    """Token stream of ``text`` without special tokens, or of a prefix of it long enough for ``needed`` tokens
    (large corpora)."""
    if needed is None:
        return adapter.encode(text, special_tokens=False)[0]
    chars = 8 * needed
    while True:
        tokens = adapter.encode(text[:chars], special_tokens=False)[0]
        if tokens.numel() > needed or chars >= len(text):
            return tokens
        chars *= 4


def _token_digest(sequences: Tensor) -> str:
    import hashlib

    return hashlib.sha256(sequences.cpu().numpy().tobytes()).hexdigest()[:16]
