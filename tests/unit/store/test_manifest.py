"""Run manifest: resume skips finished units, redoes missing or corrupted ones, refuses a changed config."""

from __future__ import annotations

import json

import pytest

from attnsens.errors import CheckpointError, ConfigError
from attnsens.store import Manifest, read_metadata, read_table

_TRAINING = {
    "run_id": ["r"],
    "seed": [0],
    "step": [0],
    "loss": [1.0],
    "lr": [0.1],
    "grad_norm_global": [1.0],
    "tokens_seen": [1],
    "wall_time_s": [0.0],
}


def _run(manifest: Manifest, units: list[str], calls: list[str], *, fail_at: str | None = None) -> None:
    for unit in manifest.pending(units):
        if unit == fail_at:
            raise KeyboardInterrupt
        calls.append(unit)
        manifest.write_unit(unit, _TRAINING, schema="training")


def test_interrupted_run_resumes_without_duplicates(tmp_path):
    units = [f"training/step={s}.parquet" for s in range(5)]
    calls: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _run(Manifest.open(tmp_path, config={"lr": 0.1}), units, calls, fail_at=units[3])
    assert calls == units[:3]

    calls.clear()
    _run(Manifest.open(tmp_path, config={"lr": 0.1}), units, calls)
    assert calls == units[3:]
    assert len(read_table(tmp_path / "training")) == 5
    Manifest.load(tmp_path).verify()


def test_corrupted_or_missing_unit_is_redone_and_reported(tmp_path):
    manifest = Manifest.open(tmp_path, config={})
    units = ["training/a.parquet", "training/b.parquet"]
    _run(manifest, units, [])
    (tmp_path / units[0]).write_bytes(b"garbage")
    (tmp_path / units[1]).unlink()
    with pytest.raises(CheckpointError, match="2 recorded file"):
        manifest.verify()
    assert manifest.pending(units) == units


def test_unrecorded_file_is_not_done(tmp_path):
    manifest = Manifest.open(tmp_path)
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "a.parquet").write_bytes(b"half written by an old version")
    assert not manifest.is_done("training/a.parquet")


def test_manifest_records_provenance_and_hashes(tmp_path):
    manifest = Manifest.open(tmp_path, config={"seeds": [0, 1]})
    manifest.write_unit("training/a.parquet", _TRAINING, schema="training")
    payload = json.loads((tmp_path / "manifest.json").read_text())
    assert payload["config"] == {"seeds": [0, 1]}
    assert payload["provenance"]["versions"]["pyarrow"]
    entry = payload["units"]["training/a.parquet"]
    assert entry["table"] == "training" and entry["num_rows"] == 1 and len(entry["sha256"]) == 64
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_changed_config_is_refused(tmp_path):
    Manifest.open(tmp_path, config={"lr": 0.1, "seeds": [0]})
    with pytest.raises(ConfigError, match=r"\['lr'\]"):
        Manifest.open(tmp_path, config={"lr": 0.2, "seeds": [0]})


def test_growable_lists_extend_a_run_and_nothing_else_does(tmp_path):
    Manifest.open(tmp_path, config={"lr": 0.1, "seeds": [0]}).write_unit("training/a.parquet", _TRAINING,
                                                                         schema="training")  # fmt: skip
    with pytest.raises(ConfigError, match=r"\['seeds'\]"):
        Manifest.open(tmp_path, config={"lr": 0.1, "seeds": [0, 1]})  # growing is opt-in per key
    grown = Manifest.open(tmp_path, config={"lr": 0.1, "seeds": [0, 1]}, growable=("seeds",))
    assert grown.config["seeds"] == [0, 1] and grown.is_done("training/a.parquet")
    assert Manifest.load(tmp_path).config == {"lr": 0.1, "seeds": [0, 1]}
    for shrunk in ([1], [1, 2]):
        with pytest.raises(ConfigError, match=r"can only grow: give every recorded item again \(seeds \[0, 1\]\)"):
            Manifest.open(tmp_path, config={"lr": 0.1, "seeds": shrunk}, growable=("seeds",))
    with pytest.raises(ConfigError, match=r"\['lr', 'seeds'\] differ\); use a new output directory"):
        Manifest.open(tmp_path, config={"lr": 0.2, "seeds": [0, 1, 2]}, growable=("seeds",))
    with pytest.raises(ConfigError, match="can only grow"):
        Manifest.open(tmp_path, config={"lr": 0.1, "seeds": 7}, growable=("seeds",))  # not a list
    assert Manifest.load(tmp_path).config == {"lr": 0.1, "seeds": [0, 1]}


