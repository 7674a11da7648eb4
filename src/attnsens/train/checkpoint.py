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

The manifest is validated on every read: entries named ``step_NNNNNN`` whose integer ``step`` matches the
name, and ``files`` whose names are the plain file names above (nothing outside the checkpoint directory is
ever opened) with 64-hex sha256 values. A checkpoint's own ``state.json`` must name its step (and, when the
caller knows it, its training seed): a checkpoint directory copied over another one, with its hashes copied into
the manifest too, is caught by its contents. Every error names the fix, and the fix rebuilds: a deleted checkpoint
directory is dropped from the manifest on the next run (:func:`prune_deleted`), and training resumes from the
last good checkpoint before the first gap in the schedule (``Trainer.resume``), rewriting the later ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from attnsens.errors import CheckpointError
from attnsens.store.checkpoint_files import (
    CHECKPOINT_NAME,
    MANIFEST,
    checkpoint_dir,
    checkpoint_name,
    read_manifest,
    rebuild_advice,
    recorded_key,
)
from attnsens.store.manifest import sha256_file
from attnsens.store.parquet import atomic_write, output_write_error


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


def prune_deleted(run_dir: str | Path) -> dict[int, str]:
    """Drop the manifest entries whose checkpoint directory was deleted; return their steps → model sha256.

    Deleting a checkpoint's directory is how a user discards it; the next run then rebuilds it.
    """
    manifest = read_manifest(run_dir)
    gone = {name: e for name, e in manifest.items() if not (checkpoint_dir(run_dir) / name).is_dir()}
    if gone:
        _write_manifest(run_dir, {name: e for name, e in manifest.items() if name not in gone})
    return {entry["step"]: entry["files"]["model.safetensors"] for entry in gone.values()}


def model_hashes(run_dir: str | Path) -> dict[int, str]:
    """The registered checkpoints' steps → sha256 of their model weights."""
    return {entry["step"]: entry["files"]["model.safetensors"] for entry in read_manifest(run_dir).values()}


def resume_step(run_dir: str | Path, schedule: list[int] | tuple[int, ...]) -> int | None:
    """The checkpoint to resume from: the last one before the first scheduled step that is missing below the
    latest checkpoint (so a deleted checkpoint is rebuilt), else the latest; None to start from scratch."""
    steps = [s for s in saved_steps(run_dir) if (checkpoint_dir(run_dir) / checkpoint_name(s)).is_dir()]
    if not steps:
        return None
    gaps = [s for s in schedule if s < steps[-1] and s not in steps]
    if not gaps:
        return steps[-1]
    before = [s for s in steps if s < gaps[0]]
    return before[-1] if before else None


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
    name = checkpoint_name(step)
    final, staging = root / name, root / f".{name}.tmp"
    tensors, hyperparameters = _split_optimizer_state(optimizer.state_dict())
    created = not root.exists()
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        save_file({k: v.detach().contiguous().cpu() for k, v in model_state.items()}, staging / "model.safetensors")
        save_file(tensors, staging / "optimizer.safetensors")
        save_file(_rng_state(), staging / "rng.safetensors")
        (staging / "state.json").write_text(json.dumps({**state, "step": step, "optimizer": hyperparameters}) + "\n")
    except Exception as err:  # OSError, or safetensors' own error wrapping one (disk full, read-only folder)
        shutil.rmtree(staging, ignore_errors=True)
        if created:  # the folder as it was before this checkpoint: without an empty checkpoints/
            with contextlib.suppress(OSError):
                root.rmdir()
        raise output_write_error(final, err) from None
    files = {path.name: sha256_file(path) for path in sorted(staging.iterdir())}
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    manifest = read_manifest(run_dir)
    manifest[name] = {"step": step, "files": files}
    _write_manifest(run_dir, manifest)
    return final


def _write_manifest(run_dir: str | Path, manifest: dict[str, dict[str, Any]]) -> None:
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    atomic_write(checkpoint_dir(run_dir) / MANIFEST, lambda tmp: Path(tmp).write_text(text))


