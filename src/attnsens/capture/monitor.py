"""SensitivityMonitor: attention-row summaries every k training steps on a fixed probe batch.

Use it from a plain loop (``monitor.on_step_end(step, model)``), from the Hugging Face Trainer
(``monitor.attach(trainer)``) or from PyTorch Lightning (``Trainer(callbacks=[monitor.lightning_callback()])``).
Each probe runs one extra forward pass under ``torch.no_grad`` in eval mode (the model's training mode is restored
afterwards), reducing the selected rows to statistics as the layers run.

Under a Hugging Face or Lightning trainer every probe's per-layer figures go through that trainer's own logging
(``Trainer.log``, ``LightningModule.log_dict``), so they reach ``trainer.state.log_history`` and every logger the
run reports to (TensorBoard, W&B, …) under the keys ``attnsens/layer_{L}/{figure}`` (``scalars``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from attnsens._threads import keep_torch_threads
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
    ``step``; ``layers`` one record per (step, layer) over the rows of all the layer's heads
    (RowSummaryAccumulator.compute_layers plus ``step``); ``seconds`` the wall time spent probing, so the overhead
    can be reported.
    """

    def __init__(self, probe_ids: Tensor, *, every: int = 50, selection: RowSelection | None = None) -> None:
        if every < 1:
            raise ConfigError(f"every must be >= 1 step, got {every}")
        self.probe_ids = probe_ids
        self.every = every
        self.selection = selection or RowSelection(sample_per_sequence=min(16, probe_ids.shape[-1]))
        self.history: list[dict[str, Any]] = []
        self.layers: list[dict[str, Any]] = []
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
        # The first probe starts numba's thread pool, which resets the OpenMP thread count torch shares: training
        # would go on with other threads than it was given.
        with keep_torch_threads():
            capture_row_statistics(
                adapter, self.probe_ids.to(adapter.device), selection=self.selection, on_block=accumulator.update
            )
        self.history.extend({"step": step, **record} for record in accumulator.compute())
        self.layers.extend({"step": step, **record} for record in accumulator.compute_layers())
        self.seconds += time.perf_counter() - start
        return True

    def _adapter(self, model: torch.nn.Module) -> Any:
        from attnsens.models import load

        key = id(model)
        if key not in self._adapters:
            self._adapters[key] = load(model)
        return self._adapters[key]

    def scalars(self, step: int | None = None) -> dict[str, float]:
        """The per-layer figures of the probe at ``step`` (default: the latest) as scalars for a training log:
        ``attnsens/layer_{L}/theta_lower_median``, ``…/p_max_median``, ``…/entropy_mean`` and
        ``…/fraction_dominant`` for every layer L; empty before the first probe."""
        if not self.layers:
            return {}
        step = self.layers[-1]["step"] if step is None else step
        return {
            f"attnsens/layer_{record['layer']}/{name}": float(record[name])
            for record in self.layers
            if record["step"] == step
            for name in LOGGED_FIGURES
        }

    def attach(self, trainer: Any) -> Any:
        """Add this monitor's callback to a Hugging Face ``trainer`` and return the callback.

        The callback probes at the end of every k-th optimizer step and passes the figures to ``trainer.log``.
        """
        callback = self.trainer_callback(trainer)
        trainer.add_callback(callback)
        return callback

    def trainer_callback(self, trainer: Any = None) -> Any:
        """A ``transformers.TrainerCallback`` that probes at the end of every k-th optimizer step and logs the
        probe's ``scalars`` through ``trainer.log``.

        A callback needs the trainer it logs through, which transformers does not hand to callbacks: pass it
        here, call ``callback.set_trainer(trainer)``, or use ``monitor.attach(trainer)``. Without one the callback
        still probes (``history``, ``layers``) and warns, once training begins, that nothing reaches the log.
        """
        from transformers import TrainerCallback

        monitor = self

        class SensitivityCallback(TrainerCallback):
            def __init__(self) -> None:
                self.trainer: Any = None

            def set_trainer(self, trainer: Any) -> None:
                self.trainer = trainer

            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if self.trainer is None:
                    warnings.warn(
                        "SensitivityMonitor's callback has no trainer to log through, so its figures stay in "
                        "monitor.layers: add it with monitor.attach(trainer) or pass trainer_callback(trainer)",
                        stacklevel=2,
                    )

            def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
                if model is None or not monitor.on_step_end(state.global_step, model):
                    return
                if self.trainer is not None:
                    self.trainer.log(monitor.scalars(state.global_step))

        callback = SensitivityCallback()
        if trainer is not None:
            callback.set_trainer(trainer)
        return callback

    def lightning_callback(self, model: Callable[[Any], torch.nn.Module] | None = None) -> Any:
        """A PyTorch Lightning ``Callback`` that probes after every k-th optimizer step and logs the probe's
        ``scalars`` with ``LightningModule.log_dict``, so they reach ``trainer.logged_metrics`` and every logger.

        ``model`` maps the LightningModule to the transformer to probe (default: its ``model`` attribute when it
        has one, else the module itself). Needs ``lightning`` (or the older ``pytorch_lightning``) installed.
        """
        import importlib

        for name in ("lightning.pytorch", "pytorch_lightning"):
            try:
                callback_class: Any = importlib.import_module(name).Callback
                break
            except ImportError:
                continue
        else:
            raise ConfigError("lightning_callback needs PyTorch Lightning: pip install lightning")

        monitor = self
        pick = model or (lambda module: getattr(module, "model", module))

        class SensitivityLightningCallback(callback_class):
            def __init__(self) -> None:
                super().__init__()
                self.last_step: int | None = None

            def on_train_batch_end(
                self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
            ) -> None:
                # global_step counts optimizer steps and has already counted this batch's step.
                step = trainer.global_step
                if step == self.last_step:  # gradient accumulation: no new optimizer step
                    return
                self.last_step = step
                if monitor.on_step_end(step, pick(pl_module)):
                    pl_module.log_dict(monitor.scalars(step), on_step=True, on_epoch=False)

        return SensitivityLightningCallback()


LOGGED_FIGURES = ("theta_lower_median", "p_max_median", "entropy_mean", "fraction_dominant")
