"""``attnsens study``: train several seeds, audit every checkpoint, write Parquet and the HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from attnsens._ranks import first_rank
from attnsens.cli.app import JsonOption, OutDirOption, app, console, domain_errors_exit, flag, print_json
from attnsens.cli.interrupt import on_interrupt, rerun_to_resume


@app.command()
@domain_errors_exit
@on_interrupt(rerun_to_resume)
def study(
    out: OutDirOption,
    config: Annotated[str, typer.Option("--config", help="GPT preset: tiny, small, medium or large.")] = "tiny",
    seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated seeds, one training run each.")] = "0,1,2",
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Optimizer steps (preset default).")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Blocks per step (preset default).")] = None,
    placements: Annotated[
        str,
        typer.Option(
            "--placements",
            "--norm",
            help="Comma-separated block variants trained side by side: pre, post, deepnorm, none.",
        ),
    ] = "pre",
    lr: Annotated[
        str | None,
        typer.Option(
            "--lr",
            help="Peak learning rate of every placement (6e-3), or per placement (pre=6e-3,post=2e-3); default: "
            "the preset's (tiny: 6e-3 for pre after 60 warmup steps; 2e-3 for post and deepnorm after 300).",
        ),
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option("--reference", help="Pretrained model audited on the same text as the trained end (smollm2)."),
    ] = None,
    data: Annotated[Path | None, typer.Option("--data", help="Text file or folder (default: Shakespeare).")] = None,
    bounds: Annotated[bool, flag("--bounds/--no-bounds", help="Certified bounds per checkpoint.")] = True,
    device: Annotated[str | None, typer.Option("--device", help="cpu or cuda (default: cuda when present).")] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="CPU threads for torch (default: torch's choice).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Train every seed, audit every checkpoint (θ certificates, concentration, bounds), write the report.

    Rerun the same command to resume an interrupted study; rerun it with more --seeds (0,1 after 0) to add them.
    The runs done are verified and kept. The last line printed is the report's path.
    With --json, only the run's summary is printed: folder, report, findings, configuration, seconds.
    """
    import torch

    from attnsens.cli.inputs import check_device, check_out_dir, quiet_transformers
    from attnsens.cli.progress import ProgressReport
    from attnsens.study.study import StudyConfig, run_study

    check_device(device)
    check_out_dir(out)
    if reference is not None:
        quiet_transformers()  # the reference model loads while the study's progress is on screen
    if threads is not None:
        torch.set_num_threads(threads)
    seed_list, placement_list = _seeds_and_placements(seeds, placements)
    lr_all, placement_lr = _learning_rates(lr)
    study_config = StudyConfig.from_preset(
        config,
        seeds=seed_list,
        steps=steps,
        placements=placement_list,
        reference=reference,
        data=None if data is None else str(data),
        batch_size=batch_size,
        bounds=bounds,
        lr=lr_all,
        placement_train={placement: {"lr": rate} for placement, rate in placement_lr.items()},
    )
    # torchrun sets RANK before the process group exists (run_study joins it).
    is_writer = first_rank()

    def say(message: str) -> None:
        if is_writer and not as_json:
            console.print(message, soft_wrap=True)

    with ProgressReport("training", "steps", enabled=is_writer and not as_json) as report:
        result = run_study(
            study_config, out, log=say, device=device, callbacks=[SeedProgress(report, study_config.train.steps)]
        )
    if as_json:
        if result.report is not None:
            print_json(study_summary(result, study_config))
        return
    if result.report is not None:
        say(f"trained in {result.train_seconds:.0f} s, audited in {result.audit_seconds:.0f} s")
        console.print(str(result.report), soft_wrap=True)


def _seeds_and_placements(seeds: str, placements: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """--seeds and --placements as tuples, checked: distinct integer seeds, known block placements."""
    from attnsens.errors import ConfigError
    from attnsens.train.model import NORM_PLACEMENTS

    try:
        seed_list = tuple(int(s) for s in seeds.split(",") if s.strip())
    except ValueError as err:
        raise ConfigError(f"--seeds must be comma-separated integers such as 0,1,2, got {seeds!r}") from err
    if not seed_list or len(set(seed_list)) != len(seed_list):
        raise ConfigError(f"--seeds must name distinct seeds, such as 0,1,2; got {seeds!r}")
    placement_list = tuple(p.strip() for p in placements.split(",") if p.strip())
    unknown = [p for p in placement_list if p not in NORM_PLACEMENTS]
    if unknown or not placement_list:
        what = f"{', '.join(map(repr, unknown))} is not a block placement" if unknown else "names no placement"
        raise ConfigError(f"--placements {placements!r}: {what}; choose among {', '.join(NORM_PLACEMENTS)}")
    return seed_list, placement_list


def study_summary(result: Any, study_config: Any) -> dict[str, Any]:
    """What ``study --json`` prints: the folder, report and findings files, the configuration (as recorded in the
    manifest) and the seconds spent training and auditing."""
    findings = result.report.parent / "findings.json"
    return {
        "out_dir": result.out_dir,
        "report": result.report,
        "findings": findings if findings.is_file() else None,
        "seeds": list(study_config.seeds),
        "placements": list(study_config.placements),
        "steps": study_config.train.steps,
        "train_seconds": result.train_seconds,
        "audit_seconds": result.audit_seconds,
        "config": study_config.describe(),
    }


class SeedProgress:
    """Trainer callback for a study: the training progress of each run (placement, seed), with loss, tokens/s and
    ETA; runs trained side by side report in turn, each with its own rate."""

    def __init__(self, report: Any, steps: int) -> None:
        self.report, self.steps = report, steps
        self.runs: dict[tuple[str, int], Any] = {}

    def on_record(self, record: dict[str, Any]) -> None:
        from attnsens.cli.train import TrainingProgress

        run = (record["run_id"], record["seed"])
        if run not in self.runs:
            self.runs[run] = TrainingProgress(self.report, self.steps)
        self.report.label = f"{record['run_id']} seed {record['seed']}: training"
        self.runs[run].on_record(record)


def _learning_rates(value: str | None) -> tuple[float | None, dict[str, float]]:
    """``--lr`` as (one rate for every placement, or None; per-placement rates)."""
    from attnsens.errors import ConfigError

    if value is None:
        return None, {}
    try:
        if "=" not in value:
            return float(value), {}
        pairs = (part.split("=", 1) for part in value.split(",") if part.strip())
        return None, {name.strip(): float(rate) for name, rate in pairs}
    except ValueError as err:
        raise ConfigError(
            f"--lr must be a number such as 6e-3 or pairs such as pre=6e-3,post=2e-3, got {value!r}"
        ) from err
