"""The early-training study (docs/math.md §9): train every seed, audit every checkpoint, write Parquet and the report.

Run directory layout::

    manifest.json                                  study config, provenance, every finished unit + sha256
    data/tokenizer.json, data/data.json            one tokenizer and evaluation batch shared by every run
    baselines/baselines.parquet                    unigram / bigram eval loss, parameter counts   (baselines)
    runs/placement=P/seed=S/checkpoints/...        safetensors checkpoints with their sha256 manifest
    training/placement=P/seed=S.parquet            loss, lr, global gradient norm per step         (training)
    grad_norms/placement=P/seed=S.parquet          per-layer, per-group gradient norms             (grad_norms)
    rows/placement=P/seed=S/step=NNNNNN.parquet    every audited attention row of a checkpoint     (rows)
    summary/placement=P/seed=S/step=NNNNNN.parquet per-(layer, head) aggregates                    (summary)
    bounds/placement=P/seed=S/step=NNNNNN.parquet  weight norms and certified bounds               (bounds)
    rows/reference=NAME.parquet, summary/...       the pretrained reference model on the same text
    report.html

P is a residual-block placement (``pre``, ``post``, ...): every placement trains every seed on the same data
order, so the two differ only in where the LayerNorms sit. Each placement is its own ``run_id``
(``<name>-<placement>``); the reference model's run_id is ``reference-<alias>`` (step 0, seed 0: a pretrained
model, not a checkpoint).

Every unit file is written atomically and recorded in the manifest, so a killed study rerun with the same
command continues where it stopped: training resumes from each seed's last checkpoint (bit-identical on CPU)
and finished units are skipped, never duplicated. Every registered checkpoint is checked against its sha256
before anything else runs; a corrupted one stops the study with a CheckpointError naming it. Under torchrun
each seed trains with DDP and the (seed, checkpoint) audits are shared out among the ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from attnsens._ranks import ranks
from attnsens.errors import ConfigError
from attnsens.store.lock import writes_run_folder
from attnsens.train.checkpoint import load_model_state, model_hashes, prune_deleted, saved_steps, verify_checkpoint
from attnsens.train.data import DataConfig, TokenData, prepare_data
from attnsens.train.model import GPT, GPTConfig, NormPlacement, norm_placement, preset
from attnsens.train.run import default_data_config, preset_train_config, train
from attnsens.train.trainer import TrainConfig, init_distributed

Log = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    """What to train (model, optimizer, data, seeds) and how to audit each checkpoint.

    ``placements`` are the residual-block variants trained side by side (default: ``model.norm`` alone); each
    trains every seed, with ``train`` except for the settings ``placement_train`` gives that placement (Post-LN
    needs a longer warmup than Pre-LN: ``train_for``). The audit reads the first ``audit_sequences`` blocks of the fixed
    evaluation batch and samples ``rows_per_sequence`` query positions t ≥ ``min_query`` in each (docs/math.md
    §9.4: rows with few keys are trivially dominant); the bounds use the first ``bound_tokens`` tokens of one
    evaluation block, at every ``bound_stride``-th checkpoint (and the last). ``reference`` names a pretrained model
    (an alias of attnsens.models.load, e.g. ``smollm2``) audited on the text of the same evaluation blocks,
    re-tokenized with its own tokenizer: the trained end of the spectrum. Every LayerNorm-free placement
    (``none``) also gets the inverse-length influence experiment at its first seed's last checkpoint:
    ``influence_samples`` samples per length and position kind, lengths 4, 8, 16, … up to the context, with the
    certified constant and the input-set one of the audited and measured inputs (docs/math.md §10).
    """

    name: str
    model: GPTConfig
    train: TrainConfig
    data: DataConfig
    placements: tuple[str, ...] | None = None
    placement_train: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    seeds: tuple[int, ...] = (0, 1, 2)
    audit_sequences: int = 4
    rows_per_sequence: int | None = 32
    min_query: int = 16
    bounds: bool = True
    bound_tokens: int = 32
    bound_queries: int = 2
    bound_iterations: int = 4
    bound_stride: int = 1
    reference: str | None = None
    influence_samples: int = 16

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        placements = (self.model.norm,) if self.placements is None else tuple(self.placements)
        object.__setattr__(self, "placements", placements)
        if not placements or len(set(placements)) != len(placements):
            raise ConfigError(f"placements must be distinct and non-empty, got {placements}")
        for placement in placements:
            norm_placement(placement)
        for placement, settings in self.placement_train.items():
            norm_placement(placement)
            shared = sorted(set(settings) & SHARED_TRAIN_FIELDS)
            unknown = sorted(set(settings) - {f.name for f in fields(TrainConfig)})
            if shared or unknown:
                raise ConfigError(
                    f"placement {placement!r} cannot have its own {', '.join(shared + unknown)}: every placement "
                    f"shares {', '.join(sorted(SHARED_TRAIN_FIELDS))}, and a placement may change only the other "
                    "TrainConfig fields"
                )
        # Only the placements trained keep their settings (the preset's defaults name every placement).
        kept = {p: dict(settings) for p, settings in self.placement_train.items() if p in placements and settings}
        object.__setattr__(self, "placement_train", kept)
        for placement in kept:
            self.train_for(placement)  # TrainConfig checks the values
        if not isinstance(self.bound_stride, int) or self.bound_stride < 1:
            raise ConfigError(f"bound_stride must be a positive integer, got {self.bound_stride!r}")
        if not isinstance(self.influence_samples, int) or self.influence_samples < 2:
            raise ConfigError(f"influence_samples must be an integer >= 2, got {self.influence_samples!r}")
        if "none" in placements and len(self.influence_lengths()) < 3:
            raise ConfigError(
                f"the influence experiment of placement 'none' fits a slope over lengths 4, 8, … up to block_size, "
                f"which needs block_size >= 16, got {self.data.block_size}"
            )
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
        placements: tuple[str, ...] = ("pre",),
        data: str | None = None,
        **overrides: Any,
    ) -> StudyConfig:
        """The study of a GPT preset; ``tiny`` defaults are sized for ``make demo`` (2 CPU cores, minutes)."""
        model = preset(name, norm=placements[0])
        defaults = STUDY_DEFAULTS.get(name, STUDY_DEFAULTS["tiny"])
        explicit = {key: overrides.pop(key, None) for key in ("lr", "warmup_steps")}
        train_config = preset_train_config(
            name,
            steps=steps or defaults["steps"],
            batch_size=overrides.pop("batch_size", None) or defaults.get("batch_size"),
            **explicit,
        )
        # A setting given explicitly is every placement's; the others keep the preset's settings per placement,
        # under those given per placement.
        given = overrides.pop("placement_train", {})
        placement_train = {
            placement: {key: value for key, value in settings.items() if explicit.get(key) is None}
            for placement, settings in defaults.get("placement_train", {}).items()
        }
        for placement, settings in given.items():
            placement_train[placement] = {**placement_train.get(placement, {}), **settings}
        overrides["placement_train"] = placement_train
        data_config = default_data_config(model, source=data, eval_sequences=defaults.get("eval_sequences", 8))
        for key in ("audit_sequences", "rows_per_sequence", "bound_stride"):
            if key in defaults:
                overrides.setdefault(key, defaults[key])
        return cls(
            name=name,
            model=model,
            train=train_config,
            data=data_config,
            placements=placements,
            seeds=seeds,
            **overrides,
        )

    def run_id(self, placement: str) -> str:
        """The run_id of one placement's runs in every table: ``<name>-<placement>``."""
        return f"{self.name}-{placement}"

    @property
    def norm_placements(self) -> tuple[NormPlacement, ...]:
        """``placements`` as ``__post_init__`` leaves them: never None, each name checked."""
        return tuple(norm_placement(placement) for placement in self.placements or (self.model.norm,))

    def model_for(self, placement: str) -> GPTConfig:
        return replace(self.model, norm=norm_placement(placement))

    def train_for(self, placement: str) -> TrainConfig:
        """The optimizer settings of ``placement``'s runs: ``train`` with that placement's own settings, if any."""
        return replace(self.train, **self.placement_train.get(placement, {}))

    def bounds_at(self, step: int) -> bool:
        """Whether checkpoint ``step`` gets certified bounds: every ``bound_stride``-th scheduled checkpoint,
        counting from the first, and always the last."""
        schedule = self.train.checkpoint_schedule
        return self.bounds and (schedule.index(step) % self.bound_stride == 0 or step == schedule[-1])

    def describe(self) -> dict[str, Any]:
        """JSON-ready record of the whole configuration (stored in the manifest; a rerun must match it). Without
        per-placement settings the record has no ``placement_train`` key, as studies had before there were any."""
        record = asdict(self)
        if not record["placement_train"]:
            del record["placement_train"]
        if "none" not in (self.placements or ()):  # the influence experiment runs on LayerNorm-free placements only
            del record["influence_samples"]
        return record

    def influence_lengths(self) -> tuple[int, ...]:
        """The lengths of the influence experiment: 4, 8, 16, … up to the context (``block_size``)."""
        lengths, n = [], 4
        while n < self.data.block_size:
            lengths.append(n)
            n *= 2
        return (*lengths, self.data.block_size)


