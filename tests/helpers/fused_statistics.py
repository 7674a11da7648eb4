"""``row_statistics`` by the general path, the reference of the one-pass statistics kernel."""

from __future__ import annotations

import torch

import attnsens.capture.statistics as statistics
from attnsens.capture.statistics import RowStats, row_statistics


def general_path(
    probs: torch.Tensor,
    n_keys: torch.Tensor | None = None,
    exact_support: int | None = None,
    logits: torch.Tensor | None = None,
) -> RowStats:
    """``row_statistics`` with the one-pass kernel switched off."""
    saved = statistics._fused_row_statistics
    statistics._fused_row_statistics = lambda *args: None
    try:
        return row_statistics(probs, n_keys=n_keys, exact_support=exact_support, logits=logits)
    finally:
        statistics._fused_row_statistics = saved
