"""``attnsens train``: train one seed of a preset GPT with log-spaced checkpoints (resumable, torchrun-ready)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnsens._ranks import first_rank
from attnsens.cli.app import JsonOption, OutDirOption, app, console, domain_errors_exit, flag, print_json
from attnsens.cli.interrupt import on_interrupt, rerun_training

if TYPE_CHECKING:
    from attnsens.cli.progress import ProgressReport


@app.command()
@domain_errors_exit
@on_interrupt(rerun_training)
def train(
    out: OutDirOption,
    config: Annotated[str, typer.Option("--config", help="GPT preset: tiny, small, medium or large.")] = "tiny",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the initialization and the data order.")] = 0,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps.")] = 200,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Blocks per step (preset default).")] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="Peak learning rate (preset default).")] = None,
    warmup: Annotated[int | None, typer.Option("--warmup", help="Linear warmup steps (preset default).")] = None,
    norm: Annotated[str, typer.Option("--norm", help="Block variant: pre, post, deepnorm or none.")] = "pre",
    data: Annotated[Path | None, typer.Option("--data", help="Text file or folder (default: Shakespeare).")] = None,
    resume: Annotated[
        bool,
        flag("--resume", help="Continue the run in --out from its last checkpoint; with a larger --steps, train on."),
    ] = False,
    device: Annotated[str | None, typer.Option("--device", help="cpu or cuda (default: cuda when present).")] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="CPU threads for torch (default: torch's choice).")
    ] = None,
    tensorboard: Annotated[
        bool,
        flag(
            "--tensorboard",
            help="Also write each step's loss, learning rate, gradient norm and eval loss as TensorBoard event "
            "files beside the Parquet log in --out (tensorboard --logdir OUT).",
        ),
    ] = False,
    monitor_every: Annotated[
        int | None,
        typer.Option(
            "--monitor-every",
            min=0,
            help="With --tensorboard: every this many steps, the sensitivity monitor's per-layer figures (median θ "
            "lower bound, median p_max, mean entropy, dominant fraction; attnsens/layer_L/…) on 4 held-out blocks "
            "go to the event files too. Default 50; 0: off.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Train a GPT on text; checkpoints at steps 0, 1, 2, 4, … and the last. Multi-GPU/CPU: prefix with
    `torchrun --nproc_per_node=N --no-python`."""
    import torch
    import torch.distributed as dist

    from attnsens.cli.inputs import check_device, check_out_dir
    from attnsens.cli.progress import ProgressReport
    from attnsens.train.model import preset
    from attnsens.train.run import default_data_config, preset_train_config
    from attnsens.train.run import train as train_run

    check_device(device)
    check_out_dir(out)
    if monitor_every is not None and not tensorboard:
        from attnsens.errors import ConfigError

        raise ConfigError("--monitor-every writes its figures to the TensorBoard event files; add --tensorboard")
    if threads is not None:
        torch.set_num_threads(threads)
    model_config = preset(config, norm=norm)
    train_config = preset_train_config(
        config, steps=steps, seed=seed, batch_size=batch_size, lr=lr, warmup_steps=warmup
    )
    data_config = default_data_config(model_config, source=None if data is None else str(data))
    writer = first_rank()
    with ProgressReport("training", "steps", enabled=writer and not as_json) as report:
        callbacks: list[object] = [TrainingProgress(report, steps)]
        if tensorboard and writer:
            callbacks.append(TensorBoardLog(out, monitor_every=50 if monitor_every is None else monitor_every))
        try:
            result = train_run(
                model_config, train_config, data_config, out, resume=resume, extend=resume, device=device,
                callbacks=callbacks,
            )  # fmt: skip
        finally:
            for callback in callbacks:
                if isinstance(callback, TensorBoardLog):
                    callback.close()
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    last = result.training[-1]
    summary = {
        "run_dir": result.run_dir,
        "final_step": result.final_step,
        "checkpoints": result.checkpoint_steps,
        "final_loss": last["loss"],
        "final_eval_loss": last["eval_loss"],
        "tokens_seen": last["tokens_seen"],
    }
    if as_json:
        print_json(summary)
        return
    console.print(
        f"trained {config} seed {seed}: step {result.final_step}, loss {last['loss']:.4f}, "
        f"eval loss {last['eval_loss']:.4f}, checkpoints {result.checkpoint_steps}",
        soft_wrap=True,
    )
    console.print(str(result.run_dir), soft_wrap=True)


class TrainingProgress:
    """Trainer callback: step, loss, tokens per second and ETA on a ProgressReport (rank 0 only)."""

    def __init__(self, report: ProgressReport, steps: int) -> None:
        self.report, self.steps = report, steps
        self.first: dict[str, Any] | None = None

    def on_record(self, record: dict[str, Any]) -> None:
        if self.first is None:
            # Rates and ETA count from this process's first step: a resumed run starts late, and the first
            # step carries one-off costs.
            self.first = record
            self.report.restart(record["step"])
        seconds = record["wall_time_s"] - self.first["wall_time_s"]
        tokens = record["tokens_seen"] - self.first["tokens_seen"]
        detail = f"loss {record['loss']:.4f}"
        if seconds > 0:
            detail += f", {tokens / seconds:,.0f} tokens/s"
        if record.get("eval_loss") is not None:
            detail += f", eval loss {record['eval_loss']:.4f}"
        self.report.update(record["step"], self.steps, detail)


class TensorBoardLog:
    """Trainer callback: each step's record as TensorBoard scalars (``train/loss``, ``train/lr``,
    ``train/grad_norm_global``, and ``train/eval_loss`` at checkpoints) in an event file of ``run_dir``; with
    ``monitor_every`` > 0, a SensitivityMonitor on the first ``PROBE_BLOCKS`` blocks of the held-out batch adds its
    per-layer figures (``attnsens/layer_L/…``) every ``monitor_every`` steps.

    The file is opened at the first record, so a run refused before it trains leaves none behind.
    """

    SCALARS = ("loss", "lr", "grad_norm_global", "eval_loss")
    PROBE_BLOCKS = 4

    def __init__(self, run_dir: Path, *, monitor_every: int = 0) -> None:
        self.run_dir = run_dir
        self.monitor_every = monitor_every
        self.monitor: Any = None
        self.writer: Any = None
        self.pending: dict[str, float] = {}

    def on_train_begin(self, trainer: Any) -> None:
        if self.monitor_every > 0:
            from attnsens.capture import SensitivityMonitor

            probe = trainer.data.eval_batch()[0][: self.PROBE_BLOCKS]
            self.monitor = SensitivityMonitor(probe, every=self.monitor_every)

    def on_step_end(self, step: int, model: Any, batch: Any = None) -> None:
        if self.monitor is not None and self.monitor.on_step_end(step, model):
            self.pending = self.monitor.scalars(step)

    def on_record(self, record: dict[str, Any]) -> None:
        from attnsens.train.tensorboard import ScalarEventWriter

        if self.writer is None:
            self.writer = ScalarEventWriter(self.run_dir)
        values = {f"train/{name}": record[name] for name in self.SCALARS if record.get(name) is not None}
        self.writer.add_scalars({**values, **self.pending}, record["step"])
        self.pending = {}
        self.writer.flush()  # a TensorBoard watching the folder shows every step as it ends

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
