"""A stateful accumulator of row statistics per (layer, head), torchmetrics-style: ``update`` then ``compute``."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor

from attnsens.capture.stream import RowBlock

_KEPT = ("theta_lower", "theta_upper", "p_max", "entropy", "normalized_entropy", "n_eff", "dominant", "theta_exact")


class RowSummaryAccumulator:
    """Collects the statistics of streamed RowBlocks and summarizes them per (layer, head) (docs/math.md A3).

    Keeps only the few per-row scalars a summary needs (8 numbers per row), never attention rows.
    """

    def __init__(self) -> None:
        self._values: dict[tuple[int, int], dict[str, list[Tensor]]] = defaultdict(lambda: defaultdict(list))

    def reset(self) -> None:
        self._values.clear()

    def update(self, block: RowBlock) -> None:
        """Add the rows of ``block`` (its stats are [batch, head, query])."""
        for position, head in enumerate(block.heads):
            slot = self._values[(block.layer, head)]
            for name in _KEPT:
                slot[name].append(getattr(block.stats, name)[:, position].reshape(-1).cpu())

    def compute(self) -> list[dict[str, float | int]]:
        """One record per (layer, head), sorted: n_rows, median/q10/q90 of theta_lower, median theta_upper,
        fraction exact and dominant, median and mean p_max, mean entropy, normalized entropy and n_eff."""
        records = []
        for (layer, head), slot in sorted(self._values.items()):
            values = {name: torch.cat(parts) for name, parts in slot.items()}
            theta = values["theta_lower"]
            records.append(
                {
                    "layer": layer,
                    "head": head,
                    "n_rows": int(theta.numel()),
                    "theta_lower_median": _median(theta),
                    "theta_lower_q10": float(torch.quantile(theta, 0.1)),
                    "theta_lower_q90": float(torch.quantile(theta, 0.9)),
                    "theta_upper_median": _median(values["theta_upper"]),
                    "fraction_exact": float(values["theta_exact"].double().mean()),
                    "fraction_dominant": float(values["dominant"].double().mean()),
                    "p_max_median": _median(values["p_max"]),
                    "p_max_mean": float(values["p_max"].mean()),
                    "entropy_mean": float(values["entropy"].mean()),
                    "normalized_entropy_mean": float(values["normalized_entropy"].mean()),
                    "n_eff_mean": float(values["n_eff"].mean()),
                }
            )
        return records

    def compute_layers(self) -> list[dict[str, float | int]]:
        """One record per layer over the rows of all its heads, sorted: n_rows, median theta_lower, median p_max,
        mean entropy and the fraction of dominant rows (the figures a training log shows per layer)."""
        pooled: dict[int, dict[str, list[Tensor]]] = defaultdict(lambda: defaultdict(list))
        for (layer, _head), slot in self._values.items():
            for name in ("theta_lower", "p_max", "entropy", "dominant"):
                pooled[layer][name].extend(slot[name])
        records = []
        for layer, slot in sorted(pooled.items()):
            values = {name: torch.cat(parts) for name, parts in slot.items()}
            records.append(
                {
                    "layer": layer,
                    "n_rows": int(values["theta_lower"].numel()),
                    "theta_lower_median": _median(values["theta_lower"]),
                    "p_max_median": _median(values["p_max"]),
                    "entropy_mean": float(values["entropy"].double().mean()),
                    "fraction_dominant": float(values["dominant"].double().mean()),
                }
            )
        return records


def _median(values: Tensor) -> float:
    # torch.median picks the lower middle element; quantile interpolates, matching pandas' median.
    return float(torch.quantile(values, 0.5))
