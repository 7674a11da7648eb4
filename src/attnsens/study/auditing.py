"""Audit a model: every selected attention row of some token sequences → a per-row table and per-(layer, head)
summary (docs/math.md §9.4–9.5, A3), optionally written to a run directory that resumes after an interruption.

Run directory layout: ``manifest.json`` (config, provenance, finished units with sha256),
``rows/sequence=NNNNNN.parquet`` (one file per audited sequence: the unit of work) and
``summary/summary.parquet``.

One loop (``_audit_rows``) captures each sequence's rows a layer at a time into a ``RowSink``: ``MemoryRows`` keeps
them as a DataFrame, ``FolderRows`` writes them to the run directory. What is audited (text, token ids, windows,
masks) comes from ``attnsens.study.inputs``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
from torch import Tensor

from attnsens._ranks import rank_share, ranks
from attnsens.capture import RowBlock, RowSelection, capture_row_statistics
from attnsens.capture.allocator import release_free_memory
from attnsens.capture.stream import enumeration_workspaces
from attnsens.models import ModelAdapter, load
from attnsens.store.lock import writes_run_folder
from attnsens.study.inputs import Note, model_inputs, print_note, real_positions

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
    note: Note = print_note,
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
            window; each row of a [batch, n] tensor is cut to its first ``seq_len`` tokens. Default, as
            ``attnsens audit``: the text or the ids up to the context, and for a model whose forward pass holds a
            layer's n² attention scores, up to what half the memory holds (``attnsens.study.inputs.window_length``;
            a longer ``seq_len`` is refused).
        n_sequences: audit only the first this many sequences (default: all); text or ids without a mask that
            give fewer are an InputError.
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
        note: told of a default window shortened to fit in memory and of run-folder units rebuilt (default:
            ``note: …`` on stderr).

    Under torchrun (a process group of several ranks, ``attnsens.train.trainer.init_distributed``), an audit into
    ``out_dir`` is shared out: each rank audits one contiguous block of the sequences and records its own units in
    the folder's manifest; rank 0 writes the summary once every rank is done, and every rank returns the whole
    audit. A rerun redoes only the units a killed rank left unrecorded. An audit in memory is not shared: each rank
    audits what it is given (a study's ranks audit their own checkpoints).

    Returns:
        AuditResult with the rows and summary tables (attnsens.store.schema ROWS / SUMMARY).
    """
    from attnsens.study.finite import check_finite_module
    from attnsens.theta.certificate import enumeration_support

    enumeration_support(exact_support)  # an invalid value fails before the model loads
    adapter = load(model)
    check_finite_module(adapter.module, name=adapter.name)
    selection = selection or RowSelection()
    if max_memory is not None:
        selection = replace(selection, max_memory=max_memory)
    sequences, mask = model_inputs(
        adapter, tokens, attention_mask=attention_mask, seq_len=seq_len, n_sequences=n_sequences, note=note
    )
    layers = adapter.select_layers(selection.layers)
    # Shared out only into a run folder: an audit in memory is the caller's own (a study's rank audits its checkpoints).
    rank, world = ranks() if out_dir is not None else (0, 1)
    identity: dict[str, Any] = {"run_id": run_id, "model": adapter.name, "step": step, "seed": seed}
    sink: RowSink
    if out_dir is None:
        sink = MemoryRows(identity, n_layers=len(layers), attention=adapter.spec.attention)
    else:
        config = {
            **identity,
            "seq_len": adapter.sequence_shape(sequences)[1],  # a vision model's patches and [CLS]
            "n_sequences": int(sequences.shape[0]),
            "selection": asdict(selection),
            "tokens_sha": _token_digest(sequences),
            **({} if mask is None else {"attention_mask_sha": _token_digest(mask)}),
            **({} if exact_support is None else {"exact_support": exact_support}),
        }
        sink = FolderRows.open(
            out_dir, config, identity, layers=layers, max_memory=selection.max_memory, note=note,
            attention=adapter.spec.attention,
        )  # fmt: skip
    share = rank_share(int(sequences.shape[0]), rank, world)
    _audit_rows(
        adapter, sequences, mask, selection, sink, share, layers=layers, exact_support=exact_support, progress=progress
    )
    if isinstance(sink, FolderRows) and world > 1:
        return _shared_result(sink, rank)
    return sink.result()


def _shared_result(sink: FolderRows, rank: int) -> AuditResult:
    """The audit of every rank's sequences: rank 0 makes it (the summary) once all ranks are done, the others
    read it back once rank 0 has."""
    import torch.distributed as dist

    dist.barrier()  # every rank's units recorded
    result = sink.result() if rank == 0 else None
    dist.barrier()  # the summary written
    return result if result is not None else sink.recorded_result()


