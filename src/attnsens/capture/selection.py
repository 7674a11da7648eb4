"""Which attention rows to capture: layers, heads and query positions (all, a range, or k sampled per sequence)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnsens.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class RowSelection:
    """Rows to audit.

    Query positions are ``query_start ≤ t < query_stop`` (stop None = sequence end); with
    ``sample_per_sequence = k`` each sequence gets k of those positions drawn without replacement from a
    generator seeded with ``seed`` (docs/math.md §9.4), so a rerun selects the same rows. ``chunk_size`` queries are
    recomputed at a time (peak extra memory: one [batch, head, chunk_size, n] float32 block); by default as many
    as fit in ``chunk_bytes`` (32 MiB: all 512 rows of a 9-head layer at n = 512, 16 rows at n = 8192).
    """

    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    query_start: int = 0
    query_stop: int | None = None
    sample_per_sequence: int | None = None
    seed: int = 0
    chunk_size: int | None = None
    chunk_bytes: int = 32 * 2**20

    def __post_init__(self) -> None:
        if self.query_start < 0:
            raise ConfigError(f"query_start must be >= 0, got {self.query_start}")
        if self.query_stop is not None and self.query_stop <= self.query_start:
            raise ConfigError(f"query_stop ({self.query_stop}) must exceed query_start ({self.query_start})")
        if self.sample_per_sequence is not None and self.sample_per_sequence < 1:
            raise ConfigError(f"sample_per_sequence must be >= 1, got {self.sample_per_sequence}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ConfigError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.chunk_bytes < 1:
            raise ConfigError(f"chunk_bytes must be >= 1, got {self.chunk_bytes}")
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
            raise ConfigError(f"cannot sample {k} positions per sequence from {candidates.numel()} candidates")
        generator = torch.Generator().manual_seed(self.seed)
        picks = [
            candidates[torch.randperm(candidates.numel(), generator=generator)[:k]].sort().values for _ in range(batch)
        ]
        return torch.stack(picks).to(device)

    def rows_per_chunk(self, *, batch: int, heads: int, n: int) -> int:
        """Queries recomputed at once: ``chunk_size``, or as many float32 rows as fit in ``chunk_bytes``."""
        if self.chunk_size is not None:
            return self.chunk_size
        return max(1, self.chunk_bytes // (4 * batch * heads * n))