def test_first_config_is_adopted_by_a_directory_opened_without_one(tmp_path):
    Manifest.open(tmp_path).write_unit("training/a.parquet", _TRAINING, schema="training")
    assert Manifest.open(tmp_path, config={"lr": 0.1}).config == {"lr": 0.1}
    with pytest.raises(ConfigError):
        Manifest.open(tmp_path, config={"lr": 0.2})


def test_scopes_keep_their_own_configs(tmp_path):
    run = Manifest.open(tmp_path, config={"study": "tiny"})
    first = Manifest.open(tmp_path, config={"step": 100}, scope="audit/step=000100")
    second = Manifest.open(tmp_path, config={"step": 200}, scope="audit/step=000200")
    first.write_unit("rows/step=000100.parquet", _TRAINING, schema="training")
    assert read_metadata(tmp_path / "rows/step=000100.parquet")["metadata"]["config"] == {"step": 100}
    assert second.config == {"step": 200} and run.config == {"study": "tiny"}
    assert Manifest.open(tmp_path, config={"step": 100}, scope="audit/step=000100").config == {"step": 100}
    with pytest.raises(ConfigError, match="scope 'audit/step=000100'"):
        Manifest.open(tmp_path, config={"step": 999}, scope="audit/step=000100")
    assert Manifest.load(tmp_path).config == {"study": "tiny"}


def test_two_handles_merge_their_records(tmp_path):
    first, second = Manifest.open(tmp_path), Manifest.open(tmp_path)
    first.write_unit("training/a.parquet", _TRAINING, schema="training")
    second.write_unit("training/b.parquet", _TRAINING, schema="training")
    assert set(Manifest.load(tmp_path).units) == {"training/a.parquet", "training/b.parquet"}


def test_units_must_stay_inside_the_run(tmp_path):
    with pytest.raises(ValueError, match="leaves the run directory"):
        Manifest.open(tmp_path).is_done("../x.parquet")


def _snapshot(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("replacing", [False, True])
def test_a_unit_whose_manifest_entry_cannot_be_written_leaves_the_folder_as_before(tmp_path, monkeypatch, replacing):
    """The Parquet file fitted on the disk, the manifest did not: the file is taken back out (or the file it
    replaced is put back), so no unrecorded file is left for a reader to trip over."""
    import errno

    from attnsens.errors import OutputWriteError
    from attnsens.store import manifest as manifest_module
    from attnsens.store.parquet import output_write_error

    manifest = Manifest.open(tmp_path, config={"lr": 0.1})
    manifest.write_unit("training/a.parquet", _TRAINING, schema="training")
    if replacing:  # a unit being recomputed: its old file is on disk, no longer recorded
        manifest.forget("training/a.parquet")
    before = _snapshot(tmp_path)
    real_store = manifest_module._store

    def full(path, payload):
        if path.name == "manifest.json":
            full_disk = OSError(errno.ENOSPC, "No space left on device")
            raise output_write_error(path, full_disk)
        real_store(path, payload)

    monkeypatch.setattr(manifest_module, "_store", full)
    changed = {**_TRAINING, "loss": [2.0]}
    with pytest.raises(OutputWriteError, match=r"cannot write manifest\.json in .*No space left on device"):
        manifest.write_unit("training/a.parquet" if replacing else "training/b.parquet", changed, schema="training")
    assert _snapshot(tmp_path) == before


def test_a_unit_written_in_parts_is_recorded_only_when_complete(tmp_path):
    manifest = Manifest.open(tmp_path, config={"lr": 0.1})
    with pytest.raises(KeyboardInterrupt), manifest.unit_parts("training/a.parquet", schema="training") as write:
        write(_TRAINING)
        raise KeyboardInterrupt
    assert not manifest.is_done("training/a.parquet") and not (tmp_path / "training/a.parquet").exists()
    with manifest.unit_parts("training/a.parquet", schema="training") as write:
        write(_TRAINING)
        write({**_TRAINING, "step": [1]})
    assert manifest.is_done("training/a.parquet")
    assert manifest.units["training/a.parquet"]["num_rows"] == 2
    assert read_table(tmp_path / "training/a.parquet")["step"].tolist() == [0, 1]
    assert read_metadata(tmp_path / "training/a.parquet")["metadata"]["config"] == {"lr": 0.1}
