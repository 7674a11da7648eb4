"""Parallel numba kernels must leave torch's thread count as the caller set it."""

from __future__ import annotations

import subprocess
import sys


def test_parallel_kernels_keep_torch_thread_count() -> None:
    # A fresh process: the OpenMP runtime is shared, so the reset only shows on the first parallel numba call.
    code = (
        "import torch\n"
        "from attnsens.theta import certify\n"
        "from attnsens.capture import row_statistics\n"
        "torch.set_num_threads(1)\n"
        "p = torch.softmax(torch.randn(4096, 101), -1)\n"
        "certify(p)\n"
        "assert torch.get_num_threads() == 1, torch.get_num_threads()\n"
        "row_statistics(p.reshape(1, 1, 4096, 101))\n"
        "assert torch.get_num_threads() == 1, torch.get_num_threads()\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_training_monitor_keeps_torch_thread_count() -> None:
    # Training goes on after each probe with the threads it was given (bench/train.py measured 1 → 2 before).
    code = (
        "import torch\n"
        "from attnsens.capture import SensitivityMonitor\n"
        "from attnsens.train.model import GPT, preset\n"
        "torch.set_num_threads(1)\n"
        "model = GPT(preset('tiny'))\n"
        "monitor = SensitivityMonitor(torch.randint(0, 1024, (2, 128)), every=1)\n"
        "assert monitor.on_step_end(0, model)\n"
        "assert torch.get_num_threads() == 1, torch.get_num_threads()\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
