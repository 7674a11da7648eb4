"""Checkpoints: schedule, exact round trip, corruption and duplication detected by hash."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from attnsens.errors import CheckpointError
from attnsens.train.checkpoint import (
    checkpoint_dir,
    checkpoint_steps,
    load_checkpoint,
    load_model_state,
    restore_rng,
    save_checkpoint,
    saved_steps,
)
from attnsens.train.model import GPT
from tests.helpers.checkpoint import trained_pair
from tests.unit.train.conftest import micro_model_config


@pytest.mark.parametrize(
    ("max_steps", "expected"),
    [
        (0, [0]),
        (1, [0, 1]),
        (2, [0, 1, 2]),
        (8, [0, 1, 2, 4, 8]),
        (13, [0, 1, 2, 4, 8, 13]),
        (1000, [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]),
    ],
)
def test_log_spaced_schedule(max_steps: int, expected: list[int]) -> None:
    assert checkpoint_steps(max_steps) == expected


def test_round_trip_is_exact(tmp_path: Path) -> None:
    model, optimizer = trained_pair()
    save_checkpoint(tmp_path, 5, model_state=model.state_dict(), optimizer=optimizer, state={"note": [1, 2]})
    expected_rng = torch.rand(4)
    checkpoint = load_checkpoint(tmp_path, 5)
    assert checkpoint["state"]["note"] == [1, 2] and checkpoint["state"]["step"] == 5
    for name, tensor in model.state_dict().items():
        assert torch.equal(checkpoint["model"][name], tensor)
    fresh = torch.optim.AdamW(GPT(micro_model_config()).parameters(), lr=1.0)
    fresh.load_state_dict(checkpoint["optimizer"])
    original, restored = optimizer.state_dict(), fresh.state_dict()
    assert restored["param_groups"][0]["lr"] == 1e-2
    for index, values in original["state"].items():
        for key, value in values.items():
            assert torch.equal(restored["state"][index][key], value)
    restore_rng(checkpoint["rng"])
    assert torch.equal(torch.rand(4), expected_rng)
    assert saved_steps(tmp_path) == [5]


def test_flipped_byte_is_reported_as_corruption(tmp_path: Path) -> None:
    model, optimizer = trained_pair()
    save_checkpoint(tmp_path, 3, model_state=model.state_dict(), optimizer=optimizer, state={})
    path = checkpoint_dir(tmp_path) / "step_000003" / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"model\.safetensors is corrupted: sha256"):
        load_model_state(tmp_path, 3)


def test_missing_file_and_unknown_step(tmp_path: Path) -> None:
    model, optimizer = trained_pair()
    save_checkpoint(tmp_path, 3, model_state=model.state_dict(), optimizer=optimizer, state={})
    with pytest.raises(CheckpointError, match=r"registered steps: \[3\]"):
        load_checkpoint(tmp_path, 4)
    (checkpoint_dir(tmp_path) / "step_000003" / "rng.safetensors").unlink()
    with pytest.raises(CheckpointError, match="is missing"):
        load_checkpoint(tmp_path, 3)


def test_copied_checkpoint_is_reported_as_duplicate(tmp_path: Path) -> None:
    model, optimizer = trained_pair()
    save_checkpoint(tmp_path, 2, model_state=model.state_dict(), optimizer=optimizer, state={})
    root = checkpoint_dir(tmp_path)
    shutil.copytree(root / "step_000002", root / "step_000004")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["step_000004"] = {**manifest["step_000002"], "step": 4}
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"identical model weights: step_000004 is a copy of step_000002; delete"):
        load_checkpoint(tmp_path, 4)


def test_interrupted_save_leaves_no_registered_checkpoint(tmp_path: Path) -> None:
    model, optimizer = trained_pair()
    save_checkpoint(tmp_path, 1, model_state=model.state_dict(), optimizer=optimizer, state={})
    (checkpoint_dir(tmp_path) / ".step_000002.tmp").mkdir()  # a crash while writing step 2
    assert saved_steps(tmp_path) == [1]
    save_checkpoint(tmp_path, 2, model_state=model.state_dict(), optimizer=optimizer, state={})
    assert saved_steps(tmp_path) == [1, 2]
    assert not (checkpoint_dir(tmp_path) / ".step_000002.tmp").exists()
