"""The file layout of a training run's checkpoints, as the store reads it: the checkpoint manifest
(``checkpoints/manifest.json``: checkpoint name → its step and the sha256 of each file) and the (step, seed) a
checkpoint's ``state.json`` records. ``attnsens.train.checkpoint`` writes this layout; ``attnsens.store.verify``
checks it without importing the trainer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from attnsens.errors import CheckpointError

MANIFEST = "manifest.json"
TENSOR_FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")
CHECKPOINT_FILES = (*TENSOR_FILES, "state.json")
CHECKPOINT_NAME = re.compile(r"^step_(\d{6,})$")
"""A checkpoint's folder name, ``checkpoint_name(step)``; group 1 is the step."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def read_manifest(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The manifest's entries by checkpoint name ({} when no checkpoint was written yet)."""
    path = checkpoint_dir(run_dir) / MANIFEST
    if not path.exists():
        return {}
    problem: str | None
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        payload, problem = None, f"is not valid JSON ({err})"
    else:
        problem = _manifest_problem(payload)
    if problem is not None:
        raise CheckpointError(
            f"checkpoint manifest {path} {problem}; restore it, or delete {checkpoint_dir(run_dir)} and rerun to "
            "retrain this run from the start"
        )
    return payload


def _manifest_problem(payload: Any) -> str | None:
    """What is wrong with a parsed checkpoint manifest (None when it fits the layout that
    ``attnsens.train.checkpoint`` documents)."""
    if not isinstance(payload, dict):
        return f"holds a JSON {type(payload).__name__}, not an object of checkpoints"
    for name, entry in payload.items():
        match = CHECKPOINT_NAME.match(name)
        if match is None:
            return f"has an entry {name!r} that is not a checkpoint name like 'step_000008'"
        if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict):
            return f"has an entry {name!r} without a 'files' object"
        step = entry.get("step")
        if type(step) is not int or step != int(match.group(1)):
            return f"has an entry {name!r} whose step is {step!r}, not the integer {int(match.group(1))}"
        for file_name, digest in entry["files"].items():
            if file_name not in CHECKPOINT_FILES:
                return f"has an entry {name!r} naming a file {file_name!r} (allowed: {', '.join(CHECKPOINT_FILES)})"
            if not isinstance(digest, str) or not _SHA256.match(digest):
                return f"has an entry {name!r} whose sha256 of {file_name} is {digest!r}, not 64 hex digits"
        if "model.safetensors" not in entry["files"]:
            return f"has an entry {name!r} that lists no model.safetensors"
    return None


def recorded_key(directory: Path) -> tuple[Any, Any]:
    """(step, training seed) that the checkpoint's own ``state.json`` records; CheckpointError when unreadable."""
    try:
        state = json.loads((directory / "state.json").read_text())
        train_config = state.get("train_config") or {}
        return state["step"], train_config.get("seed") if isinstance(train_config, dict) else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(
            f"checkpoint {directory} has an unusable state.json ({type(err).__name__}: {err}); "
            f"{rebuild_advice(directory)}"
        ) from None


def rebuild_advice(directory: Path) -> str:
    """What to do about a damaged checkpoint ``directory``, for the end of an error message."""
    return f"delete {directory} and rerun: training resumes from the last good checkpoint and rebuilds it"
