"""What ``attnsens train`` and ``attnsens study`` wrote, found by path and loaded as a model.

Accepted paths (``attnsens.models.load`` and every CLI command that takes a MODEL):

* a training run ``runs/x`` (its ``checkpoints/manifest.json``): the last checkpoint, or ``step``;
* a checkpoint folder ``runs/x/checkpoints/step_000200`` or its ``model.safetensors``;
* a study folder (``runs/placement=P/seed=S/checkpoints``, or ``runs/seed=S/...`` of older studies): the run of
  ``seed`` and ``placement`` (either may be left out while it leaves one run), and a run folder
  ``study/runs/placement=P/seed=S`` itself.

Every checkpoint is checked against its sha256 manifest before it is read. The tokenizer travels with the
weights: ``tokenizer.json`` of the run, or the study's shared ``data/tokenizer.json``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnsens.errors import CheckpointError, FileFormatError
from attnsens.train.checkpoint import MANIFEST, checkpoint_dir, checkpoint_name, load_model_state, saved_steps
from attnsens.train.model import GPT, GPTConfig

_STEP_FOLDER = re.compile(r"step_(\d{6,})")
_SEED_FOLDER = re.compile(r"seed=(-?\d+)")
_PLACEMENT_FOLDER = re.compile(r"placement=(\w+)")


@dataclass(frozen=True)
class SavedCheckpoint:
    """One verified-on-load checkpoint of a run: where it is, its step, its training seed and its tokenizer."""

    run_dir: Path
    step: int
    seed: int
    tokenizer_path: Path | None
    name: str
    model_config: dict[str, Any]

    def context_length(self) -> int:
        """Positions the checkpoint's GPT accepts (``max_positions``), known before its weights load."""
        return int(self.model_config["max_positions"])

    def load_model(self, *, device: Any = "cpu", dtype: torch.dtype = torch.float32) -> GPT:
        """The checkpoint's GPT in eval mode (sha256 checked first); ``attnsens.models.load(checkpoint)`` wraps it
        in the own-GPT adapter with ``load_tokenizer()``."""
        model = GPT(GPTConfig(**self.model_config))
        model.load_state_dict(load_model_state(self.run_dir, self.step))  # verified; a broken file is one line
        return model.to(device=device, dtype=dtype).eval()

    def load_tokenizer(self) -> Any:
        """The run's ``tokenizers.Tokenizer``, or None when the run kept none."""
        if self.tokenizer_path is None:
            return None
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.tokenizer_path))


def find_checkpoint(
    path: str | Path, *, step: int | None = None, seed: int | None = None, placement: str | None = None
) -> SavedCheckpoint | None:
    """The checkpoint ``path`` names (see the module docstring), or None when ``path`` is no run or study.

    Raises CheckpointError for a step the run never saved and FileFormatError for a (placement, seed) the study
    lacks, or a study of several runs without the ``seed`` / ``placement`` that picks one.
    """
    path = Path(path).expanduser()
    if path.is_file() and path.name == "model.safetensors" and (path.parent / "state.json").is_file():
        path = path.parent
    match = _STEP_FOLDER.fullmatch(path.name)
    if path.is_dir() and match and path.parent.name == "checkpoints":
        folder_step = int(match.group(1))
        if step is not None and step != folder_step:
            raise CheckpointError(f"{path} is the checkpoint of step {folder_step}, not step {step}; drop the step")
        return _in_run(path.parent.parent, folder_step, seed)
    if (checkpoint_dir(path) / MANIFEST).is_file():
        return _in_run(path, step, seed)
    runs = study_runs(path)
    if not runs:
        return None
    chosen = {
        key: run_dir
        for key, run_dir in runs.items()
        if (seed is None or key[1] == seed) and (placement is None or key[0] == placement)
    }
    if len(chosen) != 1:
        available = ", ".join(f"seed {s}" if p is None else f"{p} seed {s}" for p, s in runs)
        asked = ", ".join(
            part for part in (placement and f"placement {placement}", seed is not None and f"seed {seed}") if part
        )
        problem = f"has no run of {asked}" if not chosen else "holds several runs" + (f" of {asked}" if asked else "")
        pool = chosen or runs  # the runs to choose among: those matching what was asked, or every run
        needed = [
            name
            for name, values, given in (
                ("seed", {s for _, s in pool}, seed),
                ("placement", {p for p, _ in pool}, placement),
            )
            if len(values) > 1 or (not chosen and given is not None)
        ]
        flags = " and ".join(f"--{name} {name[0].upper()}" for name in needed)
        how = f"{flags} ({', '.join(f'{name}=' for name in needed)})"
        raise FileFormatError(f"study {path} {problem} (runs: {available}); choose one with {how}")
    ((_, seed), run_dir), *_ = chosen.items()
    return _in_run(run_dir, step, seed)


