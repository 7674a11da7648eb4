"""One writer per run folder: a second writer is refused naming the holder; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.errors import FileFormatError, RunLockedError
from attnsens.store.lock import LOCK_NAME, read_holder, writer_lock

HOLD = (
    "import sys, time\n"
    "from attnsens.store.lock import writer_lock\n"
    "with writer_lock(sys.argv[1], command='study'):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(60)\n"
)


@pytest.fixture
def holder(tmp_path):
    """A process holding the lock of tmp_path/run (killed with SIGKILL at the end, or by the test)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout.readline().strip() == "held"
    yield process
    process.kill()
    process.wait()


def test_a_second_writer_is_refused_naming_the_holder(tmp_path, holder):
    with pytest.raises(RunLockedError) as refused, writer_lock(tmp_path / "run", command="audit"):
        pass
    message = str(refused.value)
    assert f"pid {holder.pid} on host {socket.gethostname()} (attnsens study" in message
    assert "choose another --out" in message
    assert read_holder(tmp_path / "run")["pid"] == holder.pid


def test_cli_writers_are_refused_in_one_line(tmp_path, holder):
    result = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "run"), "--steps", "1"])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1 and f"pid {holder.pid}" in result.output


def test_the_lock_of_a_killed_writer_is_taken_over_with_a_note(tmp_path, holder):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    notes: list[str] = []
    with writer_lock(tmp_path / "run", command="audit", note=notes.append):
        assert read_holder(tmp_path / "run")["pid"] == os.getpid()
    assert len(notes) == 1 and f"pid {holder.pid}" in notes[0] and "no longer running" in notes[0]
    assert read_holder(tmp_path / "run") is None  # released cleanly: nothing to take over next time
    with writer_lock(tmp_path / "run", command="audit", note=notes.append):
        pass
    assert len(notes) == 1


def test_taking_the_lock_removes_temporaries_of_dead_writers_only(tmp_path):
    run = tmp_path / "run"
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(finished.stdout)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / "rows" / "seed=0").mkdir(parents=True)
        stale = run / "rows" / "seed=0" / f".step=000001.parquet.{dead}.tmp"
        staging = run / "runs" / "seed=0" / "checkpoints" / ".step_000004.tmp"
        staged_manifest = run / "runs" / "seed=0" / "checkpoints" / ".manifest.json.tmp"
        live = run / f".report.html.{sleeper.pid}.tmp"
        staging.mkdir(parents=True)
        (staging / "model.safetensors").write_bytes(b"half")
        for path in (stale, staged_manifest, live):
            path.write_bytes(b"x")
        with writer_lock(run, command="study"):
            pass
        assert not stale.exists() and not staging.exists() and not staged_manifest.exists()
        assert live.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_lock_is_reentrant_within_a_process_and_records_the_holder(tmp_path):
    with writer_lock(tmp_path, command="study"):
        record = json.loads((tmp_path / LOCK_NAME).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert record["command"] == "study" and record["started_utc"]
        with writer_lock(tmp_path, command="train"):
            pass
        assert read_holder(tmp_path)["command"] == "study"
    started = time.perf_counter()
    with writer_lock(tmp_path, command="audit"):
        pass
    assert time.perf_counter() - started < 1


def _never(what: str):
    def fail(*args, **kwargs):
        pytest.fail(f"{what} ran before the lock refused the second writer")

    return fail


@pytest.mark.parametrize(
    "command",
    [
        ["audit", "minilm", "--corpus", "shakespeare", "--seq-len", "8"],
        ["train", "--steps", "1"],
        ["study", "--steps", "1", "--seeds", "0"],
    ],
)
def test_writers_are_refused_before_any_expensive_work(tmp_path, holder, monkeypatch, command):
    """The lock is taken before the model loads (audit) and before the corpus is read (train, study)."""
    monkeypatch.setattr("attnsens.cli.inputs.load_model", _never("the model load"))
    monkeypatch.setattr("attnsens.train.run.prepare_data", _never("the data preparation"))
    monkeypatch.setattr("attnsens.study.study.prepare_data", _never("the data preparation"))
    monkeypatch.setattr("attnsens.store.Manifest.open", _never("the manifest"))
    started = time.perf_counter()
    result = CliRunner().invoke(app, [*command, "--out", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1 and f"pid {holder.pid}" in result.output
    assert time.perf_counter() - started < 5
    assert read_holder(tmp_path / "run")["pid"] == holder.pid


def test_a_folder_the_lock_created_is_removed_when_nothing_was_written(tmp_path):
    with pytest.raises(RuntimeError), writer_lock(tmp_path / "new" / "run", command="audit"):
        raise RuntimeError("the input was refused")
    assert list(tmp_path.iterdir()) == []
    with writer_lock(tmp_path / "kept", command="audit"):
        (tmp_path / "kept" / "rows.parquet").write_bytes(b"x")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == [LOCK_NAME, "rows.parquet"]
    (tmp_path / "existing").mkdir()
    with writer_lock(tmp_path / "existing", command="audit"):
        pass
    assert (tmp_path / "existing").is_dir()  # not created by the lock: left alone


def test_a_lock_file_unlinked_while_it_was_taken_is_opened_again(tmp_path, monkeypatch):
    """A holder that removes its empty folder unlinks the lock file; a writer that opened the old file just
    before must not hold a lock on a file nobody else can see."""
    import attnsens.store.lock as lock

    real, calls = lock._acquire, []

    def unlink_first(handle, directory):
        calls.append(handle)
        if len(calls) == 1:
            (directory / LOCK_NAME).unlink()
        return real(handle, directory)

    monkeypatch.setattr(lock, "_acquire", unlink_first)
    with writer_lock(tmp_path / "run", command="audit"):
        assert len(calls) == 2 and read_holder(tmp_path / "run")["pid"] == os.getpid()


def _record(tmp_path, **fields) -> None:
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / LOCK_NAME).write_text(json.dumps({"command": "study", **fields}) + "\n")


def test_the_takeover_note_of_another_hosts_record_claims_nothing_about_that_process(tmp_path):
    import datetime as dt

    started = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=5, minutes=2)).isoformat(timespec="seconds")
    _record(tmp_path, pid=os.getppid(), host="elsewhere.example", started_utc=started)
    notes: list[str] = []
    with writer_lock(tmp_path / "run", command="audit", note=notes.append):
        pass
    assert len(notes) == 1, notes
    assert f"pid {os.getppid()} on host elsewhere.example" in notes[0] and "5 h ago" in notes[0]
    assert "no longer running" not in notes[0]
    assert "cannot see the processes of host elsewhere.example" in notes[0] and "if that one still runs" in notes[0]