# tiny: sized so that `make demo` (two seeds and the SmolLM2 reference) finishes in about 6 minutes on 2 CPU cores
# and its runs get well below the bigram baseline, with heads that concentrate (tests/slow/test_demo_regime.py).
# Post-LN and DeepNorm warm up over 300 steps to a peak learning rate of 2·10^-3: with Pre-LN's 60 steps to
# 6·10^-3 the tiny Post-LN GPT stays at the unigram loss (README, "What the study shows").
POST_LN_TRAIN = {"lr": 2e-3, "warmup_steps": 300}
SHARED_TRAIN_FIELDS = frozenset({"steps", "seed", "batch_size", "micro_batch_size", "checkpoints"})
"""What every placement of a study shares: the same steps, checkpoints and data order, so runs compare step by step."""
STUDY_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": {
        "steps": 1200,
        "batch_size": 16,
        "placement_train": {"post": POST_LN_TRAIN, "deepnorm": POST_LN_TRAIN},
        # 16 audited sequences of 16 sampled rows per (layer, checkpoint, seed) cell: the findings' bootstrap
        # intervals are over sequences, so more sequences narrow them and more rows of one sequence barely do
        # (docs/findings.md); certified bounds at every other checkpoint and the last
        "eval_sequences": 16,
        "audit_sequences": 16,
        "rows_per_sequence": 16,
        "bound_stride": 2,
    },
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


