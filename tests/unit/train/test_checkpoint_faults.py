"""Malformed checkpoint manifests and unreadable files are named with a fix; following the fix rebuilds."""

from __future__ import annotations

import json
import shutil
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
    verify_checkpoint,
)
from tests.helpers.checkpoint import trained_pair
from tests.helpers.trainer import Recorder, run


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


def _copy_over(saved: Path, source: str, target: str) -> Path:
    """``rm -r target && cp -r source target``, and the manifest entry's hashes copied along, so that every sha256
    check passes."""
    root = checkpoint_dir(saved)
    shutil.rmtree(root / target)
    shutil.copytree(root / source, root / target)
    _edit_manifest(saved, lambda m: {**m, target: {**m[target], "files": m[source]["files"]}})
    return root / target


@pytest.mark.parametrize(("source", "target"), [("step_000002", "step_000004"), ("step_000004", "step_000002")])
def test_a_checkpoint_copied_over_another_with_its_hashes_is_named_as_the_copy(saved, source, target) -> None:
    copy = _copy_over(saved, source, target)
    for step in (2, 4, 8):  # whichever checkpoint is loaded, the copy is the one named
        with pytest.raises(CheckpointError, match=f"{target} is a copy of {source}; delete {copy} and rerun"):
            load_checkpoint(saved, step)


def test_a_checkpoint_whose_state_names_another_step_or_seed_is_refused(tmp_path: Path) -> None:
    model, optimizer = trained_pair()
    for step, distinct in ((1, 0.0), (2, 1.0)):
        next(model.parameters()).data += distinct
        save_checkpoint(tmp_path, step, model_state=model.state_dict(), optimizer=optimizer,
                        state={"train_config": {"seed": 5}})  # fmt: skip
    assert verify_checkpoint(tmp_path, 2, seed=5) == checkpoint_dir(tmp_path) / "step_000002"
    with pytest.raises(CheckpointError, match=r"step_000002 holds seed 5, not step 2 of seed 6 \(a copy of another"):
        verify_checkpoint(tmp_path, 2, seed=6)
    state = checkpoint_dir(tmp_path) / "step_000002" / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "step": 1}))
    _edit_manifest(tmp_path, lambda m: {**m, "step_000002": {"step": 2, "files": {
        **m["step_000002"]["files"], "state.json": sha256_file(state)}}})  # fmt: skip
    with pytest.raises(CheckpointError, match=r"step_000002 holds step 1, not step 2 .*delete .*step_000002 and rerun"):
        load_checkpoint(tmp_path, 2)


def test_deleting_a_copied_checkpoint_as_advised_rebuilds_it_bit_identically(corpus_file: Path, tmp_path: Path):
    run(corpus_file, tmp_path, steps=8)
    before = model_hashes(tmp_path)
    _copy_over(tmp_path, "step_000002", "step_000004")
    with pytest.raises(CheckpointError, match="step_000004 is a copy of step_000002") as raised:
        load_checkpoint(tmp_path, 8)
    shutil.rmtree(str(raised.value).split("; delete ")[1].split(" and rerun")[0])
    recorder = Recorder()
    run(corpus_file, tmp_path, steps=8, resume=True, callbacks=[recorder])
    assert recorder.steps == list(range(3, 9)) and recorder.checkpoints == [4, 8]
    assert model_hashes(tmp_path) == before
