"""SIGINT and SIGTERM end a long command with one line saying how to resume it, and the rerun resumes."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnsens.cli.interrupt import chosen_out, rerun_bounds, rerun_to_resume, rerun_training
from attnsens.store.lock import read_holder
from attnsens.store.verify import verify_run
from attnsens.train.checkpoint import saved_steps

REPO = Path(__file__).resolve().parents[3]


def _attnsens(*arguments: str) -> subprocess.Popen:
    env = {
        **os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]), "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }  # fmt: skip
    command = [sys.executable, "-m", "attnsens", *arguments]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_by_default
    )


def _sigint_by_default() -> None:
    """In the child, before it starts: SIGINT delivered as a terminal's Ctrl-C delivers it. A test run started in
    the background of a non-interactive shell (``make test &``) ignores SIGINT, a child inherits that, and Python
    then leaves it ignored, as a command run in the background should."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _train(out: Path) -> subprocess.Popen:
    return _attnsens("train", "--out", str(out), "--steps", "100000")


def _wait_for_checkpoint(process: subprocess.Popen, out: Path) -> None:
    deadline = time.monotonic() + 240
    while not saved_steps(out):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.2)


def test_sigterm_then_sigint_each_print_one_line_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "run"
    process = _train(out)
    _wait_for_checkpoint(process, out)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted: SIGTERM; rerun the command with --resume to continue from the last checkpoint in {out}"
    )
    assert read_holder(out) is None  # the lock was released on the way out
    assert not list(out.rglob("*.tmp"))
    kept = saved_steps(out)
    assert 0 in kept
    check = verify_run(out)  # what is there verifies; verify names what the interrupted run lacks
    assert check.ok and not check.complete and check.writer is None
    assert "training.parquet" in check.absent and "checkpoints/step_100000" in check.absent
    advice = check.incompleteness().split("finish it with `")[1].split("`")[0]
    assert advice == shlex.join(["attnsens", "train", "--out", str(out), "--steps", "100000", "--resume"])

    process = _attnsens(*shlex.split(advice)[1:])  # verify's advice, followed
    deadline = time.monotonic() + 240
    while saved_steps(out) == kept:  # a new checkpoint: it went on from where it stopped
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGINT, stderr[-2000:]
    assert "Traceback" not in stderr and "Aborted" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted: SIGINT; rerun the same command to resume from the last checkpoint in {out}"
    )
    assert read_holder(out) is None and not list(out.rglob("*.tmp"))
    assert set(kept) < set(saved_steps(out))


@pytest.mark.parametrize(
    ("advice", "arguments", "chosen", "expected"),
    [
        (rerun_to_resume, {"out": Path("r")}, None, "what was finished is kept in r; rerun the same command to resume"),
        (rerun_to_resume, {"out": None}, Path("runs/a"), "rerun the command with --out runs/a to resume"),
        (rerun_training, {"out": Path("r"), "resume": False}, None, "rerun the command with --resume to continue"),
        (rerun_bounds, {"out": Path("r")}, None, "nothing was written to --out; rerun the same command"),
    ],
)
def test_the_advice_names_how_to_rerun(advice, arguments, chosen, expected):
    token = chosen_out.set(chosen)
    try:
        assert expected in advice(arguments)
    finally:
        chosen_out.reset(token)