def unit_paths(placement: str, seed: int, step: int, *, bounds: bool = True) -> dict[str, str]:
    """The per-(placement, seed, checkpoint) unit files of the audit, by table."""
    tables = ("rows", "summary", "bounds") if bounds else ("rows", "summary")
    return {table: f"{table}/placement={placement}/seed={seed}/step={step:06d}.parquet" for table in tables}


def reference_paths(alias: str) -> dict[str, str]:
    """The unit files of the pretrained reference model's audit, by table."""
    return {table: f"{table}/reference={alias}.parquet" for table in ("rows", "summary")}


BASELINES_UNIT = "baselines/baselines.parquet"


def planned_units(config: StudyConfig) -> list[str]:
    """Every unit file a finished study of ``config`` holds: the baselines, each run's training units, each
    checkpoint's audit units, the reference's and the influence experiment's (recorded in the manifest as its
    plan)."""
    units = [BASELINES_UNIT]
    for placement in config.norm_placements:
        for seed in config.seeds:
            units += _training_units(placement, seed).values()
            for step in config.train.checkpoint_schedule:
                units += unit_paths(placement, seed, step, bounds=config.bounds_at(step)).values()
    if config.reference is not None:
        units += reference_paths(config.reference).values()
    if "none" in config.norm_placements:
        units.append(influence_path("none", config.seeds[0]))
    return units


def planned_checkpoints(config: StudyConfig) -> dict[str, list[int]]:
    """Every training checkpoint a finished study of ``config`` holds, by run folder relative to the study."""
    return {
        f"runs/placement={placement}/seed={seed}": list(config.train.checkpoint_schedule)
        for placement in config.norm_placements
        for seed in config.seeds
    }


