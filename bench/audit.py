"""Benchmark of the streaming audit on SmolLM2-135M at seq-len 512, and of the training monitor's overhead.

Printed side by side, measured in this run:

* time: full audit (every row of every head and layer → θ certificate, p_max, argmax, entropy, n_eff; per-row
  table and summary) / plain forward pass of the same module (the base LlamaModel with sdpa, no LM head — the
  smaller denominator, so the ratio is conservative). Goal ≤ 2.
* time and peak memory: the audit / the way it is done today — an eager forward with ``output_attentions=True``
  (all layers' [head, n, n] tensors at once) followed by the same per-row torch statistics without θ.
* monitor: a tiny GPT training loop with and without ``SensitivityMonitor`` (probe every k = 50 steps);
  overhead = time spent in the monitor's probes / training time of the same run (the difference between
  separate runs with and without the monitor is also recorded, but on a shared machine it drifts with load
  more than the probes cost). Goal ≤ 10 %.

Memory method (CPU): each measured call runs in a fresh subprocess that loads the model from a float32
safetensors copy, runs one warm-up call, then samples the resident set size (psutil, every 0.5 ms) during a
second call; the figure is the peak RSS during the call minus the RSS just before it, i.e. the extra memory
the call needs on top of the loaded model. Times are medians of repeated calls in that subprocess.

Usage: ``python bench/audit.py [--seq-len 512] [--repeats 3]``; appends a JSON line to bench/results/audit.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

from _jsonl import append_record

RESULTS = Path(__file__).resolve().parent / "results" / "audit.jsonl"


class PeakRSS:
    """Peak resident set size above the level at entry, sampled by a background thread."""

    def __init__(self, interval_s: float = 0.0005) -> None:
        self.interval_s = interval_s
        self.process = psutil.Process()

    def __enter__(self) -> PeakRSS:
        self.start = self.process.memory_info().rss
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def extra_bytes(self) -> int:
        return self.peak - self.start


def posthoc_statistics(attentions: tuple[torch.Tensor, ...]) -> list[dict[str, torch.Tensor]]:
    """Today's way: per-row p_max, argmax, entropy and n_eff from the materialised attention tensors."""
    out = []
    for probs in attentions:  # [batch, head, query, key]
        p = probs.double()
        p_max, argmax = probs.max(dim=-1)
        out.append(
            {
                "p_max": p_max,
                "argmax": argmax,
                "entropy": -torch.special.xlogy(p, p).sum(dim=-1),
                "n_eff": 1.0 / (p * p).sum(dim=-1),
            }
        )
    return out


def measure(method: str, model_dir: str, seq_len: int, repeats: int) -> dict[str, float]:
    """Run one method in this process: median seconds and peak extra RSS bytes of one call."""
    import attnsens as A

    adapter = A.models.load(model_dir)
    model = adapter.module
    ids = torch.load(Path(model_dir) / "ids.pt", weights_only=True)[:, :seq_len]

    def call() -> None:
        with torch.no_grad():
            if method == "forward":
                model(input_ids=ids)
            elif method == "audit":
                A.study.audit(adapter, ids)
            elif method == "capture":
                A.capture.capture_row_statistics(adapter, ids)
            elif method == "eager_posthoc":
                posthoc_statistics(model(input_ids=ids, output_attentions=True).attentions)
            else:
                raise ValueError(method)

    if method == "eager_posthoc":
        model.set_attn_implementation("eager")
    call()  # warm-up: numba compilation, allocator growth
    with PeakRSS() as peak:
        call()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return {"seconds": statistics.median(seconds), "peak_extra_bytes": peak.extra_bytes}


