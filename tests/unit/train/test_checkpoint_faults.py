"""Malformed checkpoint manifests and unreadable files are named with a fix; following the fix rebuilds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnsens.errors import CheckpointError
from attnsens.store import sha256_file
from attnsens.train.checkpoint import (
    checkpoint_dir,
    load_checkpoint,
    model_hashes,
    prune_deleted,
    resume_step,
    save_checkpoint,
    saved_steps,
)
from tests.unit.train.test_checkpoint import trained_pair
from tests.unit.train.test_trainer import Recorder, run


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    model, optimizer = trained_pair()
    for step in (0, 1, 2, 4, 8):
        save_checkpoint(tmp_path, step, model_state=model.state_dict(), optimizer=optimizer, state={"s": step})
        next(model.parameters()).data += 1.0  # distinct weights per step, as training gives
    return tmp_path


def _edit_manifest(run_dir: Path, edit) -> None:
    path = checkpoint_dir(run_dir) / "manifest.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda m: [], "holds a JSON list"),
        (lambda m: {**m, "step_000008": {"step": 8}}, "without a 'files' object"),
        (lambda m: {**m, "step_000008": {**m["step_000008"], "step": "8"}}, "step is '8', not the integer 8"),
        (lambda m: {**m, "step_00008x": m["step_000008"]}, "not a checkpoint name"),
        (
            lambda m: {**m, "step_000008": {"step": 8, "files": {**m["step_000008"]["files"], "../../x": "0" * 64}}},
            "naming a file '../../x'",
        ),
        (
            lambda m: {**m, "step_000008": {"step": 8, "files": {"model.safetensors": "etc"}}},
            "not 64 hex digits",
        ),
    ],
)
def test_malformed_manifests_are_named_with_the_fix(saved: Path, edit, named: str) -> None:
    _edit_manifest(saved, edit)
    with pytest.raises(CheckpointError, match=named) as raised:
        load_checkpoint(saved, 8)
    assert f"delete {checkpoint_dir(saved)} and rerun" in str(raised.value)


def test_a_broken_header_with_a_matching_hash_is_named(saved: Path) -> None:
    path = checkpoint_dir(saved) / "step_000004" / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[9] ^= 0x7F  # inside the JSON header
    path.write_bytes(bytes(raw))
    _edit_manifest(saved, lambda m: {**m, "step_000004": {"step": 4, "files": {
        **m["step_000004"]["files"], "model.safetensors": sha256_file(path)}}})  # fmt: skip
    with pytest.raises(CheckpointError, match=r"model\.safetensors is not readable safetensors .*delete .*and rerun"):
        load_checkpoint(saved, 4)


def test_a_deleted_checkpoint_is_pruned_and_resume_starts_before_the_gap(saved: Path) -> None:
    schedule = (0, 1, 2, 4, 8)
    assert resume_step(saved, schedule) == 8
    digest = model_hashes(saved)[2]
    for path in (checkpoint_dir(saved) / "step_000002").iterdir():
        path.unlink()
    (checkpoint_dir(saved) / "step_000002").rmdir()
    assert resume_step(saved, schedule) == 1
    assert prune_deleted(saved) == {2: digest}
    assert saved_steps(saved) == [0, 1, 4, 8] and resume_step(saved, schedule) == 1
    assert prune_deleted(saved) == {}


def test_deleting_a_checkpoint_as_advised_rebuilds_it_bit_identically(corpus_file: Path, tmp_path: Path) -> None:
    run(corpus_file, tmp_path, steps=8)
    before = model_hashes(tmp_path)
    path = checkpoint_dir(tmp_path) / "step_000002" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-4] + b"oops")
    with pytest.raises(CheckpointError, match="step_000002 and rerun") as raised:
        load_checkpoint(tmp_path, 2)
    target = Path(str(raised.value).split("delete ")[1].split(" and rerun")[0])
    for file in target.iterdir():
        file.unlink()
    target.rmdir()
    recorder = Recorder()
    run(corpus_file, tmp_path, steps=8, resume=True, callbacks=[recorder])
    assert recorder.steps == list(range(2, 9)) and recorder.checkpoints == [2, 4, 8]
    assert model_hashes(tmp_path) == before