def test_the_takeover_note_of_a_live_pid_on_this_host_says_it_holds_no_lock(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _record(tmp_path, pid=sleeper.pid, host=socket.gethostname(), started_utc="not a time")
        notes: list[str] = []
        with writer_lock(tmp_path / "run", command="audit", note=notes.append):
            pass
        assert len(notes) == 1 and f"pid {sleeper.pid}" in notes[0] and "no longer holds it" in notes[0], notes
        assert "no longer running" not in notes[0]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_lock_path_that_is_a_directory_is_named_without_disk_advice(tmp_path):
    (tmp_path / "run" / LOCK_NAME).mkdir(parents=True)
    (tmp_path / "run" / LOCK_NAME / "keep.txt").write_text("someone's")
    result = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "run"), "--steps", "1"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and f"{tmp_path / 'run' / LOCK_NAME} is a directory" in lines[0], result.output
    assert "space" not in lines[0] and "writable" not in lines[0]
    assert (tmp_path / "run" / LOCK_NAME / "keep.txt").read_text() == "someone's"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [LOCK_NAME]


def test_a_lock_path_that_is_a_link_is_never_followed(tmp_path):
    outside = tmp_path / "outside.txt"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK_NAME).symlink_to(outside)
    with pytest.raises(FileFormatError, match="is a symbolic link"), writer_lock(tmp_path / "run", command="audit"):
        pass
    assert not outside.exists()
    outside.write_text("precious\n")
    with pytest.raises(FileFormatError, match="is a symbolic link"), writer_lock(tmp_path / "run", command="audit"):
        pass
    assert outside.read_text() == "precious\n"


def test_a_manifest_lock_that_is_a_link_is_never_followed(tmp_path):
    from attnsens.store import Manifest

    outside = tmp_path / "outside.txt"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".manifest.lock").symlink_to(outside)
    with pytest.raises(FileFormatError, match=r"\.manifest\.lock is a symbolic link"):
        Manifest.open(tmp_path / "run", config={"a": 1})
    assert not outside.exists()
