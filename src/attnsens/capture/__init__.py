"""Streaming capture: attention rows reduced to statistics on the fly, layer by layer, chunk by chunk.

import attnsens as A
model = A.models.load("smollm2")
blocks = A.capture.capture_row_statistics(model, ids, selection=A.capture.RowSelection(sample_per_sequence=64))
A.capture.row_statistics(probs)          # the pure kernel: θ certificate, p_max, entropy, n_eff, ...
"""

from __future__ import annotations

from attnsens.capture.accumulator import RowSummaryAccumulator
from attnsens.capture.monitor import SensitivityMonitor
from attnsens.capture.selection import RowSelection
from attnsens.capture.statistics import RowStats, row_statistics
from attnsens.capture.stream import RowBlock, capture_row_statistics

__all__ = [
    "RowBlock",
    "RowSelection",
    "RowStats",
    "RowSummaryAccumulator",
    "SensitivityMonitor",
    "capture_row_statistics",
    "row_statistics",
]
