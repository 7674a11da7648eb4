"""Training checkpoints: safetensors for tensors, JSON for the rest, a sha256 manifest over everything.

Layout under ``run_dir/checkpoints``::

    manifest.json                 {"step_000008": {"step": 8, "files": {"model.safetensors": "<sha256>", ...}}}
    step_000008/model.safetensors       model parameters (state_dict names)
    step_000008/optimizer.safetensors   AdamW moments and step counts ("state.<param index>.<name>")
    step_000008/rng.safetensors         torch CPU (and CUDA) generator states
    step_000008/state.json              step, configs, optimizer hyperparameters, the training log so far

A checkpoint directory is written under a temporary name and renamed into place, then entered in the manifest
(also replaced atomically), so a crash leaves either a complete registered checkpoint or an unregistered
directory that the next save overwrites. Loading checks every file against the manifest: a changed byte is a
CheckpointError, as is a manifest that records the same model weights under two steps (a copied checkpoint).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from attnsens.errors import CheckpointError
from attnsens.store.manifest import sha256_file

MANIFEST = "manifest.json"
TENSOR_FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")


def checkpoint_steps(max_steps: int) -> list[int]:
    """Log-spaced checkpoint schedule 0, 1, 2, 4, 8, …, 2^k < max_steps, and max_steps itself."""
    if max_steps < 0:
        raise CheckpointError(f"max_steps must be >= 0, got {max_steps}")
    steps = [0]
    power = 1
    while power < max_steps:
        steps.append(power)
        power *= 2
    if max_steps > 0:
        steps.append(max_steps)
    return steps


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def read_manifest(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The manifest's entries by checkpoint name ({} when no checkpoint was written yet)."""
    path = checkpoint_dir(run_dir) / MANIFEST
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"checkpoint manifest {path} is not valid JSON ({err}); restore it or rerun") from err


def saved_steps(run_dir: str | Path) -> list[int]:
    """Steps of the registered checkpoints, ascending."""
    return sorted(entry["step"] for entry in read_manifest(run_dir).values())


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model_state: dict[str, Tensor],
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
) -> Path:
    """Write checkpoint ``step`` atomically and register its file hashes. Returns its directory."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(step)
    final, staging = root / name, root / f".{name}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    save_file({k: v.detach().contiguous().cpu() for k, v in model_state.items()}, staging / "model.safetensors")
    tensors, hyperparameters = _split_optimizer_state(optimizer.state_dict())
    save_file(tensors, staging / "optimizer.safetensors")
    save_file(_rng_state(), staging / "rng.safetensors")
    (staging / "state.json").write_text(json.dumps({**state, "step": step, "optimizer": hyperparameters}) + "\n")
    files = {path.name: sha256_file(path) for path in sorted(staging.iterdir())}
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    manifest = read_manifest(run_dir)
    manifest[name] = {"step": step, "files": files}
    staged_manifest = root / f".{MANIFEST}.tmp"
    staged_manifest.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(staged_manifest, root / MANIFEST)
    return final


def verify_checkpoint(run_dir: str | Path, step: int) -> Path:
    """Check checkpoint ``step`` against the manifest; return its directory or raise CheckpointError."""
    manifest = read_manifest(run_dir)
    name = checkpoint_name(step)
    if name not in manifest:
        raise CheckpointError(
            f"no checkpoint for step {step} in {checkpoint_dir(run_dir) / MANIFEST} "
            f"(registered steps: {saved_steps(run_dir)}); pick one of those or rerun training"
        )
    _check_duplicates(run_dir, manifest)
    directory = checkpoint_dir(run_dir) / name
    for file_name, expected in manifest[name]["files"].items():
        path = directory / file_name
        if not path.exists():
            raise CheckpointError(f"checkpoint file {path} is missing; delete {directory} and rerun to rebuild it")
        actual = sha256_file(path)
        if actual != expected:
            raise CheckpointError(
                f"checkpoint file {path} is corrupted: sha256 {actual[:12]}… != manifest {expected[:12]}…; "
                f"delete {directory} (and its manifest entry) and rerun to rebuild it"
            )
    return directory


def load_model_state(run_dir: str | Path, step: int) -> dict[str, Tensor]:
    """The verified model parameters of checkpoint ``step`` (CPU tensors, state_dict names)."""
    return load_file(verify_checkpoint(run_dir, step) / "model.safetensors")


def load_checkpoint(run_dir: str | Path, step: int) -> dict[str, Any]:
    """Everything in verified checkpoint ``step``: model, optimizer (a state_dict), rng, state."""
    directory = verify_checkpoint(run_dir, step)
    state = json.loads((directory / "state.json").read_text())
    optimizer = _join_optimizer_state(load_file(directory / "optimizer.safetensors"), state.pop("optimizer"))
    return {
        "model": load_file(directory / "model.safetensors"),
        "optimizer": optimizer,
        "rng": load_file(directory / "rng.safetensors"),
        "state": state,
    }


def restore_rng(rng: dict[str, Tensor]) -> None:
    """Put the torch generators back where a checkpoint found them."""
    torch.set_rng_state(rng["torch_cpu"])
    if torch.cuda.is_available():
        states = [rng[f"torch_cuda_{i}"] for i in range(torch.cuda.device_count()) if f"torch_cuda_{i}" in rng]
        if states:
            torch.cuda.set_rng_state_all(states)


def _rng_state() -> dict[str, Tensor]:
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng.update({f"torch_cuda_{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return rng


def _split_optimizer_state(state_dict: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, per_param in state_dict["state"].items():
        for key, value in per_param.items():
            if isinstance(value, Tensor):
                tensors[f"state.{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def _join_optimizer_state(tensors: dict[str, Tensor], hyperparameters: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    for index, values in hyperparameters["scalars"].items():
        state.setdefault(int(index), {}).update(values)
    return {"state": state, "param_groups": hyperparameters["param_groups"]}


def _check_duplicates(run_dir: str | Path, manifest: dict[str, dict[str, Any]]) -> None:
    seen: dict[str, str] = {}
    for name, entry in sorted(manifest.items()):
        digest = entry["files"].get("model.safetensors")
        if digest in seen:
            raise CheckpointError(
                f"checkpoints {seen[digest]} and {name} in {checkpoint_dir(run_dir)} hold identical model weights "
                "(a duplicated checkpoint); delete the copy and its manifest entry, then rerun"
            )
        seen[digest] = name