def _audit_rows(
    adapter: ModelAdapter,
    sequences: Tensor,
    mask: Tensor | None,
    selection: RowSelection,
    sink: RowSink,
    share: range,
    *,
    layers: Sequence[int],
    exact_support: int | None,
    progress: ProgressCallback | None,
) -> None:
    """Every selected row of the ``share`` of ``sequences`` [batch, n] into ``sink``, one sequence and layer at a
    time; sequences the sink has recorded already are skipped."""
    n_positions = adapter.sequence_shape(sequences)[1]  # a vision model's patches and [CLS]
    count = _Progress(progress, total=len(share) * len(layers))
    with enumeration_workspaces(exact_support):  # shared by every sequence's chunks
        for index in share:
            if sink.recorded(index):
                count.advance(len(layers))
                continue
            # Each sequence draws its own sampled positions (seed + sequence index), reproducibly, among its real
            # tokens.
            per_sequence = real_positions(replace(selection, seed=selection.seed + index), mask, index)
            layer_rows = per_sequence.query_positions(1, n_positions).shape[1] * len(
                adapter.select_heads(per_sequence.heads)
            )
            with sink.sequence(index, layer_rows) as columns:
                feed = _LayerFeed(sink, index, columns, count)
                capture_row_statistics(
                    adapter, sequences[index : index + 1], selection=per_sequence, on_block=feed.add,
                    attention_mask=None if mask is None else mask[index : index + 1], exact_support=exact_support,
                )  # fmt: skip
                feed.layer_done()
            release_free_memory()


class _Progress:
    """``progress(done, total)`` after each (sequence, layer) pair."""

    def __init__(self, progress: ProgressCallback | None, *, total: int) -> None:
        self._progress, self.total, self.done = progress, total, 0

    def advance(self, count: int = 1) -> None:
        self.done += count
        if self._progress is not None:
            self._progress(self.done, self.total)


class _LayerFeed:
    """The ``on_block`` of one sequence's capture: each block into ``columns``; each layer, once its last block is
    in (the next layer's first arrives, or ``layer_done`` after the capture), to the sink and the progress."""

    def __init__(self, sink: RowSink, index: int, columns: RowColumns, progress: _Progress) -> None:
        self._sink, self._index, self._columns, self._progress = sink, index, columns, progress

    def add(self, block: RowBlock) -> None:
        if self._columns.layers and self._columns.layers[-1] != block.layer:
            self.layer_done()
        self._columns.add(block)

    def layer_done(self) -> None:
        self._sink.update(self._index, self._columns)
        self._progress.advance()


class RowSink(Protocol):
    """Where an audit's rows go, a sequence at a time, in the update/compute split of a streaming metric:
    ``sequence`` opens the columns the sequence's blocks are copied into, ``update`` takes each of its layers once
    the layer is complete, ``result`` makes the audit when every sequence is done."""

    def recorded(self, index: int) -> bool:
        """Whether sequence ``index``'s rows are kept already (by an earlier call): they are not recomputed."""
        ...

    def sequence(self, index: int, layer_rows: int) -> AbstractContextManager[RowColumns]:
        """The columns for sequence ``index``'s rows (``layer_rows`` a layer); kept if the block ends without an
        error."""
        ...

    def update(self, index: int, columns: RowColumns) -> None:
        """A complete layer of sequence ``index``: the last rows added to ``columns``."""
        ...

    def result(self) -> AuditResult:
        """The audit of every sequence: rows and summary."""
        ...


class MemoryRows:
    """RowSink of an audit held in memory: each sequence's rows of every layer in one set of columns allocated once,
    then a DataFrame; the summary of all the rows at the end."""

    def __init__(self, identity: dict[str, Any], *, n_layers: int, attention: Sequence[str] = ()) -> None:
        self._identity, self._n_layers, self._attention = identity, n_layers, attention
        self._frames: list[pd.DataFrame] = []

    def recorded(self, index: int) -> bool:
        return False

    @contextmanager
    def sequence(self, index: int, layer_rows: int) -> Iterator[RowColumns]:
        columns = RowColumns(capacity=self._n_layers * layer_rows, attention=self._attention)
        yield columns
        self._frames.append(columns.frame(batch_offset=index, **self._identity))

    def update(self, index: int, columns: RowColumns) -> None:
        """Nothing to do: the columns hold every layer of the sequence until it ends."""

    def result(self) -> AuditResult:
        from attnsens.store import summarize_rows

        rows = self._frames[0] if len(self._frames) == 1 else pd.concat(self._frames, ignore_index=True)
        return AuditResult(summary=summarize_rows(rows), n_rows=len(rows), _rows=rows)


