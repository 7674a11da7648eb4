"""The early-training study (docs/math.md §9): train every seed, audit every checkpoint, write Parquet and the report.

Run directory layout::

    manifest.json                              study config, provenance, every finished unit file + sha256
    data/tokenizer.json, data/data.json        one tokenizer and evaluation batch shared by all seeds
    runs/seed=S/checkpoints/...                safetensors checkpoints with their sha256 manifest
    training/seed=S.parquet                    loss, lr, global gradient norm per step      (store table training)
    grad_norms/seed=S.parquet                  per-layer, per-group gradient norms          (grad_norms)
    rows/seed=S/step=NNNNNN.parquet            every audited attention row of a checkpoint  (rows)
    summary/seed=S/step=NNNNNN.parquet         per-(layer, head) aggregates                 (summary)
    bounds/seed=S/step=NNNNNN.parquet          weight norms and certified bounds            (bounds)
    report.html

Every unit file is written atomically and recorded in the manifest, so a killed study rerun with the same
command continues where it stopped: training resumes from each seed's last checkpoint (bit-identical on CPU)
and finished units are skipped, never duplicated. Every registered checkpoint is checked against its sha256
before anything else runs; a corrupted one stops the study with a CheckpointError naming it. Under torchrun
each seed trains with DDP and the (seed, checkpoint) audits are shared out among the ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from attnsens.errors import ConfigError
from attnsens.train.checkpoint import load_model_state, saved_steps, verify_checkpoint
from attnsens.train.data import DataConfig, TokenData, prepare_data
from attnsens.train.model import GPT, GPTConfig, preset
from attnsens.train.run import default_data_config, preset_train_config, train
from attnsens.train.trainer import TrainConfig, init_distributed

Log = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    """What to train (model, optimizer, data, seeds) and how to audit each checkpoint.

    The audit reads the first ``audit_sequences`` blocks of the fixed evaluation batch and samples
    ``rows_per_sequence`` query positions t ≥ ``min_query`` in each (docs/math.md §9.4: rows with few keys are
    trivially dominant); the bounds use the first ``bound_tokens`` tokens of one evaluation block.
    """

    name: str
    model: GPTConfig
    train: TrainConfig
    data: DataConfig
    seeds: tuple[int, ...] = (0, 1, 2)
    audit_sequences: int = 4
    rows_per_sequence: int | None = 32
    min_query: int = 16
    bounds: bool = True
    bound_tokens: int = 32
    bound_queries: int = 2
    bound_iterations: int = 4

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and non-empty, got {self.seeds}")
        if not 1 <= self.audit_sequences <= self.data.eval_sequences:
            raise ConfigError(
                f"audit_sequences must be in [1, eval_sequences={self.data.eval_sequences}], got {self.audit_sequences}"
            )
        if not 0 <= self.min_query < self.data.block_size:
            raise ConfigError(f"min_query must be in [0, block_size={self.data.block_size}), got {self.min_query}")
        candidates = self.data.block_size - self.min_query
        if self.rows_per_sequence is not None and not 1 <= self.rows_per_sequence <= candidates:
            raise ConfigError(
                f"rows_per_sequence must be in [1, {candidates}] (positions {self.min_query} to "
                f"{self.data.block_size - 1}), got {self.rows_per_sequence}"
            )
        if not 2 <= self.bound_tokens <= self.data.block_size:
            raise ConfigError(
                f"bound_tokens must be in [2, block_size={self.data.block_size}], got {self.bound_tokens}"
            )

    @classmethod
    def from_preset(
        cls,
        name: str,
        *,
        seeds: tuple[int, ...] = (0, 1, 2),
        steps: int | None = None,
        norm: str = "pre",
        data: str | None = None,
        **overrides: Any,
    ) -> StudyConfig:
        """The study of a GPT preset; ``tiny`` defaults are sized for ``make demo`` (3 seeds on 2 CPU cores)."""
        model = preset(name, norm=norm)
        defaults = STUDY_DEFAULTS.get(name, STUDY_DEFAULTS["tiny"])
        train_config = preset_train_config(
            name,
            steps=steps or defaults["steps"],
            batch_size=overrides.pop("batch_size", None) or defaults.get("batch_size"),
            lr=overrides.pop("lr", None),
            warmup_steps=overrides.pop("warmup_steps", None),
        )
        data_config = default_data_config(model, source=data)
        return cls(name=f"{name}-{norm}", model=model, train=train_config, data=data_config, seeds=seeds, **overrides)

    def describe(self) -> dict[str, Any]:
        """JSON-ready record of the whole configuration (stored in the manifest; a rerun must match it)."""
        return asdict(self)


# Sized so that `attnsens study --config tiny --seeds 0,1,2` (make demo) finishes in minutes on 2 CPU cores.
STUDY_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": {"steps": 200, "batch_size": 8},
    "small": {"steps": 5000},
    "medium": {"steps": 5000},
    "large": {"steps": 5000},
}


@dataclass(frozen=True)
class StudyResult:
    """Where the study wrote its results and report; seconds spent training and auditing."""

    out_dir: Path
    report: Path | None
    train_seconds: float
    audit_seconds: float


def unit_paths(seed: int, step: int, *, bounds: bool = True) -> dict[str, str]:
    """The per-(seed, checkpoint) unit files of the audit, by table."""
    tables = ("rows", "summary", "bounds") if bounds else ("rows", "summary")
    return {table: f"{table}/seed={seed}/step={step:06d}.parquet" for table in tables}


def run_study(
    config: StudyConfig, out_dir: str | Path, *, log: Log | None = None, device: str | None = None
) -> StudyResult:
    """Train every seed, audit every checkpoint, write the Parquet tables and ``report.html``; resumable.

    Returns: StudyResult with the report path (None on ranks other than 0 under torchrun).
    Raises: CheckpointError when a registered checkpoint fails its sha256 check; ConfigError when ``out_dir``
    holds a study with another configuration.
    """
    from attnsens.store import Manifest

    out = Path(out_dir)
    say = log or (lambda _message: None)
    init_distributed()
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    manifest = Manifest.open(out, config=config.describe())
    for seed in config.seeds:
        for step in saved_steps(_seed_dir(out, seed)):
            verify_checkpoint(_seed_dir(out, seed), step)
    data = _shared_data(config, out, rank)

    started = time.perf_counter()
    for seed in config.seeds:
        _train_seed(config, out, seed, data, manifest, rank=rank, device=device, say=say)
    train_seconds = time.perf_counter() - started

    started = time.perf_counter()
    eval_inputs = data.eval_batch()[0][: config.audit_sequences]
    tasks = [(seed, step) for seed in config.seeds for step in config.train.checkpoint_schedule]
    for index, (seed, step) in enumerate(tasks):
        manifest.refresh()
        units = unit_paths(seed, step, bounds=config.bounds).values()
        if index % world == rank and not all(manifest.is_done(unit) for unit in units):
            _audit_checkpoint(config, out, seed, step, eval_inputs, manifest, say=say)
    if dist.is_initialized():
        dist.barrier()
    audit_seconds = time.perf_counter() - started

    report = None
    if rank == 0:
        from attnsens.report import build_report

        report = build_report(out)
    return StudyResult(out_dir=out, report=report, train_seconds=train_seconds, audit_seconds=audit_seconds)


def _seed_dir(out: Path, seed: int) -> Path:
    return out / "runs" / f"seed={seed}"


def _shared_data(config: StudyConfig, out: Path, rank: int) -> TokenData:
    """One tokenizer and token stream for every seed, kept in ``out/data``."""
    if rank == 0:
        data = prepare_data(config.data, out / "data")
    if dist.is_initialized():
        dist.barrier()
    if rank != 0:
        data = prepare_data(config.data, out / "data", save=False)
    return data


def _train_seed(
    config: StudyConfig,
    out: Path,
    seed: int,
    data: TokenData,
    manifest: Any,
    *,
    rank: int,
    device: str | None,
    say: Log,
) -> None:
    import pandas as pd

    units = {"training": f"training/seed={seed}.parquet", "grad_norms": f"grad_norms/seed={seed}.parquet"}
    finished = config.train.steps in saved_steps(_seed_dir(out, seed))
    if finished and all(manifest.is_done(unit) for unit in units.values()):
        say(f"seed {seed}: already trained ({config.train.steps} steps)")
        return
    started = time.perf_counter()
    progress = _CheckpointLog(seed, config.train.steps, say)
    result = train(
        config.model,
        replace(config.train, seed=seed),
        config.data,
        _seed_dir(out, seed),
        resume=True,
        run_id=config.name,
        device=device,
        write_log=False,
        data=data,
        callbacks=[progress] if rank == 0 else [],
    )
    if rank == 0:
        for table, unit in units.items():
            manifest.write_unit(unit, pd.DataFrame(getattr(result, table)), schema=table)
        last = result.training[-1]
        say(
            f"seed {seed}: trained {result.final_step} steps in {time.perf_counter() - started:.1f} s, "
            f"loss {last['loss']:.3f}, eval loss {last['eval_loss']:.3f}"
        )


class _CheckpointLog:
    """Trainer callback: one progress line per checkpoint written."""

    def __init__(self, seed: int, steps: int, say: Log) -> None:
        self.seed, self.steps, self.say, self.started = seed, steps, say, time.perf_counter()

    def on_checkpoint(self, step: int, model: torch.nn.Module, path: Path) -> None:
        self.say(f"seed {self.seed}: checkpoint {step}/{self.steps} ({time.perf_counter() - self.started:.1f} s)")


def _audit_checkpoint(
    config: StudyConfig, out: Path, seed: int, step: int, eval_inputs: torch.Tensor, manifest: Any, *, say: Log
) -> None:
    from attnsens.capture import RowSelection
    from attnsens.models import load
    from attnsens.study.audit import audit

    started = time.perf_counter()
    model = GPT(config.model)
    model.load_state_dict(load_model_state(_seed_dir(out, seed), step))
    model.eval()
    selection = RowSelection(query_start=config.min_query, sample_per_sequence=config.rows_per_sequence, seed=0)
    result = audit(model, eval_inputs, selection=selection, run_id=config.name, step=step, seed=seed)
    units = unit_paths(seed, step, bounds=config.bounds)
    metadata = {"checkpoint": f"runs/seed={seed}/checkpoints/step_{step:06d}"}
    manifest.write_unit(units["rows"], result.rows, schema="rows", metadata=metadata)
    manifest.write_unit(units["summary"], result.summary, schema="summary", metadata=metadata)
    if config.bounds:
        from attnsens.study.bounds import bound_model

        bounds = bound_model(
            load(model),
            eval_inputs[:1, : config.bound_tokens],
            n_queries=config.bound_queries,
            iterations=config.bound_iterations,
            compare_placements=False,
            run_id=config.name,
            model_name=result.rows["model"].iloc[0],
        )
        bounds["step"], bounds["seed"] = step, seed
        manifest.write_unit(units["bounds"], bounds, schema="bounds", metadata=metadata)
    layer = result.layer_summary()
    say(
        f"seed {seed} step {step}: {len(result.rows)} rows, median θ lower bound per layer "
        f"{', '.join(f'{v:.3f}' for v in layer['theta_lower_median'])} ({time.perf_counter() - started:.1f} s)"
    )
