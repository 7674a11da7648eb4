"""``attnsens audit`` under torchrun: two gloo ranks share the sequences out, each records its own units in the one
manifest, and the run folder equals the single-process audit row for row; a rank killed with SIGKILL leaves units a
rerun redoes, without duplicates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from attnsens.store import read_table
from attnsens.store.schema import ROWS
from tests.integration.launch import REPO

AUDIT = ["-m", "attnsens", "audit", "builtin:lnfree", "--seq-len", "64", "--json"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}


def _run(command: list[str], timeout: float = 240) -> None:
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def _tables(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows = read_table(out / "rows").sort_values(list(ROWS.key), ignore_index=True)
    summary = read_table(out / "summary").sort_values(["layer", "head"], ignore_index=True)
    return rows, summary


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int | None:
    """The pid of the worker process of ``rank`` below the torchrun launcher (read from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        parent = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), -1)
        if f"RANK={rank}".encode() in environ and b"LOCAL_RANK=" + str(rank).encode() in environ and parent != 0:
            if parent == launcher.pid or _ancestor(parent, launcher.pid):
                return int(entry.name)
    return None


def _ancestor(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            status = (Path("/proc") / str(pid) / "status").read_text()
        except OSError:
            return False
        pid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), 0)
    return False


def _recorded(out: Path) -> list[str]:
    try:
        units = json.loads((out / "manifest.json").read_text()).get("units", {})
    except (OSError, ValueError):
        return []
    return [unit for unit in units if unit.startswith("rows/")]


def test_two_ranks_audit_the_single_process_rows_and_a_killed_rank_is_redone(tmp_path: Path) -> None:
    single, shared, killed = tmp_path / "single", tmp_path / "shared", tmp_path / "killed"
    _run([sys.executable, *AUDIT, "--batch", "6", "--out", str(single)])
    _run([*TORCHRUN, *AUDIT, "--batch", "6", "--out", str(shared)])
    expected_rows, expected_summary = _tables(single)
    rows, summary = _tables(shared)
    pd.testing.assert_frame_equal(rows, expected_rows, check_exact=True)
    pd.testing.assert_frame_equal(summary, expected_summary, check_exact=True)
    assert len(_recorded(shared)) == 6

    # Kill rank 1 (SIGKILL) once some unit is recorded; torchrun then ends the other rank too.
    many = ["--batch", "24", "--seq-len", "128"]
    launcher = subprocess.Popen(
        [*TORCHRUN, *AUDIT, *many, "--out", str(killed)],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _recorded(killed) and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.05)
        victim = _rank_pid(launcher, 1)
        assert victim is not None and launcher.poll() is None, "rank 1 finished before it could be killed"
        os.kill(victim, signal.SIGKILL)
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode != 0 and len(_recorded(killed)) < 24
    _run([*TORCHRUN, *AUDIT, *many, "--out", str(killed)])
    _run([sys.executable, *AUDIT, *many, "--out", str(single / "again")])
    rows, summary = _tables(killed)
    expected_rows, expected_summary = _tables(single / "again")
    assert not rows.duplicated(list(ROWS.key)).any()
    pd.testing.assert_frame_equal(rows, expected_rows, check_exact=True)
    pd.testing.assert_frame_equal(summary, expected_summary, check_exact=True)


def test_each_rank_takes_one_contiguous_block_and_an_in_memory_audit_is_not_shared(monkeypatch) -> None:
    import attnsens
    from attnsens.study import auditing

    blocks = [auditing.rank_share(10, rank, 4) for rank in range(4)]
    assert [list(block) for block in blocks] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert list(auditing.rank_share(1, 1, 2)) == []
    alone = attnsens.study.audit("builtin:lnfree", "some text to audit, twice over", seq_len=8, note=lambda _: None)
    monkeypatch.setattr(auditing, "ranks", lambda: (1, 2))  # rank 1 of 2: in memory it audits all it is given
    shared = attnsens.study.audit("builtin:lnfree", "some text to audit, twice over", seq_len=8, note=lambda _: None)
    assert shared.n_rows == alone.n_rows and shared.rows.equals(alone.rows)


def test_two_ranks_share_the_layers_of_the_bounds_and_give_the_single_process_table(tmp_path: Path) -> None:
    bounds = ["-m", "attnsens", "bounds", "builtin:lnfree", "--seq-len", "16", "--json"]
    tables = []
    for launcher, out in (([sys.executable], "single"), (TORCHRUN, "shared")):
        done = subprocess.run(
            [*launcher, *bounds, "--out", str(tmp_path / out)], env=_env(), capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, done.stderr[-3000:]
        records = json.loads(done.stdout)["records"]  # one JSON document: only rank 0 prints
        assert sorted({record["layer"] for record in records}) == [0, 1]  # one layer a rank
        tables.append((records, read_table(tmp_path / out / "bounds.parquet")))
    assert tables[0][0] == tables[1][0]
    pd.testing.assert_frame_equal(tables[0][1], tables[1][1], check_exact=True)