@writes_run_folder("out_dir", "study")
def run_study(
    config: StudyConfig,
    out_dir: str | Path,
    *,
    log: Log | None = None,
    device: str | None = None,
    callbacks: Sequence[object] = (),
) -> StudyResult:
    """Train every seed, audit every checkpoint, write the Parquet tables and ``report.html``; resumable.

    ``callbacks`` are trainer callbacks (``attnsens.train.trainer``) added to every seed's training on rank 0,
    e.g. a progress display reading ``on_record``.

    Returns: StudyResult with the report path (None on ranks other than 0 under torchrun).
    Resuming and extending: a rerun skips every checkpoint and audit unit already recorded (after checking their
    hashes); a config that only adds seeds to the recorded ones trains and audits just the new seeds.

    Raises: CheckpointError when a registered checkpoint fails its sha256 check; ConfigError when ``out_dir``
    holds a study with another configuration (other than more seeds).
    """
    from attnsens.store import Manifest
    from attnsens.store.verify import forget_untrusted

    out = Path(out_dir)
    say = log or (lambda _message: None)
    init_distributed()
    rank, world = ranks()
    # A study folder takes more seeds: the ones done are kept (their checkpoints verified below), the new ones run.
    manifest = Manifest.open(out, config=config.describe(), growable=("seeds",))
    if rank == 0:
        manifest.plan(planned_units(config), checkpoints=planned_checkpoints(config))
        forget_untrusted(manifest, note=say)
    runs = [(placement, seed) for placement in config.norm_placements for seed in config.seeds]
    discarded = {}
    for placement, seed in runs:
        # A checkpoint whose directory the user deleted is rebuilt by training; the others must be intact.
        discarded[placement, seed] = prune_deleted(_seed_dir(out, placement, seed)) if rank == 0 else {}
        for step in saved_steps(_seed_dir(out, placement, seed)):
            verify_checkpoint(_seed_dir(out, placement, seed), step, seed=seed)
    data = _shared_data(config, out, rank)
    if rank == 0 and not manifest.is_done(BASELINES_UNIT):
        manifest.write_unit(BASELINES_UNIT, baselines_frame(config, data), schema="baselines")

    started = time.perf_counter()
    _train_runs(
        config, out, runs, data, manifest, discarded, rank=rank, world=world, device=device, say=say,
        callbacks=callbacks,
    )  # fmt: skip
    train_seconds = time.perf_counter() - started

    started = time.perf_counter()
    eval_inputs = data.eval_batch()[0][: config.audit_sequences]
    tasks = [(p, seed, step) for p, seed in runs for step in config.train.checkpoint_schedule]
    for index, (placement, seed, step) in enumerate(tasks):
        manifest.refresh()
        units = unit_paths(placement, seed, step, bounds=config.bounds_at(step)).values()
        if index % world == rank and not all(manifest.is_done(unit) for unit in units):
            _audit_checkpoint(config, out, placement, seed, step, eval_inputs, manifest, say=say)
    if config.reference is not None and rank == 0:
        units = reference_paths(config.reference).values()
        if not all(manifest.is_done(unit) for unit in units):
            _audit_reference(config, config.reference, out, eval_inputs, manifest, say=say)
    if rank == 0 and "none" in config.norm_placements and not manifest.is_done(influence_path("none", config.seeds[0])):
        _influence(config, out, "none", config.seeds[0], eval_inputs, manifest, say=say)
    if dist.is_initialized():
        dist.barrier()
    audit_seconds = time.perf_counter() - started

    report = None
    if rank == 0:
        from attnsens.report import build_report

        report = build_report(out)
    return StudyResult(out_dir=out, report=report, train_seconds=train_seconds, audit_seconds=audit_seconds)


def influence_path(placement: str, seed: int) -> str:
    """The unit of the influence experiment on one placement's run."""
    return f"influence/placement={placement}/seed={seed}.parquet"


