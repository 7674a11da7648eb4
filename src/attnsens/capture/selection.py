"""Which attention rows to capture: layers, heads and query positions (all, a range, or k sampled per sequence)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnsens.errors import ConfigError

DEFAULT_MAX_MEMORY = 128 * 2**20
"""Default working-set budget of one chunk of recomputed rows, in bytes (fits a laptop at SmolLM2's context)."""
WORKING_BYTES_PER_SCORE = 8
"""Bytes per (head, query, key) while a chunk is reduced: float32 scores and the float32 softmax of them."""
MASK_BYTES_PER_KEY = 2
"""Bytes per (query, key) of the chunk's boolean key mask and its negation."""
SPEED_CHUNK_BYTES = 16 * 2**20
"""Largest float32 scores tensor [batch, head, query, n] of a default chunk, however large the memory budget: the
scores, their softmax and the row statistics that read it then work in the processor's caches (a 32 MiB L3 on
the reference machine), glibc serves every chunk from the memory the previous one freed instead of mapping fresh
pages, and the chunks' working set (scores and probabilities, 32 MiB) is the same at every length. (A floor of 256
rows under this limit once made the working set grow with n, to the whole 128 MiB budget at SmolLM2's 8,192
tokens. Replaying one SmolLM2 layer's chunk loop, four times each, alternating: 56-row chunks 1.42–1.55 s against
1.35–1.56 s for 221 rows at 8,192 tokens, 113-row chunks 0.38–0.41 s against 0.41–0.49 s for 256 rows at 4,096.
Whole audits pay the chunks' fixed costs (Python, smaller matrix products) more often: with the causal chunks of
query slices, 82 chunks a layer instead of 45 at 8,192 tokens, 5–10 % more time there; none at 2,048.)"""
SPEED_CHUNK_FRACTION = 4
"""A default chunk holds at most 1/4 of the selected rows (rounded up, and at least ``MIN_CHUNK_ROWS``): a causal
chunk of c of n rows computes about c²/2 masked scores, c/n of the n²/2 useful ones, while smaller chunks cost
the θ engine more per row (fewer rows per call to share between threads)."""
MIN_CHUNK_ROWS = 64
"""Fewest rows the 1/4 limit (``SPEED_CHUNK_FRACTION``) cuts a default chunk to: smaller chunks cost more in
per-call overhead than they save."""


@dataclass(frozen=True, kw_only=True)
class RowSelection:
    """Rows to audit.

    Query positions are ``query_start ≤ t < query_stop`` (stop None = sequence end); with
    ``sample_per_sequence = k`` each sequence gets k of those positions drawn without replacement from a
    generator seeded with ``seed`` (docs/math.md §9.4), so a rerun selects the same rows.

    Rows are recomputed a chunk of queries at a time (:meth:`chunk_bounds`): ``chunk_size`` queries, or by default
    as many as keep the chunk's working set (scores and probabilities in float32, the key mask) within
    ``max_memory`` bytes (default 128 MiB: all 512 rows of a 9-head layer at n = 512, 221 rows at n = 8192), and
    for speed no more than 1/4 of the rows (``SPEED_CHUNK_FRACTION``; at least ``MIN_CHUNK_ROWS``) and no more
    than keep the float32 scores within ``SPEED_CHUNK_BYTES`` (16 MiB: 56 rows of a 9-head layer at n = 8192), so
    that by default the chunks' working set does not grow with n.
    With ``causal`` chunk bounds a chunk covers only the keys up to its last query (capture_row_statistics uses
    all keys, since the layer's own mask decides which count).
    """

    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    query_start: int = 0
    query_stop: int | None = None
    sample_per_sequence: int | None = None
    seed: int = 0
    chunk_size: int | None = None
    max_memory: int = DEFAULT_MAX_MEMORY

    def __post_init__(self) -> None:
        if self.query_start < 0:
            raise ConfigError(f"query_start must be >= 0, got {self.query_start}")
        if self.query_stop is not None and self.query_stop <= self.query_start:
            raise ConfigError(f"query_stop ({self.query_stop}) must exceed query_start ({self.query_start})")
        if self.sample_per_sequence is not None and self.sample_per_sequence < 1:
            raise ConfigError(f"sample_per_sequence must be >= 1, got {self.sample_per_sequence}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ConfigError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.max_memory < 1:
            raise ConfigError(f"max_memory must be >= 1 byte, got {self.max_memory}; pass e.g. 128 * 2**20")
        for name in ("layers", "heads"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(int(i) for i in value))

    def query_positions(self, batch: int, n: int, *, device: str | torch.device = "cpu") -> Tensor:
        """LongTensor [batch, query] of the selected positions (sorted per sequence)."""
        stop = n if self.query_stop is None else min(self.query_stop, n)
        if stop <= self.query_start:
            raise ConfigError(
                f"no query positions in [{self.query_start}, {stop}) for sequences of length {n}; "
                f"lower query_start or use longer sequences"
            )
        candidates = torch.arange(self.query_start, stop)
        k = self.sample_per_sequence
        if k is None:
            return candidates.expand(batch, -1).to(device)
        if k > candidates.numel():
            raise ConfigError(
                f"cannot sample {k} positions per sequence from the {candidates.numel()} query positions "
                f"[{self.query_start}, {stop}) of sequences of {n} tokens; sample {candidates.numel()} or fewer, or "
                "none (every row), or use longer sequences"
            )
        generator = torch.Generator().manual_seed(self.seed)
        picks = [
            candidates[torch.randperm(candidates.numel(), generator=generator)[:k]].sort().values for _ in range(batch)
        ]
        return torch.stack(picks).to(device)

    def chunk_bounds(self, positions: Tensor, *, heads: int, n: int, causal: bool) -> list[tuple[int, int, int]]:
        """``(first, stop, keys)`` per chunk: columns ``first:stop`` of ``positions`` [batch, query] (sorted per
        sequence) are recomputed together over the first ``keys`` keys (all n, or up to the chunk's last query
        under a causal mask), each chunk holding ``chunk_size`` queries, or as many as fit in ``max_memory`` (at
        least one) and the speed limits of the class docstring."""
        count = positions.shape[1]
        if causal:
            widths = positions.max(dim=0).values.cpu() + 1  # non-decreasing: positions are sorted per sequence
        else:
            widths = torch.full((count,), n, dtype=torch.int64)
        bytes_per_key = positions.shape[0] * (heads * WORKING_BYTES_PER_SCORE + MASK_BYTES_PER_KEY)
        bytes_per_score = positions.shape[0] * heads * 4
        fraction = max(MIN_CHUNK_ROWS, -(-count // SPEED_CHUNK_FRACTION))
        bounds, first = [], 0
        while first < count:
            if self.chunk_size is not None:
                stop = min(count, first + self.chunk_size)
            else:
                pairs = torch.arange(1, count - first + 1) * widths[first:]  # (query, key) pairs of 1, 2, … rows
                fits = int(torch.searchsorted(pairs * bytes_per_key, self.max_memory, right=True))
                cached = int(torch.searchsorted(pairs * bytes_per_score, SPEED_CHUNK_BYTES, right=True))
                stop = first + max(1, min(fits, fraction, cached))
            bounds.append((first, stop, int(widths[stop - 1])))
            first = stop
        return bounds
