"""What ``attnsens train`` and ``attnsens study`` wrote, found by path and loaded as a model.

Accepted paths (``attnsens.models.load`` and every CLI command that takes a MODEL):

* a training run ``runs/x`` (its ``checkpoints/manifest.json``): the last checkpoint, or ``step``;
* a checkpoint folder ``runs/x/checkpoints/step_000200`` or its ``model.safetensors``;
* a study folder (``runs/seed=S/checkpoints``): the run of ``seed`` (optional when the study has one seed),
  and a seed's run folder ``study/runs/seed=S`` itself.

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
from attnsens.train.checkpoint import MANIFEST, checkpoint_dir, checkpoint_name, saved_steps, verify_checkpoint

_STEP_FOLDER = re.compile(r"step_(\d{6,})")
_SEED_FOLDER = re.compile(r"seed=(-?\d+)")


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

    def load(self, *, device: Any = "cpu", dtype: torch.dtype = torch.float32) -> Any:
        """The checkpoint's GPT in the own-GPT adapter, with the run's tokenizer (sha256 checked first)."""
        from safetensors.torch import load_file

        from attnsens.models.own_gpt import OwnGPTAdapter
        from attnsens.train.model import GPT, GPTConfig

        directory = verify_checkpoint(self.run_dir, self.step)
        model = GPT(GPTConfig(**self.model_config))
        model.load_state_dict(load_file(directory / "model.safetensors"))
        tokenizer = None
        if self.tokenizer_path is not None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        return OwnGPTAdapter(model.to(device=device, dtype=dtype).eval(), name=self.name, tokenizer=tokenizer)


def find_checkpoint(path: str | Path, *, step: int | None = None, seed: int | None = None) -> SavedCheckpoint | None:
    """The checkpoint ``path`` names (see the module docstring), or None when ``path`` is no run or study.

    Raises CheckpointError for a step the run never saved and FileFormatError for a seed the study lacks or a
    study of several seeds without ``seed``.
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
    seeds = study_seeds(path)
    if not seeds:
        return None
    if seed is None:
        if len(seeds) > 1:
            raise FileFormatError(f"study {path} holds the runs of seeds {seeds}; choose one with --seed (seed=)")
        seed = seeds[0]
    if seed not in seeds:
        raise FileFormatError(f"study {path} has no run of seed {seed}; its seeds are {seeds}")
    return _in_run(path / "runs" / f"seed={seed}", step, seed)


def study_seeds(path: Path) -> list[int]:
    """Training seeds of the study in ``path`` (runs/seed=S with checkpoints), ascending; [] for no study."""
    runs = path / "runs"
    if not runs.is_dir():
        return []
    seeds = []
    for child in runs.iterdir():
        match = _SEED_FOLDER.fullmatch(child.name)
        if match and (checkpoint_dir(child) / MANIFEST).is_file():
            seeds.append(int(match.group(1)))
    return sorted(seeds)


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
    seed_match = _SEED_FOLDER.fullmatch(run_dir.name)
    study = run_dir.parent.parent if seed_match and run_dir.parent.name == "runs" else None
    if seed is None:
        seed = int(state["train_config"]["seed"])
    candidates = [run_dir / "tokenizer.json"]
    if study is not None:
        candidates.append(study / "data" / "tokenizer.json")
    tokenizer = next((candidate for candidate in candidates if candidate.is_file()), None)
    label = f"{study.name}/seed={seed}" if study is not None else run_dir.name
    return SavedCheckpoint(
        run_dir=run_dir,
        step=step,
        seed=seed,
        tokenizer_path=tokenizer,
        name=f"{label}@{step}",
        model_config=state["model_config"],
    )