def verify_checkpoint(run_dir: str | Path, step: int, *, seed: int | None = None) -> Path:
    """Check checkpoint ``step`` against the manifest and its ``state.json`` against its key (``step``, and the
    training ``seed`` when given); return its directory or raise CheckpointError."""
    manifest = read_manifest(run_dir)
    name = checkpoint_name(step)
    if name not in manifest:
        raise CheckpointError(
            f"no checkpoint for step {step} in {checkpoint_dir(run_dir) / MANIFEST} "
            f"(registered steps: {saved_steps(run_dir)}); pick one of those, or rerun the training command "
            "(with --resume for attnsens train) to rebuild the missing checkpoints"
        )
    _check_duplicates(run_dir, manifest)
    directory = checkpoint_dir(run_dir) / name
    for file_name, expected in manifest[name]["files"].items():
        path = directory / file_name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing; {rebuild_advice(directory)}")
        actual = sha256_file(path)
        if actual != expected:
            raise CheckpointError(
                f"checkpoint file {path} is corrupted: sha256 {actual[:12]}… != manifest {expected[:12]}…; "
                f"{rebuild_advice(directory)}"
            )
    _check_key(directory, step, seed)
    return directory


def _check_key(directory: Path, step: int, seed: int | None) -> None:
    """The contents of checkpoint ``step`` must be step ``step``'s (of ``seed``): a copied checkpoint whose hashes
    were copied into the manifest as well passes every sha256 check but not this one."""
    recorded_step, recorded_seed = recorded_key(directory)
    wrong = []
    if recorded_step != step:
        wrong.append(f"step {recorded_step!r}")
    if seed is not None and recorded_seed != seed:
        wrong.append(f"seed {recorded_seed!r}")
    if wrong:
        wanted = f"step {step}" + ("" if seed is None else f" of seed {seed}")
        raise CheckpointError(
            f"checkpoint {directory} holds {' and '.join(wrong)}, not {wanted} (a copy of another checkpoint); "
            f"{rebuild_advice(directory)}"
        )


def _tensors(path: Path) -> dict[str, Tensor]:
    """The tensors of a verified checkpoint file; CheckpointError when its content is not safetensors."""
    try:
        return load_file(path)
    except Exception as err:  # safetensors raises its own error types for a broken header
        raise CheckpointError(
            f"checkpoint file {path} is not readable safetensors ({type(err).__name__}: {err}); "
            f"{rebuild_advice(path.parent)}"
        ) from None


def load_model_state(run_dir: str | Path, step: int) -> dict[str, Tensor]:
    """The verified model parameters of checkpoint ``step`` (CPU tensors, state_dict names)."""
    return _tensors(verify_checkpoint(run_dir, step) / "model.safetensors")


def load_checkpoint(run_dir: str | Path, step: int) -> dict[str, Any]:
    """Everything in verified checkpoint ``step``: model, optimizer (a state_dict), rng, state."""
    directory = verify_checkpoint(run_dir, step)
    moments = _tensors(directory / "optimizer.safetensors")
    try:
        state = json.loads((directory / "state.json").read_text())
        optimizer = _join_optimizer_state(moments, state.pop("optimizer"))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(
            f"checkpoint {directory} has an unusable state.json or optimizer state ({type(err).__name__}: {err}); "
            f"{rebuild_advice(directory)}"
        ) from None
    return {
        "model": _tensors(directory / "model.safetensors"),
        "optimizer": optimizer,
        "rng": _tensors(directory / "rng.safetensors"),
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
            raise CheckpointError(_duplicate_message(checkpoint_dir(run_dir), seen[digest], name))
        seen[digest] = name


def _duplicate_message(root: Path, first: str, second: str) -> str:
    """Name the copy among two checkpoints with identical weights: the one whose ``state.json`` records another
    step than its name (when the copy's state.json came along, as with ``cp -r``)."""
    copies = []
    for name in (first, second):
        directory = root / name
        try:
            recorded_step, _ = recorded_key(directory)
        except CheckpointError:
            continue
        named = CHECKPOINT_NAME.match(name)
        if named is not None and recorded_step != int(named.group(1)):
            copies.append(name)
    if len(copies) == 1:
        copy = copies[0]
        original = second if copy == first else first
        return (
            f"checkpoints {first} and {second} in {root} hold identical model weights: {copy} is a copy of "
            f"{original}; {rebuild_advice(root / copy)}"
        )
    return (
        f"checkpoints {first} and {second} in {root} hold identical model weights (a duplicated checkpoint); "
        f"delete the copy ({root / second} if it was copied from {first}) and rerun: training resumes from the "
        "last good checkpoint and rebuilds it"
    )
