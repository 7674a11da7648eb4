"""One training run end to end: data → trainer → checkpoints → Parquet training log (``attnsens train``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from attnsens._ranks import ranks
from attnsens.errors import CheckpointError
from attnsens.store.lock import writes_run_folder
from attnsens.train.checkpoint import saved_steps
from attnsens.train.data import DataConfig, TokenData, prepare_data
from attnsens.train.model import GPTConfig
from attnsens.train.trainer import TrainConfig, Trainer, init_distributed

TRAINING_FILE = "training.parquet"
GRAD_NORMS_FILE = "grad_norms.parquet"


@dataclass(frozen=True)
class TrainResult:
    """Where a finished run lives and its in-memory log (records of the store's training/grad_norms tables)."""

    run_dir: Path
    final_step: int
    checkpoint_steps: list[int]
    training: list[dict]
    grad_norms: list[dict]


# Optimization defaults per preset: tiny trains on a CPU in about a minute and gets well past the bigram
# baseline with heads that concentrate (tuned for the study's demo); the GPT-2 sizes follow docs/math.md §9.3
# (the batch is counted in blocks of max_positions tokens: 512 × 1024 ≈ 0.5M tokens).
TRAIN_DEFAULTS: dict[str, dict[str, object]] = {
    "tiny": {"batch_size": 16, "lr": 6e-3, "warmup_steps": 60},
    "small": {"batch_size": 512, "lr": 6e-4, "warmup_steps": 2000},
    "medium": {"batch_size": 512, "lr": 3e-4, "warmup_steps": 2000},
    "large": {"batch_size": 512, "lr": 2.5e-4, "warmup_steps": 2000},
}


def preset_train_config(name: str, *, steps: int, **overrides: Any) -> TrainConfig:
    """TrainConfig with the preset's defaults (TRAIN_DEFAULTS), ``steps`` and any non-None overrides."""
    values = {
        **TRAIN_DEFAULTS.get(name, TRAIN_DEFAULTS["tiny"]),
        **{k: v for k, v in overrides.items() if v is not None},
    }
    return TrainConfig(steps=steps, **values)


def default_data_config(model_config: GPTConfig, **overrides: Any) -> DataConfig:
    """A DataConfig whose tokenizer size and block length fit ``model_config``."""
    values = {"vocab_size": model_config.vocab_size, "block_size": model_config.max_positions, **overrides}
    return DataConfig(**values)


def _check_not_another_run(run_dir: Path) -> None:
    """Refuse to start a run in a ``run_dir`` whose manifest records results other than a training run's own log
    (a study's or an audit's folder): the new run's training and gradient logs would join that folder's tables,
    and its report, as a run of their own."""
    from attnsens.store.manifest import MANIFEST_NAME, Manifest

    if not (run_dir / MANIFEST_NAME).is_file():
        return
    foreign = sorted(unit for unit in Manifest.load(run_dir).units if unit not in (TRAINING_FILE, GRAD_NORMS_FILE))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise CheckpointError(
            f"{run_dir} is the folder of another attnsens run (its manifest records {shown}); training there would "
            "add this run to its tables: choose a new --out directory"
        )


@writes_run_folder("run_dir", "train")
def train(
    model_config: GPTConfig,
    train_config: TrainConfig,
    data_config: DataConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    extend: bool = False,
    run_id: str | None = None,
    callbacks: Sequence[object] = (),
    device: str | None = None,
    write_log: bool = True,
    data: TokenData | None = None,
) -> TrainResult:
    """Train one seed into ``run_dir``; with ``resume`` continue from its latest checkpoint (bit-identical on CPU),
    with ``extend`` as well to more steps than the run was started with (``Trainer.resume``).

    Under torchrun (WORLD_SIZE > 1) every process calls this; rank 0 alone writes files. With ``write_log``
    the log is written as ``training.parquet`` and ``grad_norms.parquet`` (store schemas) in ``run_dir`` and
    recorded in its ``manifest.json``.
    ``data`` skips reading and tokenizing the corpus (several seeds share one TokenData; the caller keeps its
    tokenizer). Raises CheckpointError when ``run_dir`` already holds checkpoints and ``resume`` is False, and
    when a new run would start in the folder of another run (a manifest recording more than a training log).
    """
    run_dir = Path(run_dir)
    init_distributed()
    rank, _ = ranks()
    if not resume:
        _check_not_another_run(run_dir)
        if saved_steps(run_dir):
            raise CheckpointError(
                f"{run_dir} already holds checkpoints {saved_steps(run_dir)}; pass --resume to continue that run "
                "or choose a new --out directory"
            )
    if data is None:
        if rank == 0:
            data = prepare_data(data_config, run_dir)
        if dist.is_initialized():
            dist.barrier()
        if data is None:  # every other rank, once rank 0 has written the tokenizer
            data = prepare_data(data_config, run_dir, save=False)
    trainer = Trainer(model_config, train_config, data, run_dir, run_id=run_id, callbacks=callbacks, device=device)
    if resume:
        trainer.resume(extend=extend)
    if write_log and trainer.is_writer:
        from attnsens.store import Manifest

        # The plan, so that `attnsens verify` names what an interrupted run still lacks ("." is this folder).
        planned = {".": list(train_config.checkpoint_schedule)}
        Manifest.open(run_dir).plan([TRAINING_FILE, GRAD_NORMS_FILE], checkpoints=planned)
    log = trainer.run()
    if write_log and trainer.is_writer:
        import pandas as pd

        from attnsens.store import Manifest

        # Recorded in the run's manifest, so that report and query verify them like any other unit.
        manifest = Manifest.open(run_dir)
        metadata = {"model_config": asdict(model_config), "train_config": asdict(train_config)}
        manifest.write_unit(TRAINING_FILE, pd.DataFrame(log["training"]), schema="training", metadata=metadata)
        manifest.write_unit(GRAD_NORMS_FILE, pd.DataFrame(log["grad_norms"]), schema="grad_norms", metadata=metadata)
    return TrainResult(
        run_dir=run_dir,
        final_step=trainer.step,
        checkpoint_steps=saved_steps(run_dir),
        training=log["training"],
        grad_norms=log["grad_norms"],
    )
