"""bench/gpu_theta.py runs end to end: its --interpret-smoke mode on CPU, and a clear refusal without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: bench/gpu_theta.py --interpret-smoke needs it")

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "gpu_theta.py"


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def test_interpret_smoke_checks_times_and_records(tmp_path: Path) -> None:
    results = tmp_path / "gpu_theta.jsonl"
    done = run_script("--interpret-smoke", "--shapes", "24x96", "--repeats", "1", "--sweep", "--results", str(results))
    assert done.returncode == 0, done.stderr
    assert "kern/copy" in done.stdout and "launch rows×warps" in done.stdout
    line = json.loads(results.read_text().splitlines()[-1])
    assert line["mode"] == "interpret-smoke" and len(line["records"]) == 2
    for record in line["records"]:
        assert record["sample_violations"] == 0 and record["sample_checked"] == record["rows"]
        assert 0.0 <= record["fallback_fraction"] <= record["open_after_first_pass_fraction"] <= 1.0
        assert record["certified_float32_fraction"] > 0.9
        assert record["kernel_over_copy"] > 0 and sum(record["methods"].values()) == record["rows"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: runs the compiled kernel on the GPU")
def test_compiled_kernel_on_cuda_agrees_with_cpu_cascade(tmp_path: Path) -> None:
    """The compiled kernel (not the interpreter) on small GPU tensors: no sampled row contradicts the CPU cascade."""
    results = tmp_path / "gpu_theta.jsonl"
    done = run_script(
        "--shapes", "4096x1024,1024x4093", "--repeats", "1", "--sample", "4096", "--results", str(results)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = json.loads(results.read_text().splitlines()[-1])["records"]
    assert all(r["sample_violations"] == 0 and r["certified_float32_fraction"] > 0.9 for r in records)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is only observable without CUDA")
def test_refuses_without_cuda() -> None:
    done = run_script("--repeats", "1")
    assert done.returncode == 2
    assert "needs a CUDA device" in done.stderr and "--interpret-smoke" in done.stderr
