"""Fault tests on real processes: kill -9 at random moments during train, study and audit, two writers on one
folder, a checkpoint deleted as the error advises, and a full or read-only output folder (a private tmpfs, mounted
in a user namespace, so that the test needs no root and a root test run still sees ENOSPC and EROFS).

Every rerun after a kill must end with exactly the units of an uninterrupted run: the same unit files, the same
values bit for bit on CPU (measured wall times aside), the same checkpoint weights, and no temporary files.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.store import sha256_file
from attnsens.store.lock import read_holder
from attnsens.store.verify import verify_run
from attnsens.train.checkpoint import model_hashes
from tests.unit.train.conftest import synthetic_text

REPO = Path(__file__).resolve().parents[2]
KINDS = ("train", "study", "audit")
TIMING_COLUMNS = {"wall_time_s"}


def _env() -> dict[str, str]:
    python_path = os.pathsep.join([str(REPO / "src"), str(REPO)])
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path, "HF_HUB_OFFLINE": "1"}


def start(kind: str, corpus: Path, out: Path) -> subprocess.Popen:
    """Start a fault_worker and wait for its ``ready``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.fault_worker", kind, str(corpus), str(out)],
        env=_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout.readline().strip() == "ready", process.stderr.read()
    return process


def finish(kind: str, corpus: Path, out: Path) -> str:
    """Run a worker to the end; return its stderr."""
    process = start(kind, corpus, out)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    return stderr


def contents(out: Path) -> dict[str, object]:
    """Every result of a run folder in comparable form: Parquet units without metadata or timings, the
    manifest's unit list, checkpoint weight hashes; and the temporary files, which must be none."""
    found: dict[str, object] = {}
    for path in sorted(out.rglob("*.parquet")):
        table = pq.read_table(path).replace_schema_metadata(None)
        found[path.relative_to(out).as_posix()] = table.drop_columns(
            [c for c in table.column_names if c in TIMING_COLUMNS]
        )
    for manifest in sorted(out.rglob("checkpoints/manifest.json")):
        found[manifest.parent.relative_to(out).as_posix()] = model_hashes(manifest.parent.parent)
    if (out / "manifest.json").exists():
        found["units"] = sorted(json.loads((out / "manifest.json").read_text())["units"])
    found["temporaries"] = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.tmp"))
    return found


