"""SensitivityMonitor: attention-row summaries every k training steps on a fixed probe batch.

Use it from a plain loop (``monitor.on_step_end(step, model)``) or from the Hugging Face Trainer
(``Trainer(..., callbacks=[monitor.trainer_callback()])``). Each probe runs one extra forward pass under
``torch.no_grad`` in eval mode (the model's training mode is restored afterwards), reducing the selected rows
to statistics as the layers run.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from attnsens.capture.accumulator import RowSummaryAccumulator
from attnsens.capture.selection import RowSelection
from attnsens.capture.stream import capture_row_statistics
from attnsens.errors import ConfigError


class SensitivityMonitor:
    """Records per-(layer, head) attention summaries every ``every`` steps on ``probe_ids``.

    Args:
        probe_ids: fixed probe batch of token ids [batch, n] (the same rows are audited at every probe).
        every: probe when ``step % every == 0``.
        selection: rows to audit (default: 16 positions sampled per sequence with seed 0).

    ``history`` holds one record per (step, layer, head) with the fields of RowSummaryAccumulator.compute plus
    ``step``; ``seconds`` the wall time spent probing, so the overhead can be reported.
    """

    def __init__(self, probe_ids: Tensor, *, every: int = 50, selection: RowSelection | None = None) -> None:
        if every < 1:
            raise ConfigError(f"every must be >= 1 step, got {every}")
        self.probe_ids = probe_ids
        self.every = every
        self.selection = selection or RowSelection(sample_per_sequence=min(16, probe_ids.shape[-1]))
        self.history: list[dict[str, Any]] = []
        self.seconds = 0.0
        self._adapters: dict[int, Any] = {}

    def __repr__(self) -> str:
        """One line: the probe batch, the period, and what has been recorded so far."""
        steps = sorted({record["step"] for record in self.history})
        shape = "×".join(str(size) for size in self.probe_ids.shape)
        recorded = f"steps {steps[0]}–{steps[-1]}" if steps else "nothing yet"
        return (
            f"SensitivityMonitor(probe_ids={shape}, every={self.every}, probes={len(steps)} ({recorded}), "
            f"seconds={self.seconds:.3g})"
        )

    def on_step_end(self, step: int, model: torch.nn.Module, batch: Any = None) -> bool:
        """Probe ``model`` if ``step`` is a multiple of ``every``; returns whether it probed."""
        if step % self.every:
            return False
        start = time.perf_counter()
        adapter = self._adapter(model)
        accumulator = RowSummaryAccumulator()
        capture_row_statistics(
            adapter, self.probe_ids.to(adapter.device), selection=self.selection, on_block=accumulator.update
        )
        self.history.extend({"step": step, **record} for record in accumulator.compute())
        self.seconds += time.perf_counter() - start
        return True

    def _adapter(self, model: torch.nn.Module) -> Any:
        from attnsens.models import load

        key = id(model)
        if key not in self._adapters:
            self._adapters[key] = load(model)
        return self._adapters[key]

    def trainer_callback(self) -> Any:
        """A ``transformers.TrainerCallback`` that probes at the end of every k-th optimizer step."""
        from transformers import TrainerCallback

        monitor = self

        class SensitivityCallback(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
                if model is not None:
                    monitor.on_step_end(state.global_step, model)

        return SensitivityCallback()
