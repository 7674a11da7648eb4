"""The audit's peak extra memory at long context stays within its documented bound in a default environment:
one chunk's working set (``max_memory``) and the rows table on top of the forward pass, whatever the layer count;
written to a run folder, one layer's rows instead of the table; and the forward pass under the capture runs each
MLP on slices of tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnsens.study.auditing import TABLE_BYTES_PER_ROW  # the rows table at its peak: columns, DataFrame, summary

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
N = 3072
MAX_MEMORY = 16 * 2**20

PEAK_EXTRA = """
import threading, time
import psutil

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
"""
"""Worker prelude: ``peak_extra(call)``, the peak resident set during ``call()`` above the level before it, sampled
every 2 ms by a thread."""

WORKER = (
    PEAK_EXTRA
    + """
import json, sys, tempfile
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import attnsens as A

layers, n, max_memory = (int(a) for a in sys.argv[1:])
torch.manual_seed(0)
config = LlamaConfig(num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                     intermediate_size=96, max_position_embeddings=n, vocab_size=97)
adapter = A.models.load(LlamaForCausalLM(config).eval())
ids = torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(1))

def forward():
    with adapter.inference():
        adapter.forward(ids)

selection = A.capture.RowSelection(max_memory=max_memory)
A.study.audit(adapter, ids[:, :64], max_memory=max_memory)  # warm-up: numba compilation, first allocations
plain = peak_extra(forward)
def discard(block):
    pass

capture = peak_extra(lambda: A.capture.capture_row_statistics(adapter, ids, selection=selection, on_block=discard))
audit = peak_extra(lambda: A.study.audit(adapter, ids, max_memory=max_memory))
with tempfile.TemporaryDirectory() as out_dir:
    to_folder = peak_extra(lambda: A.study.audit(adapter, ids, max_memory=max_memory, out_dir=out_dir))
print(json.dumps({"forward": plain, "capture": capture, "audit": audit, "to_folder": to_folder, "rows": layers * 4 * n,
                  "layer_rows": 4 * n}))
"""
)


def _run_worker(source: str, *args: object, timeout: int) -> dict[str, int]:
    """The JSON that ``source`` prints last, run with ``args`` in a fresh interpreter without ``MALLOC_*`` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    command = [sys.executable, "-c", source, *map(str, args)]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env, cwd=ROOT, timeout=timeout)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _measure(layers: int) -> dict[str, int]:
    return _run_worker(WORKER, layers, N, MAX_MEMORY, timeout=1800)


def _least(layers: int, runs: int = 2) -> dict[str, int]:
    """Each figure's least over ``runs`` fresh subprocesses: a sampled peak RSS moves by several MiB from run to run
    (allocator and thread timing; the capture's peak of the same 3-layer model measured 20–25 MiB), which a
    growth with the layer count would not do."""
    measured = [_measure(layers) for _ in range(runs)]
    return {key: min(m[key] for m in measured) for key in measured[0]}


def test_peak_extra_memory_is_bounded_and_independent_of_the_layer_count() -> None:
    few, many = _least(3), _least(12)
    # The rows' working set is one chunk of one layer: four times the layers leave the capture's peak unchanged.
    assert many["capture"] - few["capture"] <= 8 * 2**20, (few, many)
    for got in (few, many):
        # Documented bound (study.auditing.audit): forward + max_memory + the rows table + 64 MiB of interpreter,
        # numba, pyarrow and pandas working space.
        bound = got["forward"] + MAX_MEMORY + TABLE_BYTES_PER_ROW * got["rows"] + 64 * 2**20
        assert got["capture"] <= got["forward"] + MAX_MEMORY + 64 * 2**20, got
        assert got["audit"] <= bound, (got, bound)
        # Written to a folder, the rows go to disk a layer at a time: one layer's rows instead of the table.
        one_layer = got["forward"] + MAX_MEMORY + TABLE_BYTES_PER_ROW * got["layer_rows"] + 64 * 2**20
        assert got["to_folder"] <= one_layer, (got, one_layer)
    # ... and so its peak, the table included, does not grow with the layer count either.
    assert many["to_folder"] - few["to_folder"] <= 8 * 2**20, (few, many)
    # All layers' float32 attention would be 12 · 4 · 3072² · 4 B = 1.7 GiB.
    assert many["audit"] <= 0.1 * 12 * 4 * N**2 * 4, many


SLICE_WORKER = (
    PEAK_EXTRA
    + """
import json, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import attnsens as A
import attnsens.models.query_slices as query_slices
import attnsens.models.tokenwise as tokenwise

n, token_chunk, query_slice = (int(a) for a in sys.argv[1:4])
config, layers = json.loads(sys.argv[4]), json.loads(sys.argv[5])
tokenwise.TOKEN_CHUNK, query_slices.QUERY_SLICE = token_chunk, query_slice
torch.manual_seed(0)
config = LlamaConfig(**config, num_hidden_layers=2, max_position_embeddings=n, vocab_size=97)
adapter = A.models.load(LlamaForCausalLM(config).eval())
ids = torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(1))
selection = A.capture.RowSelection(layers=None if layers is None else tuple(layers), max_memory=16 * 2**20)
A.capture.capture_row_statistics(adapter, ids[:, :64], selection=selection)  # warm-up
def discard(block):
    pass

capture = peak_extra(lambda: A.capture.capture_row_statistics(adapter, ids, selection=selection, on_block=discard))
print(json.dumps({"capture": capture}))
"""
)
"""A two-layer Llama (``config``: its sizes) captured at n tokens, with the MLP slices' and the query slices' widths
given: the peak extra memory of the capture."""


def _slice_capture(n: int, token_chunk: int, query_slice: int, config: dict, layers: list[int] | None) -> int:
    arguments = (n, token_chunk, query_slice, json.dumps(config), json.dumps(layers))
    return _run_worker(SLICE_WORKER, *arguments, timeout=900)["capture"]


def test_the_capture_never_holds_a_long_inputs_mlp_activations_at_once() -> None:
    """A Llama with a wide MLP (d_ff = 4096) at 4096 tokens: layer 0's MLP, whole, holds three [4096, 4096] float32
    tensors (64 MiB each) at once; on slices of 1,024 tokens, three of 16 MiB. Each capture in a fresh subprocess."""
    config = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64, "intermediate_size": 4096}
    whole, sliced = (_slice_capture(4096, chunk, 10**9, config, [1]) for chunk in (10**9, 1024))
    # Measured 197 against 54–71 MiB: 144 MiB fewer by the tensor count, asserted with room for the sampling.
    assert whole - sliced >= 80 * 2**20, (whole, sliced)


def test_the_capture_never_holds_a_long_inputs_layer_activations_at_once() -> None:
    """A Llama with d_model 512 at 8192 tokens, every row audited: a whole layer holds its [8192, 512] float32
    tensors (16 MiB each: the residual stream, the norm's temporaries, queries, keys, values and their rotary
    temporaries, the attention's and the layer's outputs) at once; run in slices of 1,024 queries it holds the
    residual stream in and out and the queries, keys and values. Each capture in a fresh subprocess."""
    config = {"num_attention_heads": 8, "num_key_value_heads": 8, "hidden_size": 512, "intermediate_size": 512}
    whole, sliced = (_slice_capture(8192, 1024, size, config, None) for size in (10**9, 1024))
    # Measured 239 and 254 against 166 and 170 MiB: at least three of the 16 MiB tensors fewer, asserted.
    assert whole - sliced >= 48 * 2**20, (whole, sliced)