def monitor_overhead(steps: int, every: int, repeats: int) -> dict[str, float]:
    """Seconds of a tiny GPT training loop without and with SensitivityMonitor(every=every)."""
    from attnsens.capture import SensitivityMonitor
    from attnsens.train.model import GPT, preset

    config = preset("tiny")
    generator = torch.Generator().manual_seed(0)
    batches = torch.randint(0, config.vocab_size, (steps, 8, config.max_positions), generator=generator)
    probe = torch.randint(0, config.vocab_size, (4, config.max_positions), generator=generator)

    def run(with_monitor: bool) -> tuple[float, float]:
        torch.manual_seed(0)
        model = GPT(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        monitor = SensitivityMonitor(probe, every=every) if with_monitor else None
        start = time.perf_counter()
        for step in range(steps):
            batch = batches[step]
            loss = model.loss(batch[:, :-1], batch[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if monitor is not None:
                monitor.on_step_end(step, model)
        return time.perf_counter() - start, 0.0 if monitor is None else monitor.seconds

    run(True)  # warm-up (numba, allocator)
    plain, monitored, probing = [], [], []
    for _ in range(repeats):  # interleaved so that machine load drifts affect both alike
        plain.append(run(False)[0])
        total, probe_s = run(True)
        monitored.append(total)
        probing.append(probe_s)
    return {
        "steps": steps,
        "every": every,
        "plain_s": min(plain),
        "monitored_s": min(monitored),
        "probe_s": min(probing),
        # Within one run: probing time over the training time of that same run. Differences between separate
        # runs (monitored - plain) drift with machine load far more than the probes cost on a shared machine.
        "overhead": statistics.median(p / (m - p) for m, p in zip(monitored, probing, strict=True)),
        "overhead_between_runs": min(monitored) / min(plain) - 1.0,
    }


def prepare(model_dir: Path, seq_len: int) -> dict[str, object]:
    """Load the shipped GGUF once and save a float32 safetensors copy (fast to load) and the token ids."""
    import copy

    from transformers import AutoModel

    import attnsens as A
    from attnsens.train.data import read_documents

    adapter = A.models.load("smollm2")
    # A GGUF-loaded module refuses save_pretrained; copy its dequantized weights into a plain one.
    config = copy.deepcopy(adapter.module.config)
    del config.quantization_config
    plain = AutoModel.from_config(config)
    plain.load_state_dict(adapter.module.state_dict())
    plain.save_pretrained(model_dir)
    adapter.tokenizer.save_pretrained(model_dir)
    ids = adapter.encode(read_documents(None)[0][: 16 * seq_len])[:, :seq_len]
    torch.save(ids, model_dir / "ids.pt")
    return {"model": "smollm2", "n_layer": adapter.spec.n_layer, "n_head": adapter.spec.n_head}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--monitor-steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.model_dir, args.seq_len, args.repeats)))
        return

    from attnsens.provenance import provenance

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        info = prepare(model_dir, args.seq_len)
        results = {}
        for method in ("forward", "capture", "audit", "eager_posthoc"):
            command = [sys.executable, __file__, "--measure", method, "--model-dir", str(model_dir)]
            command += ["--seq-len", str(args.seq_len), "--repeats", str(args.repeats)]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            results[method] = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"{method:>14}: {results[method]['seconds']:.3f} s, "
                f"peak extra RSS {results[method]['peak_extra_bytes'] / 2**20:.1f} MiB",
                flush=True,
            )
    monitor = monitor_overhead(args.monitor_steps, args.every, args.repeats)
    audit, forward, baseline = results["audit"], results["forward"], results["eager_posthoc"]
    record = {
        "bench": "audit",
        **info,
        "seq_len": args.seq_len,
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": psutil.getloadavg()[0],
        **{f"{m}_s": r["seconds"] for m, r in results.items()},
        **{f"{m}_peak_extra_bytes": r["peak_extra_bytes"] for m, r in results.items()},
        "audit_over_forward_time": audit["seconds"] / forward["seconds"],
        "capture_over_forward_time": results["capture"]["seconds"] / forward["seconds"],
        "audit_over_eager_posthoc_time": audit["seconds"] / baseline["seconds"],
        "audit_over_eager_posthoc_memory": audit["peak_extra_bytes"] / max(baseline["peak_extra_bytes"], 1),
        "eager_attention_bytes": info["n_layer"] * info["n_head"] * args.seq_len**2 * 4,
        "monitor": monitor,
        "provenance": provenance(),
    }
    print(f"audit / plain forward time:              {record['audit_over_forward_time']:.2f}  (goal ≤ 2.0)")
    print(f"capture only / plain forward time:       {record['capture_over_forward_time']:.2f}")
    print(f"audit / eager+post-hoc time:             {record['audit_over_eager_posthoc_time']:.2f}")
    print(f"audit / eager+post-hoc peak extra memory: {record['audit_over_eager_posthoc_memory']:.3f}")
    print(f"monitor overhead at k={args.every}:              {100 * monitor['overhead']:.1f} %  (goal ≤ 10 %)")
    append_record(RESULTS, record)


if __name__ == "__main__":
    main()
