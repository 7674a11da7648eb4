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
from attnsens.errors import RunLockedError
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
