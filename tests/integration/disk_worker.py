"""Writes into a small or read-only tmpfs at ``ROOT`` and prints what it saw as JSON (run by test_faults.py
inside ``unshare -Urm``, whose private mount namespace lets an unprivileged user mount that tmpfs)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch


def snapshot(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def training(n: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    return {
        "run_id": ["r"] * n, "seed": np.zeros(n, dtype=np.int64), "step": np.arange(n), "loss": rng.random(n),
        "lr": rng.random(n), "grad_norm_global": rng.random(n), "tokens_seen": np.arange(n),
        "wall_time_s": rng.random(n),
    }  # fmt: skip


def fill(path: Path, *, leave: int = 0) -> None:
    """Write ``path`` until the file system is full, then give back ``leave`` bytes (about)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(descriptor, b"\0" * 4096):
            pass
    except OSError:
        pass
    os.ftruncate(descriptor, max(0, os.fstat(descriptor).st_size - leave))
    os.close(descriptor)


def invoke(command: list[str]) -> list[object]:
    """Exit code and printed lines of an in-process attnsens command."""
    from typer.testing import CliRunner

    from attnsens.cli import app

    result = CliRunner().invoke(app, command)
    return [result.exit_code, result.output.strip().splitlines()]


def command_line_writers(model: Path, corpus: Path, small: Path) -> dict[str, object]:
    """``audit`` and ``study`` on a full and a nearly full 512 KiB tmpfs: what they printed, and whether what they
    left verifies (every file recorded and intact, no temporary file)."""
    from attnsens.store.verify import verify_run

    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(small)], check=True)
    seen: dict[str, object] = {}
    fill(small / "filler")
    audit = ["audit", str(model), "--text", str(corpus), "--seq-len", "16", "--json", "--out", str(small / "audit")]
    seen["audit_full"] = [*invoke(audit), (small / "audit").exists()]
    fill(small / "filler", leave=120_000)
    seen["audit_midway"] = invoke([*audit, "--batch", "300"])
    check = verify_run(small / "audit", rehash=True)
    seen["audit_left"] = [check.ok, check.verified, [p.name for p in small.rglob("*.tmp")]]
    shutil.rmtree(small / "audit")
    (small / "filler").unlink()
    study = ["study", "--config", "tiny", "--seeds", "0", "--steps", "2", "--batch-size", "2", "--no-bounds"]
    seen["study_midway"] = invoke([*study, "--data", str(corpus), "--threads", "1", "--out", str(small / "study")])
    check = verify_run(small / "study", rehash=True)
    left = sorted(p.relative_to(small / "study").as_posix() for p in (small / "study").rglob("*"))
    seen["study_left"] = [check.ok, check.verified, left]
    subprocess.run(["umount", str(small)], check=True)
    return seen


def main(root: Path, corpus: Path) -> None:
    from typer.testing import CliRunner

    from attnsens.cli import app
    from attnsens.errors import OutputWriteError
    from attnsens.store import Manifest
    from attnsens.train.checkpoint import saved_steps, verify_checkpoint
    from attnsens.train.data import DataConfig
    from attnsens.train.run import train
    from attnsens.train.trainer import TrainConfig
    from tests.unit.train.conftest import micro_model_config

    torch.set_num_threads(1)
    seen: dict[str, object] = {}
    manifest = Manifest.open(root / "units", config={"a": 1})
    manifest.write_unit("training/a.parquet", training(10), schema="training")
    before = snapshot(root)
    try:
        manifest.write_unit("training/b.parquet", training(400_000), schema="training")
    except OutputWriteError as err:
        seen["unit_error"] = str(err)
    seen["unit_folder_unchanged"] = snapshot(root) == before

    try:
        train(
            micro_model_config(vocab_size=300, d_model=64, d_ff=128),
            TrainConfig(steps=64, batch_size=4, lr=3e-3, warmup_steps=3, seed=7),
            DataConfig(source=str(corpus), vocab_size=300, block_size=16, eval_sequences=3),
            root / "train", device="cpu",
        )  # fmt: skip
    except OutputWriteError as err:
        seen["train_error"] = str(err)
    steps = saved_steps(root / "train")
    seen["checkpoints"] = steps
    seen["checkpoints_verify"] = all(verify_checkpoint(root / "train", s) for s in steps)
    seen["temporaries"] = [p.name for p in root.rglob("*.tmp")]
    seen.update(command_line_writers(root / "train", corpus, Path(sys.argv[3]) / "small"))

    subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
    before = snapshot(root)
    elsewhere = Path(sys.argv[3]) / "report.html"
    for command in (
        ["train", "--out", str(root / "ro"), "--steps", "1"],
        ["report", str(root / "units")],
        ["report", str(root / "units"), "--out", str(elsewhere)],
        ["query", str(root / "units"), "SELECT count(*) AS n FROM training", "--csv"],
    ):
        result = CliRunner().invoke(app, command)
        seen.setdefault("read_only", []).append([result.exit_code, result.output.strip().splitlines()])
    seen["read_only_unchanged"] = snapshot(root) == before
    print(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))  # argv[3]: a writable folder outside the tmpfs