def _influence(
    config: StudyConfig, out: Path, placement: str, seed: int, eval_inputs: torch.Tensor, manifest: Any, *, say: Log
) -> None:
    """The inverse-length influence experiment on the last checkpoint of one run (docs/math.md §10): measured
    ‖Δy_n‖ over ``config.influence_lengths()``, the certified constant, and the input-set constant of the audited
    text and of random sequences like those measured (attnsens.influence.input_set)."""
    from attnsens.influence.experiment import run_influence

    started = time.perf_counter()
    step = config.train.checkpoint_schedule[-1]
    model = GPT(config.model_for(placement))
    model.load_state_dict(load_model_state(_seed_dir(out, placement, seed), step))
    model.eval()
    lengths = config.influence_lengths()
    generator = torch.Generator().manual_seed(seed)
    random_tokens = torch.randint(
        0, config.model.vocab_size, (config.influence_samples, lengths[-1]), generator=generator
    )
    run_id = config.run_id(placement)
    name = f"{run_id} seed {seed} step {step}"
    result = run_influence(
        model, lengths, name=name, n_samples=config.influence_samples, seed=seed, observe=[eval_inputs, random_tokens]
    )
    frame = result.table.copy()
    frame.insert(0, "model", name)
    frame.insert(0, "run_id", run_id)
    summary = result.summary()
    manifest.write_unit(influence_path(placement, seed), frame, schema="influence", metadata=summary)
    certified = summary["log10_certified_C"]
    constant = "no certified C" if certified is None else f"certified C = 10^{certified:.1f}"
    say(
        f"{placement} seed {seed} step {step}: influence slope {result.fit.slope:.3f} "
        f"[{result.fit.slope_ci[0]:.3f}, {result.fit.slope_ci[1]:.3f}] over n = {lengths[0]}–{lengths[-1]}, "
        f"{constant} ({time.perf_counter() - started:.1f} s)"
    )


def _seed_dir(out: Path, placement: str, seed: int) -> Path:
    return out / "runs" / f"placement={placement}" / f"seed={seed}"


def _shared_data(config: StudyConfig, out: Path, rank: int) -> TokenData:
    """One tokenizer and token stream for every seed, kept in ``out/data``."""
    if rank == 0:
        data = prepare_data(config.data, out / "data")
    if dist.is_initialized():
        dist.barrier()
    if rank != 0:
        data = prepare_data(config.data, out / "data", save=False)
    return data


