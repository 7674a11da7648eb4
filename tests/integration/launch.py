"""Run a micro script under torchrun (two gloo processes) and as one plain process, for the DDP tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.unit.train.conftest import synthetic_text

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def run_torchrun_and_single(source: str, work: Path, *, timeout: float) -> tuple[Path, Path]:
    """Write ``source`` as a script taking ``CORPUS OUT`` and a synthetic corpus into ``work``, run the script
    under torchrun with 2 processes into ``work/ddp``, then alone into ``work/single``; return both outputs.

    The launcher runs in its own session so that a hang is ended with its workers, not just the launcher.
    """
    corpus = work / "verse.txt"
    corpus.write_text(synthetic_text(6000))
    script = work / "micro_script.py"
    script.write_text(source)
    ddp_out, single_out = work / "ddp", work / "single"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    launcher = subprocess.Popen(
        [*torchrun, str(script), str(corpus), str(ddp_out)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        raise
    assert launcher.returncode == 0, output[-3000:]
    subprocess.run([sys.executable, str(script), str(corpus), str(single_out)], env=_env(), check=True, timeout=timeout)
    return ddp_out, single_out