def study_runs(path: Path) -> dict[tuple[str | None, int], Path]:
    """The training runs of the study in ``path`` by (placement, seed): ``runs/placement=P/seed=S`` (placement
    None for the older ``runs/seed=S``); {} when ``path`` holds no study."""
    runs = path / "runs"
    if not runs.is_dir():
        return {}
    found: dict[tuple[str | None, int], Path] = {}
    for child in sorted(runs.iterdir()):
        placement_match = _PLACEMENT_FOLDER.fullmatch(child.name)
        seed_dirs = sorted(child.iterdir()) if placement_match and child.is_dir() else [child]
        for seed_dir in seed_dirs:
            match = _SEED_FOLDER.fullmatch(seed_dir.name)
            if match and (checkpoint_dir(seed_dir) / MANIFEST).is_file():
                placement = placement_match.group(1) if placement_match else None
                found[placement, int(match.group(1))] = seed_dir
    return dict(sorted(found.items(), key=lambda item: (item[0][0] or "", item[0][1])))


def _study_of(run_dir: Path) -> tuple[Path, str | None] | None:
    """(study folder, placement) of a run folder inside a study, or None for a stand-alone run."""
    if not _SEED_FOLDER.fullmatch(run_dir.name):
        return None
    parent = run_dir.parent
    if parent.name == "runs":
        return parent.parent, None
    match = _PLACEMENT_FOLDER.fullmatch(parent.name)
    if match and parent.parent.name == "runs":
        return parent.parent.parent, match.group(1)
    return None


def _in_run(run_dir: Path, step: int | None, seed: int | None) -> SavedCheckpoint:
    steps = saved_steps(run_dir)
    if not steps:
        raise CheckpointError(f"{run_dir} has no registered checkpoint yet; train it first (attnsens train)")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise CheckpointError(f"{run_dir} has no checkpoint of step {step}; its saved steps are {steps}")
    state_path = checkpoint_dir(run_dir) / checkpoint_name(step) / "state.json"
    try:
        state = json.loads(state_path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {state_path} ({err}); delete the checkpoint and rerun training") from err
    study = _study_of(run_dir)
    if seed is None:
        # A study's tables name a run by its folder's seed (the same as the one it was trained with).
        folder_seed = _SEED_FOLDER.fullmatch(run_dir.name) if study is not None else None
        seed = int(folder_seed.group(1) if folder_seed else state["train_config"]["seed"])
    candidates = [run_dir / "tokenizer.json"]
    label = run_dir.name
    if study is not None:
        folder, placement = study
        candidates.append(folder / "data" / "tokenizer.json")
        label = f"{folder.name}/{placement + '/' if placement else ''}seed={seed}"
    tokenizer = next((candidate for candidate in candidates if candidate.is_file()), None)
    return SavedCheckpoint(
        run_dir=run_dir,
        step=step,
        seed=seed,
        tokenizer_path=tokenizer,
        name=f"{label}@{step}",
        model_config=state["model_config"],
    )