def _train_runs(
    config: StudyConfig,
    out: Path,
    runs: Sequence[tuple[str, int]],
    data: TokenData,
    manifest: Any,
    discarded: Mapping[tuple[Any, int], dict[int, str]],
    *,
    rank: int,
    world: int,
    device: str | None,
    say: Log,
    callbacks: Sequence[object],
) -> None:
    """Train every run not yet trained: side by side in worker processes on a CPU (attnsens.study.workers), else
    one after another; each run with ``threads_per_run`` threads either way, so a resumed study continues bit for
    bit."""
    from attnsens.study import workers

    threads = workers.threads_per_run(len(runs))
    todo = [run for run in runs if not _trained(config, out, *run, manifest)]
    for placement, seed in runs:
        if (placement, seed) not in todo:
            say(f"{placement} seed {seed}: already trained ({config.train.steps} steps)")
    before = {run: {**discarded[run], **model_hashes(_seed_dir(out, *run))} for run in todo}
    side_by_side = min(len(todo), torch.get_num_threads() // threads)
    on_cpu = device == "cpu" or (device is None and not torch.cuda.is_available())
    if world == 1 and on_cpu and side_by_side > 1 and workers.relays_only_records(callbacks):
        checkpoints = _CheckpointLog("", config.train.steps, say)

        def done(result: workers.TrainedRun) -> None:
            run = (result.placement, result.seed)
            _record_training(config, manifest, *run, result.training, result.grad_norms, result.seconds, say)
            _forget_stale_audits(config, *run, before[run], model_hashes(_seed_dir(out, *run)), manifest)

        say(f"training {len(todo)} runs side by side, {side_by_side} at a time, {threads} thread(s) each")
        workers.train_in_processes(
            config, out, todo, data, threads=threads, workers=side_by_side, device=device,
            on_record=lambda record: _relay_record(callbacks, record),
            on_checkpoint=checkpoints.note, on_done=done,
        )  # fmt: skip
        return
    with workers.torch_threads(threads):
        for run in todo:
            _train_seed(config, out, *run, data, manifest, rank=rank, device=device, say=say, callbacks=callbacks)
            if rank == 0:
                _forget_stale_audits(config, *run, before[run], model_hashes(_seed_dir(out, *run)), manifest)


def _relay_record(callbacks: Sequence[object], record: dict[str, Any]) -> None:
    for callback in callbacks:
        if hasattr(callback, "on_record"):
            callback.on_record(record)


def _trained(config: StudyConfig, out: Path, placement: str, seed: int, manifest: Any) -> bool:
    """Whether the run has every scheduled checkpoint and its training and gradient-norm units are recorded."""
    finished = set(config.train.checkpoint_schedule) <= set(saved_steps(_seed_dir(out, placement, seed)))
    return finished and all(manifest.is_done(unit) for unit in _training_units(placement, seed).values())


def _training_units(placement: str, seed: int) -> dict[str, str]:
    return {table: f"{table}/placement={placement}/seed={seed}.parquet" for table in ("training", "grad_norms")}


def _record_training(
    config: StudyConfig,
    manifest: Any,
    placement: str,
    seed: int,
    training: list[dict[str, Any]],
    grad_norms: list[dict[str, Any]],
    seconds: float,
    say: Log,
) -> None:
    """Write a trained run's training and gradient-norm units, and say how it ended."""
    import pandas as pd

    for table, unit in _training_units(placement, seed).items():
        records = training if table == "training" else grad_norms
        manifest.write_unit(unit, pd.DataFrame(records), schema=table)
    last = training[-1]
    say(
        f"{placement} seed {seed}: trained {config.train.steps} steps in {seconds:.1f} s, "
        f"loss {last['loss']:.3f}, eval loss {last['eval_loss']:.3f}"
    )


def train_run(
    config: StudyConfig,
    out: Path,
    placement: str,
    seed: int,
    data: TokenData,
    *,
    device: str | None,
    callbacks: Sequence[object],
) -> Any:
    """Train (or resume) one run of the study into its folder, its log kept in memory for the study's units; the
    same call in this process and in a worker process (attnsens.study.workers). Returns the TrainResult."""
    return train(
        config.model_for(placement),
        replace(config.train_for(placement), seed=seed),
        config.data,
        _seed_dir(out, placement, seed),
        resume=True,
        run_id=config.run_id(placement),
        device=device,
        write_log=False,
        data=data,
        callbacks=callbacks,
    )


def _train_seed(
    config: StudyConfig,
    out: Path,
    placement: str,
    seed: int,
    data: TokenData,
    manifest: Any,
    *,
    rank: int,
    device: str | None,
    say: Log,
    callbacks: Sequence[object] = (),
) -> None:
    started = time.perf_counter()
    progress = _CheckpointLog(f"{placement} seed {seed}", config.train.steps, say)
    result = train_run(
        config, out, placement, seed, data, device=device, callbacks=[progress, *callbacks] if rank == 0 else []
    )
    if rank == 0:
        seconds = time.perf_counter() - started
        _record_training(config, manifest, placement, seed, result.training, result.grad_norms, seconds, say)


def _forget_stale_audits(
    config: StudyConfig, placement: str, seed: int, before: dict[int, str], after: dict[int, str], manifest: Any
) -> None:
    """Unrecord the audit units of checkpoints that retraining changed (bit-identical on CPU, so only on GPU)."""
    for step, digest in before.items():
        if after.get(step) not in (None, digest):
            for unit in unit_paths(placement, seed, step, bounds=config.bounds_at(step)).values():
                manifest.forget(unit)


class _CheckpointLog:
    """Trainer callback: one progress line per checkpoint written."""

    def __init__(self, label: str, steps: int, say: Log) -> None:
        self.label, self.steps, self.say, self.started = label, steps, say, time.perf_counter()

    def on_checkpoint(self, step: int, model: torch.nn.Module, path: Path) -> None:
        self.note(self.label, step, time.perf_counter() - self.started)

    def note(self, label: str, step: int, seconds: float) -> None:
        self.say(f"{label}: checkpoint {step}/{self.steps} ({seconds:.1f} s)")


def _audit_checkpoint(
    config: StudyConfig,
    out: Path,
    placement: str,
    seed: int,
    step: int,
    eval_inputs: torch.Tensor,
    manifest: Any,
    *,
    say: Log,
) -> None:
    from attnsens.models import load
    from attnsens.study.auditing import audit
    from attnsens.study.finite import check_finite_module

    started = time.perf_counter()
    run_dir = _seed_dir(out, placement, seed)
    model = GPT(config.model_for(placement))
    model.load_state_dict(load_model_state(run_dir, step))
    model.eval()
    checkpoint = run_dir / "checkpoints" / f"step_{step:06d}"
    check_finite_module(
        model,
        name=f"checkpoint {checkpoint}",
        fix=f"if the file was altered, delete {checkpoint} and rerun to rebuild it; if training itself diverged, "
        "rerun with fewer --steps or another --config into a new --out",
    )
    run_id = config.run_id(placement)
    result = audit(model, eval_inputs, selection=_selection(config), run_id=run_id, step=step, seed=seed)
    units = unit_paths(placement, seed, step, bounds=config.bounds_at(step))
    metadata = {"checkpoint": f"{run_dir.relative_to(out).as_posix()}/checkpoints/step_{step:06d}"}
    manifest.write_unit(units["rows"], result.rows, schema="rows", metadata=metadata)
    manifest.write_unit(units["summary"], result.summary, schema="summary", metadata=metadata)
    if "bounds" in units:
        from attnsens.study.bounds import bound_model

        bounds = bound_model(
            load(model),
            eval_inputs[:1, : config.bound_tokens],
            n_queries=config.bound_queries,
            iterations=config.bound_iterations,
            compare_placements=False,
            run_id=run_id,
            model_name=result.rows["model"].iloc[0],
            step=step,
            seed=seed,
        )
        manifest.write_unit(units["bounds"], bounds, schema="bounds", metadata=metadata)
    layer = result.layer_summary()
    say(
        f"{placement} seed {seed} step {step}: {len(result.rows)} rows, median θ lower bound per layer "
        f"{', '.join(f'{v:.3f}' for v in layer['theta_lower_median'])} ({time.perf_counter() - started:.1f} s)"
    )


def _selection(config: StudyConfig) -> Any:
    from attnsens.capture import RowSelection

    return RowSelection(query_start=config.min_query, sample_per_sequence=config.rows_per_sequence, seed=0)


def _audit_reference(
    config: StudyConfig, reference: str, out: Path, eval_inputs: torch.Tensor, manifest: Any, *, say: Log
) -> None:
    """Audit the pretrained reference on the text of the audited evaluation blocks, in its own tokens.

    Each block is decoded with the study's tokenizer and encoded with the reference's (special tokens such as
    BOS added as its tokenizer adds them); every sequence is cut to the shortest one so the batch is
    rectangular, and the same query positions are sampled as for the trained runs.
    """
    from tokenizers import Tokenizer

    from attnsens.models import load
    from attnsens.study.auditing import audit

    started = time.perf_counter()
    adapter = load(reference)
    tokenizer = Tokenizer.from_file(str(out / "data" / "tokenizer.json"))
    texts = [tokenizer.decode(block.tolist()) for block in eval_inputs]
    encoded = [adapter.encode(text, max_length=adapter.spec.max_positions)[0] for text in texts]
    length = min(len(ids) for ids in encoded)
    if length <= config.min_query:
        raise ConfigError(
            f"the reference {reference!r} tokenizes the audited text into {length} tokens, too few for "
            f"min_query={config.min_query}; lower min_query or audit longer blocks"
        )
    sequences = torch.stack([ids[:length] for ids in encoded])
    per_sequence = min(config.rows_per_sequence or length, length - config.min_query)
    selection = replace(_selection(config), sample_per_sequence=per_sequence)
    result = audit(adapter, sequences, selection=selection, run_id=f"reference-{reference}", step=0, seed=0)
    units = reference_paths(reference)
    metadata = {"reference": reference, "tokens_per_sequence": length}
    manifest.write_unit(units["rows"], result.rows, schema="rows", metadata=metadata)
    manifest.write_unit(units["summary"], result.summary, schema="summary", metadata=metadata)
    say(
        f"reference {reference}: {len(result.rows)} rows over {len(texts)} sequences of {length} tokens "
        f"({time.perf_counter() - started:.1f} s)"
    )


def baselines_frame(config: StudyConfig, data: TokenData) -> Any:
    """The baselines table: unigram and bigram eval loss on the evaluation batch, and each placement's size."""
    import pandas as pd

    from attnsens.train.data import ngram_eval_losses

    losses = ngram_eval_losses(data)
    records = [
        {"run_id": config.name, "name": name, "eval_loss": loss, "n_parameters": None} for name, loss in losses.items()
    ]
    for placement in config.norm_placements:
        with torch.device("meta"):
            size = sum(p.numel() for p in GPT(config.model_for(placement)).parameters())
        records.append({"run_id": config.run_id(placement), "name": "model", "eval_loss": None, "n_parameters": size})
    return pd.DataFrame(records)
