"""A pickled tensor file that holds Python objects is refused in one line, with no warning of torch's before it."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


class Evil:
    def __reduce__(self):
        return (os.system, ("touch MARKER",))


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]), "PYTHONWARNINGS": "default"}
    return subprocess.run([sys.executable, "-m", "attnsens", *args], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.parametrize("protocol", [2, 4])
def test_theta_refuses_a_pickle_in_one_line_without_torch_warnings(tmp_path, protocol):
    with open(tmp_path / "evil.pt", "wb") as handle:
        pickle.dump({"p": Evil()}, handle, protocol=protocol)
    result = _run("theta", "evil.pt", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: evil.pt holds pickled Python objects"), result.stderr
    assert not (tmp_path / "MARKER").exists()


def test_token_ids_in_a_pickle_are_refused_without_advice_to_unpickle(tmp_path):
    from typer.testing import CliRunner

    from attnsens.cli import app

    with open(tmp_path / "ids.pt", "wb") as handle:
        pickle.dump({"p": Evil()}, handle, protocol=4)
    result = CliRunner().invoke(
        app, ["audit", "builtin:lnfree", "--ids", str(tmp_path / "ids.pt"), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "holds pickled Python objects" in lines[0], result.output
    assert "weights_only=False" not in result.output and "Warning" not in result.output
    assert not (tmp_path / "MARKER").exists()