def assert_same(resumed: dict[str, object], reference: dict[str, object]) -> None:
    assert resumed.keys() == reference.keys()
    for key, value in reference.items():
        other = resumed[key]
        assert other.equals(value) if hasattr(value, "equals") else other == value, key
    assert resumed["temporaries"] == []


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fault_corpus") / "verse.txt"
    path.write_text(synthetic_text(6000))
    return path


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The folder of each kind run once without interruption."""
    runs = {}
    for kind in KINDS:
        runs[kind] = tmp_path_factory.mktemp(f"reference_{kind}") / "out"
        finish(kind, corpus, runs[kind])
    return runs


def progress(out: Path) -> int:
    """Finished pieces of work in a run folder: Parquet units and checkpoint directories."""
    if not out.exists():
        return 0
    try:
        units = [p for p in out.rglob("*.parquet") if not p.name.startswith(".")]
        return len(units) + sum(1 for p in out.rglob("step_*") if p.is_dir())
    except FileNotFoundError:  # a staging directory renamed while we looked: count again next time
        return -1


def kill_and_resume(kind: str, rng: random.Random, corpus: Path, out: Path, reference: dict) -> bool:
    """Kill a writer with SIGKILL a random moment after its k-th finished piece of work (k random), rerun it,
    and compare with the uninterrupted run. Returns whether the kill landed before the writer finished."""
    reference_dir = reference[kind]
    wanted = rng.randrange(0, progress(reference_dir) - 1)
    process = start(kind, corpus, out)
    deadline = time.perf_counter() + 300
    while progress(out) < wanted and process.poll() is None:
        assert time.perf_counter() < deadline, f"{kind} made no progress"
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.2))
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    killed = process.returncode == -signal.SIGKILL
    assert killed or process.returncode == 0
    held = read_holder(out) if out.exists() else None
    stderr = finish(kind, corpus, out)
    if killed and held is not None:
        assert f"pid {process.pid}" in stderr and "no longer running" in stderr
    assert_same(contents(out), contents(reference_dir))
    assert verify_run(out).ok or not (out / "manifest.json").exists()
    return killed


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_writer_resumes_to_the_uninterrupted_result(kind, corpus, tmp_path, reference) -> None:
    assert kill_and_resume(kind, random.Random(f"kill-{kind}"), corpus, tmp_path / "out", reference)


def test_a_study_killed_during_its_audits_gives_bit_identical_bounds(corpus, tmp_path, reference) -> None:
    """The resumed process audits with a different history of torch's global generator than the uninterrupted
    one; the bounds estimates must not notice (they draw from generators keyed by run, seed, step and layer)."""
    out = tmp_path / "out"
    process = start("study", corpus, out)
    deadline = time.perf_counter() + 300
    while not (out / "bounds" / "placement=pre" / "seed=0" / "step=000001.parquet").exists():
        assert time.perf_counter() < deadline and process.poll() is None, "the study never reached its audits"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert not (out / "bounds" / "placement=pre" / "seed=1" / "step=000004.parquet").exists()
    finish("study", corpus, out)
    resumed, uninterrupted = contents(out), contents(reference["study"])
    assert resumed["bounds/placement=pre/seed=1/step=000004.parquet"].equals(
        uninterrupted["bounds/placement=pre/seed=1/step=000004.parquet"]
    )
    assert_same(resumed, uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("moment", range(8))
def test_kill_sweep(kind, moment, corpus, tmp_path, reference) -> None:
    kill_and_resume(kind, random.Random(f"sweep-{kind}-{moment}"), corpus, tmp_path / "out", reference)


def test_a_second_writer_is_refused_while_the_first_runs(corpus, tmp_path, reference) -> None:
    out = tmp_path / "out"
    first = start("study", corpus, out)
    try:
        deadline = time.perf_counter() + 60
        while read_holder(out) is None:
            assert time.perf_counter() < deadline and first.poll() is None, "the study never took its lock"
            time.sleep(0.05)
        for command in (["study"], ["train"], ["audit", "minilm", "--seq-len", "8", "--corpus", "shakespeare"]):
            result = CliRunner().invoke(app, [*command, "--out", str(out)])
            assert result.exit_code == 1, result.output
            assert len(result.output.strip().splitlines()) == 1
            assert (
                f"is being written by pid {first.pid} on host" in result.output and "(attnsens study" in result.output
            )
        readers = CliRunner().invoke(app, ["verify", str(out)])
        assert "is being written" not in readers.output  # readers never need the lock
    finally:
        _, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr[-3000:]
    assert_same(contents(out), contents(reference["study"]))


def test_a_checkpoint_deleted_as_advised_is_rebuilt_with_its_rows(corpus, tmp_path, reference) -> None:
    out = shutil.copytree(reference["study"], tmp_path / "out")
    weights = out / "runs" / "placement=pre" / "seed=1" / "checkpoints" / "step_000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-2] + b"!!")
    (out / "rows" / "placement=pre" / "seed=1" / "step=000002.parquet").unlink()
    from attnsens.errors import CheckpointError
    from attnsens.study.study import run_study
    from tests.helpers.study import micro_study

    with pytest.raises(CheckpointError, match="corrupted") as raised:
        run_study(micro_study(corpus), out, device="cpu")
    advice = str(raised.value)
    assert "delete " in advice and "rerun" in advice
    shutil.rmtree(advice.split("delete ")[1].split(" and rerun")[0])
    finish("study", corpus, out)
    assert_same(contents(out), contents(reference["study"]))


@pytest.mark.parametrize(("value", "counts"), [(float("nan"), "1 NaN and 0 ±Inf"), (float("inf"), "0 NaN and 1 ±Inf")])
def test_a_checkpoint_with_a_non_finite_weight_is_named_by_layer_and_parameter_and_nothing_is_written(
    corpus, tmp_path, reference, value, counts
) -> None:
    """The file was rewritten with its manifest hash, so only the check before the forward can catch it."""
    from safetensors.torch import load_file, save_file

    from attnsens.errors import InputError
    from attnsens.study.study import run_study
    from tests.helpers.study import micro_study

    out = shutil.copytree(reference["study"], tmp_path / "out")
    checkpoint = out / "runs/placement=pre/seed=1/checkpoints/step_000002"
    weights = load_file(checkpoint / "model.safetensors")
    weights["blocks.1.mlp.c_proj.weight"][0, 0] = value
    save_file(weights, checkpoint / "model.safetensors")
    registered = json.loads((checkpoint.parent / "manifest.json").read_text())
    registered["step_000002"]["files"]["model.safetensors"] = sha256_file(checkpoint / "model.safetensors")
    (checkpoint.parent / "manifest.json").write_text(json.dumps(registered))
    units = [f"{table}/placement=pre/seed=1/step=000002.parquet" for table in ("rows", "summary", "bounds")]
    for unit in units:
        (out / unit).unlink()
    with pytest.raises(InputError) as raised:
        run_study(micro_study(corpus), out, device="cpu")
    assert str(raised.value).startswith(
        f"checkpoint {checkpoint} has non-finite weights: layer 1, parameter 'blocks.1.mlp.c_proj.weight' "
    )
    assert f"{counts} values; if the file was altered, delete {checkpoint} and rerun" in str(raised.value)
    assert not any((out / unit).exists() for unit in units)


CLI_STUDY = ("study", "--config", "tiny", "--seeds", "0,1", "--steps", "2", "--batch-size", "2", "--threads", "1")


def attnsens(*arguments: str) -> subprocess.CompletedProcess:
    """Run ``python -m attnsens ARGUMENTS`` (as ``attnsens`` would run) and return what it printed."""
    command = [sys.executable, "-m", "attnsens", *arguments]
    return subprocess.run(command, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def cli_study(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny study written by the command line (its manifest records the command that a fix reruns)."""
    out = tmp_path_factory.mktemp("cli_study") / "out"
    done = attnsens(*CLI_STUDY, "--data", str(corpus), "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_the_printed_advice_followed_literally_rebuilds_a_moved_unit_and_a_copied_checkpoint(cli_study, tmp_path):
    """Two faults whose recorded sha256 were edited to match, so that only the contents give them away: step 1's
    rows moved into step 2's place, and seed 0's checkpoint 1 copied over its checkpoint 2 (``cp -r``)."""
    out = shutil.copytree(cli_study, tmp_path / "out")
    manifest = json.loads((out / "manifest.json").read_text())
    moved = "rows/placement=pre/seed=1/step=000002.parquet"
    (out / "rows/placement=pre/seed=1/step=000001.parquet").replace(out / moved)
    manifest["units"][moved]["sha256"] = sha256_file(out / moved)
    (out / "manifest.json").write_text(json.dumps(manifest))
    checkpoints = out / "runs/placement=pre/seed=0/checkpoints"
    shutil.rmtree(checkpoints / "step_000002")
    shutil.copytree(checkpoints / "step_000001", checkpoints / "step_000002")
    registered = json.loads((checkpoints / "manifest.json").read_text())
    registered["step_000002"]["files"] = registered["step_000001"]["files"]
    (checkpoints / "manifest.json").write_text(json.dumps(registered))

    refused = one_error_line(attnsens("report", str(out)))
    assert f"{moved} (holds step 1, its path says 2)" in refused and "1 missing" in refused
    rebuild = shlex.split(refused.split("rebuild with `")[1].split("`")[0])
    assert rebuild[0] == "attnsens" and rebuild[-2:] == ["--out", str(out)]
    first = attnsens(*rebuild[1:])
    assert f"rebuilding {moved} (holds step 1, its path says 2)" in first.stdout
    stopped = one_error_line(first)
    assert f"step_000002 is a copy of step_000001; delete {checkpoints / 'step_000002'} and rerun" in stopped
    shutil.rmtree(stopped.split("; delete ")[1].split(" and rerun")[0])
    rerun = attnsens(*rebuild[1:])
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert verify_run(out, rehash=True).ok
    assert_same(contents(out), contents(cli_study))


def test_a_full_or_read_only_folder_is_named_and_left_as_it_was(corpus, tmp_path) -> None:
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    script = 'mount -t tmpfs -o size=1m tmpfs "$1" && exec "$2" -m tests.integration.disk_worker "$1" "$3" "$4"'
    command = ["unshare", "-Urm", "sh", "-c", script, "_", str(mount), sys.executable, str(corpus), str(tmp_path)]
    try:
        done = subprocess.run(command, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        pytest.skip("unshare is not installed: a private tmpfs cannot be mounted here")
    if done.returncode != 0 and "mount" in done.stderr and "disk_worker" not in done.stderr:
        pytest.skip(f"cannot mount a private tmpfs here ({done.stderr.strip()[:200]})")
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "cannot write b.parquet in" in seen["unit_error"] and "No space left on device" in seen["unit_error"]
    assert seen["unit_folder_unchanged"]
    assert "cannot write step_" in seen["train_error"] and "/train/checkpoints'" in seen["train_error"]
    assert seen["checkpoints"] and seen["checkpoints_verify"] and seen["temporaries"] == []
    code, lines, exists = seen["audit_full"]  # not even the lock's record fits: refused before any work
    assert code == 1 and len(lines) == 1 and "cannot write .writer.lock in" in lines[0] and "/small/audit'" in lines[0]
    assert "No space left on device" in lines[0] and not exists
    code, lines = seen["audit_midway"]  # some sequences written, then the disk filled up
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: cannot write ") and "/small/audit" in lines[0]
    ok, verified, temporaries = seen["audit_left"]
    assert ok and verified > 0 and temporaries == []  # every file left is a recorded, intact unit
    code, lines = seen["study_midway"]
    assert code == 1 and lines[-1].startswith("error: cannot write step_000000 in ") and "Traceback" not in str(lines)
    ok, verified, left = seen["study_left"]
    assert ok and verified == 1 and not any(name.startswith("runs") or name.endswith(".tmp") for name in left)
    (train, report, report_elsewhere, query) = seen["read_only"]
    assert train[0] == 1 and len(train[1]) == 1 and "Read-only file system" in train[1][0] and "/ro'" in train[1][0]
    assert report[0] == 1 and len(report[1]) == 1 and "cannot write report.html" in report[1][0]
    assert report_elsewhere[0] == 0 and (tmp_path / "report.html").is_file()
    assert query == [0, ["n", "10"]]
    assert seen["read_only_unchanged"]
