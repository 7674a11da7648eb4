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
