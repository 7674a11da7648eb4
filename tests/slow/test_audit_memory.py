"""The audit's peak extra memory at long context stays within its documented bound in a default environment:
one chunk's working set (``max_memory``) and the rows table on top of the forward pass, whatever the layer count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
N = 3072
MAX_MEMORY = 16 * 2**20
BYTES_PER_ROW = 83  # the rows table's columns (study.audit.RowColumns)

WORKER = """
import json, sys, threading, time
import psutil, torch
from transformers import LlamaConfig, LlamaForCausalLM
import attnsens as A

layers, n, max_memory = (int(a) for a in sys.argv[1:])
torch.manual_seed(0)
config = LlamaConfig(num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                     intermediate_size=96, max_position_embeddings=n, vocab_size=97)
adapter = A.models.load(LlamaForCausalLM(config).eval())
ids = torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(1))
process = psutil.Process()

def peak_extra(call):
    start = peak = process.memory_info().rss
    done = threading.Event()
    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.002)
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    call()
    done.set()
    thread.join()
    return max(peak, process.memory_info().rss) - start

with torch.no_grad():
    adapter.module(input_ids=ids[:, :64])
    forward = peak_extra(lambda: adapter.module(input_ids=ids))
A.study.audit(adapter, ids[:, :64], max_memory=max_memory)  # warm-up: numba compilation
audit = peak_extra(lambda: A.study.audit(adapter, ids, max_memory=max_memory))
print(json.dumps({"forward": forward, "audit": audit, "rows": layers * 4 * n}))
"""


def _measure(layers: int) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    command = [sys.executable, "-c", WORKER, str(layers), str(N), str(MAX_MEMORY)]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env, cwd=ROOT, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_peak_extra_memory_is_bounded_and_independent_of_the_layer_count() -> None:
    few, many = _measure(3), _measure(12)
    for got in (few, many):
        # Documented bound (study.audit.audit): forward + max_memory + the rows table (up to 4 copies while the
        # frame and summary are built) + 64 MiB of interpreter, pyarrow and pandas working space.
        bound = got["forward"] + MAX_MEMORY + 4 * BYTES_PER_ROW * got["rows"] + 64 * 2**20
        assert got["audit"] <= bound, (got, bound)
    # Four times the layers: only the table grows, not the rows' working set (all layers' float32 attention
    # would be 12 · 4 · 3072² · 4 B = 1.7 GiB).
    table_growth = 4 * BYTES_PER_ROW * (many["rows"] - few["rows"])
    assert many["audit"] - few["audit"] <= table_growth + 32 * 2**20, (few, many)
    assert many["audit"] <= 0.1 * 12 * 4 * N**2 * 4