class FolderRows:
    """RowSink of an audit written to a run folder: each sequence's rows one unit of the manifest, each layer one
    row group written once complete, so only one layer's rows are in memory; the summary from each layer's rows
    before they are written (one sequence, ``_LayerSummaries``) or read back a few layers at a time."""

    def __init__(
        self,
        manifest: Any,
        identity: dict[str, Any],
        *,
        n_sequences: int,
        layers: Sequence[int],
        max_memory: int,
        attention: Sequence[str] = (),
    ) -> None:
        self._manifest, self._identity, self._n_sequences = manifest, identity, n_sequences
        self._attention = attention
        self._layers, self._max_memory = layers, max_memory
        # One sequence: each layer's summary records are every record of that layer, so they are computed from its
        # rows while they are in memory, before they go to disk, instead of read back at the end.
        self._layer_summaries = _LayerSummaries(self._identity) if n_sequences == 1 else None
        self._write: Callable[[pa.Table], None] | None = None

    @classmethod
    def open(
        cls,
        out_dir: str | Path,
        config: dict[str, Any],
        identity: dict[str, Any],
        *,
        layers: Sequence[int],
        max_memory: int,
        note: Note,
        attention: Sequence[str] = (),
    ) -> FolderRows:
        """The sink of the run folder ``out_dir`` of the audit ``config`` (its ``n_sequences`` sequences' rows
        stamped with ``identity``), its units planned and any untrusted one forgotten (``note`` told);
        ``max_memory`` bounds the summary's read-back (``_summary_by_layers``)."""
        from attnsens.store import Manifest
        from attnsens.store.verify import forget_untrusted

        manifest = Manifest.open(out_dir, config=config)
        n_sequences = int(config["n_sequences"])
        manifest.plan([*(_row_unit(index) for index in range(n_sequences)), SUMMARY_UNIT])
        forget_untrusted(manifest, note=note)
        return cls(
            manifest, identity, n_sequences=n_sequences, layers=layers, max_memory=max_memory, attention=attention
        )

    def recorded(self, index: int) -> bool:
        if not self._manifest.is_done(_row_unit(index)):
            return False
        self._layer_summaries = None  # recorded by an earlier call: its rows are read back
        return True

    @contextmanager
    def sequence(self, index: int, layer_rows: int) -> Iterator[RowColumns]:
        with self._manifest.unit_parts(_row_unit(index), schema="rows") as write:
            self._write = write
            try:
                yield RowColumns(capacity=layer_rows, attention=self._attention)
            finally:
                self._write = None

    def update(self, index: int, columns: RowColumns) -> None:
        """Write the layer held in ``columns`` (emptying them) as a row group; first hand its rows to the layer
        summaries when there is one sequence (they are all of the layer's rows)."""
        if self._write is None:
            raise RuntimeError("FolderRows.update outside a sequence(): open the sequence first")
        if self._layer_summaries is not None:
            self._layer_summaries.add(columns.held())
        self._write(columns.table(batch_offset=index, **self._identity))

    def result(self) -> AuditResult:
        row_files, n_rows = self._recorded_rows()
        if self._layer_summaries is not None:
            summary = self._layer_summaries.summary()
        else:
            summary = _summary_by_layers(row_files, self._layers, n_rows=n_rows, max_memory=self._max_memory)
        self._manifest.write_unit(SUMMARY_UNIT, summary, schema="summary")
        return AuditResult(summary=summary, n_rows=n_rows, out_dir=self._manifest.run_dir, row_files=row_files)

    def recorded_result(self) -> AuditResult:
        """The audit as another process recorded it (rank 0 of a shared audit): its summary read back."""
        from attnsens.store.parquet import read_table

        row_files, n_rows = self._recorded_rows()
        summary = read_table(self._manifest.run_dir / SUMMARY_UNIT)
        return AuditResult(summary=summary, n_rows=n_rows, out_dir=self._manifest.run_dir, row_files=row_files)

    def _recorded_rows(self) -> tuple[tuple[Path, ...], int]:
        """Every sequence's rows file and their number of rows, as the manifest records them now (with the units
        other ranks of a shared audit recorded)."""
        self._manifest.refresh()
        units = [_row_unit(index) for index in range(self._n_sequences)]
        n_rows = sum(int(self._manifest.units[unit]["num_rows"]) for unit in units)  # recorded with each unit
        return tuple(self._manifest.run_dir / unit for unit in units), n_rows


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

    def __init__(self, capacity: int = 0, *, attention: Sequence[str] = ()) -> None:
        from attnsens.store.schema import ROWS

        self._attention = np.asarray(attention, dtype=object)  # per layer of an encoder-decoder (ModelSpec.attention)
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
        if len(self._attention):
            columns["attention"] = pa.array(self._attention[columns["layer"]], type=pa.string())
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


def _token_digest(sequences: Tensor) -> str:
    import hashlib

    return hashlib.sha256(sequences.cpu().numpy().tobytes()).hexdigest()[:16]
