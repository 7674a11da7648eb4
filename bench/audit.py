"""Benchmark of the streaming audit on SmolLM2-135M over a sweep of sequence lengths, and of the monitor's overhead.

Printed side by side, measured in this run:

* time: full audit (every row of every head and layer → θ certificate, p_max, argmax, entropy, n_eff; per-row
  table and summary) / plain forward pass of the same module (the base LlamaModel with sdpa, no LM head — the
  smaller denominator, so the ratio is conservative). Goal ≤ 2.
* time and peak memory: the audit / the way it is done today — an eager forward with ``output_attentions=True``
  (all layers' [head, n, n] tensors at once) followed by the same per-row torch statistics without θ.
* the same for TransformerLens (where it is installed): ``TransformerBridge.run_with_cache`` on the same weights,
  caching only the ``hook_pattern`` of every layer (the least a user asking for attention would cache), followed
  by the same statistics.
* memory and time of the audit written to a run folder (``out_dir``, as ``attnsens audit`` runs it): its rows go to
  disk one layer at a time and the summary is built one layer at a time, so beside the forward pass it holds one
  chunk of rows and one layer's rows, not the rows table.
* monitor: a tiny GPT training loop with and without ``SensitivityMonitor`` (probe every k = 50 steps);
  overhead = time spent in the monitor's probes / training time of the same run (the difference between
  separate runs with and without the monitor is also recorded, but on a shared machine it drifts with load
  more than the probes cost). Goal ≤ 10 %.

Memory method (CPU): each measured call runs in a fresh subprocess, started with no ``MALLOC_*`` allocator
variables (a default environment), that loads the model from a float32 safetensors copy, warms up on the first
128 tokens (numba compilation and loading of every kernel the call runs), then samples the resident set size
(psutil, every 2 ms) during one call at the full length; the figure is the peak RSS during the call minus the
RSS just before it, i.e. the extra memory the call needs on top of the loaded model. For the audit it is also
printed less the bytes of the tables it returns (pandas' deep memory usage of the rows and summary): what is
left is its working memory. Times are the median of that
call and ``--repeats - 1`` more. The eager baseline is skipped at lengths where all layers' attention would not fit
in half the available memory.

Paired time ratio: the forward and the audit measured apart, in subprocesses one after the other, each with its
own cold first call, see different loads on a shared machine (at 512 tokens the forward's own calls have spread
over 0.9–2.2 s in one run). One more fresh subprocess therefore warms up both calls (and the audit to a folder,
when it is among the extras) at the full length and then times ``--repeats`` rounds of them, rotating which runs
first; the figure is the median of the rounds' ratios.

Usage: ``python bench/audit.py [--lengths 512,2048,4096,8192] [--repeats 1] [--monitor-steps 0] [--extras LIST]
[--no-pairs]``; appends one JSON line per length to bench/results/audit.jsonl. ``--extras audit_exact48`` (alone
or among others) measures the audit with every row of at most 48 keys proved exact (``exact_support=48``), apart
and in the paired rounds: what that proof costs beside the default audit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from _jsonl import append_record

RESULTS = Path(__file__).resolve().parent / "results" / "audit.jsonl"
EXTRAS = ("audit_to_folder", "eager_posthoc", "tl_run_with_cache", "audit_exact48")
"""Calls measured beside the plain forward and the audit: the audit written to a run folder (its rows go to disk
layer by layer, as ``attnsens audit`` writes them), the two ways of getting the same statistics without
attnsens, and the audit with every row of at most 48 keys proved exact (``exact_support=48``)."""
DEFAULT_EXTRAS = EXTRAS[:3]
"""The extras measured unless ``--extras`` names others: ``audit_exact48`` only on request."""
PAIRED_EXTRAS = {
    "audit_to_folder": ("folder_", "audit to a folder"),
    "audit_exact48": ("exact48_", "audit, exact ≤ 48"),
}
"""Extras that are also timed in the paired rounds, beside the forward and the audit: the prefix of their keys in
``measure_pairs``' result (``{prefix}ratio``, ``{prefix}ratios``, ``{prefix}s_all``) and their printed label."""
WARMUP_TOKENS = 128
"""Long enough that the warm-up runs the θ engine's parallel kernel too (9 heads × 128 rows × 128 keys ≥
``attnsens.theta.certificate.PARALLEL_MIN_ELEMENTS``), so no kernel is loaded from numba's cache while timed."""


class PeakRSS:
    """Peak resident set size above the level at entry, sampled by a background thread."""

    def __init__(self, interval_s: float = 0.002) -> None:
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


def run_method(method: str, loaded: Any, ids: torch.Tensor) -> Any:
    """One call of ``method`` on ``ids``: ``loaded`` is the attnsens adapter, or for ``tl_run_with_cache`` the
    TransformerLens bridge. Returns the audit's result (None for the others)."""
    import attnsens as A

    with torch.no_grad():
        if method == "forward":
            loaded.module(input_ids=ids)
        elif method == "audit":
            return A.study.audit(loaded, ids)
        elif method == "audit_exact48":
            return A.study.audit(loaded, ids, exact_support=48)
        elif method == "audit_to_folder":
            with tempfile.TemporaryDirectory() as out_dir:
                return A.study.audit(loaded, ids, out_dir=out_dir)
        elif method == "eager_posthoc":
            posthoc_statistics(loaded.module(input_ids=ids, output_attentions=True).attentions)
        elif method == "tl_run_with_cache":
            _, cache = loaded.run_with_cache(ids, names_filter=lambda name: name.endswith("attn.hook_pattern"))
            layers = range(loaded.cfg.n_layers)
            posthoc_statistics(tuple(cache[f"blocks.{layer}.attn.hook_pattern"] for layer in layers))
        else:
            raise ValueError(method)
    return None


def measure(method: str, model_dir: str, seq_len: int, repeats: int) -> dict[str, object]:
    """Run one method in this process: median seconds (and every call's), peak extra RSS bytes of the first call."""
    import attnsens as A

    ids = torch.load(Path(model_dir) / "ids.pt", weights_only=True)[:, :seq_len]
    if method == "tl_run_with_cache":
        loaded = transformer_lens_bridge(model_dir)
    else:
        loaded = A.models.load(model_dir)
        model = loaded.module

    def call() -> Any:
        return run_method(method, loaded, ids)

    if method == "eager_posthoc":
        model.set_attn_implementation("eager")
    full, ids = ids, ids[:, :WARMUP_TOKENS]
    call()  # warm-up on a short prefix: numba compilation and loading, first allocations
    ids = full
    start = time.perf_counter()
    with PeakRSS() as peak:
        result = call()
    seconds = [time.perf_counter() - start]
    # What the audit returns (its rows and summary tables) is in the peak; the rest is its working memory. An audit
    # to a folder returns the summary only (its rows stay on disk, and are gone with the folder).
    tables = (
        () if result is None else (result.summary,) if method == "audit_to_folder" else (result.rows, result.summary)
    )
    result_bytes = sum(int(t.memory_usage(deep=True).sum()) for t in tables)
    del result
    for _ in range(repeats - 1):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return {
        "seconds": statistics.median(seconds),
        "seconds_all": seconds,
        "peak_extra_bytes": peak.extra_bytes,
        "result_bytes": result_bytes,
    }


def measure_pairs(model_dir: str, seq_len: int, pairs: int, extras: tuple[str, ...] = ()) -> dict[str, object]:
    """The plain forward and the audit (and the ``extras`` among ``PAIRED_EXTRAS``), interleaved in this process:
    after one warm-up call of each at the full length, ``pairs`` rounds, the order rotating (forward first, then
    the audit first, …), each round's ratios timed within seconds of each other, so that a change of the machine's
    load between the separate subprocesses does not enter the ratio."""
    import attnsens as A

    ids = torch.load(Path(model_dir) / "ids.pt", weights_only=True)[:, :seq_len]
    adapter = A.models.load(model_dir)
    methods = ("forward", "audit", *extras)

    def timed(method: str) -> float:
        start = time.perf_counter()
        run_method(method, adapter, ids)
        return time.perf_counter() - start

    for method in methods:  # warm-up at the full length: compilation, kernels, first allocations
        timed(method)
    seconds: dict[str, list[float]] = {method: [] for method in methods}
    for index in range(pairs):
        shift = index % len(methods)
        for method in methods[shift:] + methods[:shift]:
            seconds[method].append(timed(method))
    result: dict[str, object] = {"forward_s_all": seconds["forward"], "audit_s_all": seconds["audit"]}
    for method, prefix in (("audit", ""), *((name, prefix) for name, (prefix, _) in PAIRED_EXTRAS.items())):
        if method in seconds:
            ratios = [a / f for a, f in zip(seconds[method], seconds["forward"], strict=True)]
            result |= {f"{prefix}ratio": statistics.median(ratios), f"{prefix}ratios": ratios}
            if prefix:
                result[f"{prefix}s_all"] = seconds[method]
    return result


def transformer_lens_bridge(model_dir: str) -> Any:
    """A TransformerLens ``TransformerBridge`` around the same weights (the causal-LM class the bridge expects; its
    LM head is tied to the embeddings, so nothing is added), in eager attention as the bridge requires."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return TransformerBridge.boot_transformers("smollm2", hf_model=model, tokenizer=tokenizer)


def has_transformer_lens() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformer_lens") is not None


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
    # A GGUF-loaded module refuses save_pretrained; copy its dequantized weights into a plain one (a module read
    # from the converted cache of models/gguf_cache.py has no quantization config left to drop).
    config = copy.deepcopy(adapter.module.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModel.from_config(config)
    plain.load_state_dict(adapter.module.state_dict())
    plain.save_pretrained(model_dir)
    adapter.tokenizer.save_pretrained(model_dir)
    ids = adapter.encode(read_documents(None)[0][: 16 * seq_len])[:, :seq_len]
    torch.save(ids, model_dir / "ids.pt")
    return {"model": "smollm2", "n_layer": adapter.spec.n_layer, "n_head": adapter.spec.n_head}


def run_measure(method: str, model_dir: Path, seq_len: int, repeats: int, extras: str = "") -> dict[str, Any]:
    """``measure`` in a fresh subprocess whose environment has no glibc allocator variables."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    command = [sys.executable, __file__, "--measure", method, "--model-dir", str(model_dir)]
    command += ["--lengths", str(seq_len), "--repeats", str(repeats), "--extras", extras]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def eager_fits(info: dict[str, object], seq_len: int) -> bool:
    """Whether all layers' float32 attention (and the scores it is computed from) fits in half the free memory."""
    attention = int(info["n_layer"]) * int(info["n_head"]) * seq_len**2 * 4
    return 2 * attention < psutil.virtual_memory().available / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512", help="comma-separated sequence lengths, e.g. 512,2048,4096,8192")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--monitor-steps", type=int, default=200, help="0 skips the monitor benchmark")
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument(
        "--extras",
        default=",".join(DEFAULT_EXTRAS),
        help=f"comma-separated calls measured beside the forward and the audit, among {', '.join(EXTRAS)} (the "
        "baselines only where all layers' attention fits in memory, TransformerLens where it is installed)",
    )
    parser.add_argument("--no-pairs", action="store_true", help="skip the paired time ratio (two more calls a pair)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(part) for part in args.lengths.split(",")]
    extras = [name for name in args.extras.split(",") if name]
    if unknown := sorted(set(extras) - set(EXTRAS)):
        parser.error(f"unknown --extras {unknown}; choose among {', '.join(EXTRAS)}")
    if args.measure == "pairs":
        paired_extras = tuple(name for name in PAIRED_EXTRAS if name in extras)
        print(json.dumps(measure_pairs(args.model_dir, lengths[0], args.repeats, paired_extras)))
        return
    if args.measure:
        print(json.dumps(measure(args.measure, args.model_dir, lengths[0], args.repeats)))
        return

    from attnsens.provenance import provenance

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        info = prepare(model_dir, max(lengths))
        for seq_len in lengths:
            methods = ["forward", "audit"] + [
                extra
                for extra in EXTRAS
                if extra in extras
                and (extra in PAIRED_EXTRAS or eager_fits(info, seq_len))
                and (extra != "tl_run_with_cache" or has_transformer_lens())
            ]
            results = {}
            for method in methods:
                results[method] = run_measure(method, model_dir, seq_len, args.repeats)
                print(
                    f"n={seq_len:>5} {method:>17}: {results[method]['seconds']:8.2f} s "
                    f"({', '.join(f'{t:.2f}' for t in results[method]['seconds_all'])}), "
                    f"peak extra RSS {results[method]['peak_extra_bytes'] / 2**20:8.1f} MiB"
                    + (
                        f", of which its tables {results[method]['result_bytes'] / 2**20:.1f} MiB"
                        if method in ("audit", "audit_to_folder", "audit_exact48")
                        else ""
                    ),
                    flush=True,
                )
            paired = None
            if not args.no_pairs:
                paired_extras = ",".join(name for name in PAIRED_EXTRAS if name in methods)
                paired = run_measure("pairs", model_dir, seq_len, args.repeats, paired_extras)
                print(
                    f"n={seq_len:>5}    paired in one process: audit ÷ forward {paired['ratio']:.2f} (median of "
                    f"{', '.join(f'{r:.2f}' for r in paired['ratios'])}; forward "
                    f"{', '.join(f'{t:.2f}' for t in paired['forward_s_all'])} s)"
                    + "".join(
                        f"; {label} ÷ forward {paired[prefix + 'ratio']:.2f} (median of "
                        f"{', '.join(f'{r:.2f}' for r in paired[prefix + 'ratios'])})"
                        for prefix, label in PAIRED_EXTRAS.values()
                        if prefix + "ratio" in paired
                    ),
                    flush=True,
                )
            audit, forward = results["audit"], results["forward"]
            attention_bytes = int(info["n_layer"]) * int(info["n_head"]) * seq_len**2 * 4
            record = {
                "bench": "audit",
                **info,
                "seq_len": seq_len,
                "torch_threads": torch.get_num_threads(),
                "load_average_1min": psutil.getloadavg()[0],
                **{f"{m}_s": r["seconds"] for m, r in results.items()},
                **{f"{m}_s_all": r["seconds_all"] for m, r in results.items()},
                **{f"{m}_peak_extra_bytes": r["peak_extra_bytes"] for m, r in results.items()},
                "audit_over_forward_time": audit["seconds"] / forward["seconds"],
                **(
                    {}
                    if paired is None
                    else {
                        "paired_audit_over_forward_time": paired["ratio"],
                        "paired_ratios": paired["ratios"],
                        "paired_forward_s_all": paired["forward_s_all"],
                        "paired_audit_s_all": paired["audit_s_all"],
                        **{
                            key: value
                            for name, (prefix, _) in PAIRED_EXTRAS.items()
                            if prefix + "ratio" in paired
                            for key, value in (
                                (f"paired_{name}_over_forward_time", paired[prefix + "ratio"]),
                                (f"paired_{prefix}ratios", paired[prefix + "ratios"]),
                                (f"paired_{name}_s_all", paired[prefix + "s_all"]),
                            )
                        },
                    }
                ),
                "eager_attention_bytes": attention_bytes,
                "audit_memory_over_eager_attention_bytes": audit["peak_extra_bytes"] / attention_bytes,
                "audit_result_bytes": audit["result_bytes"],
                "audit_working_bytes": audit["peak_extra_bytes"] - audit["result_bytes"],
            }
            if "audit_to_folder" in results:
                to_folder = results["audit_to_folder"]
                record["audit_to_folder_result_bytes"] = to_folder["result_bytes"]
                record["audit_to_folder_over_forward_time"] = to_folder["seconds"] / forward["seconds"]
                record["audit_to_folder_memory_over_forward_memory"] = (
                    to_folder["peak_extra_bytes"] / forward["peak_extra_bytes"]
                )
            if "audit_exact48" in results:
                record["audit_exact48_over_forward_time"] = results["audit_exact48"]["seconds"] / forward["seconds"]
            if "eager_posthoc" in results:
                baseline = results["eager_posthoc"]
                record["audit_over_eager_posthoc_time"] = audit["seconds"] / baseline["seconds"]
                record["audit_over_eager_posthoc_memory"] = audit["peak_extra_bytes"] / baseline["peak_extra_bytes"]
            if "tl_run_with_cache" in results:
                baseline = results["tl_run_with_cache"]
                record["audit_over_tl_cache_time"] = audit["seconds"] / baseline["seconds"]
                record["audit_over_tl_cache_memory"] = audit["peak_extra_bytes"] / baseline["peak_extra_bytes"]
            records.append(record)
    print_table(records)
    monitor = monitor_overhead(args.monitor_steps, args.every, args.repeats) if args.monitor_steps > 0 else None
    if monitor is not None:
        print(f"monitor overhead at k={args.every}: {100 * monitor['overhead']:.1f} %  (goal ≤ 10 %)")
    for record in records:
        append_record(RESULTS, {**record, "monitor": monitor, "provenance": provenance()})


def print_table(records: list[dict[str, object]]) -> None:
    """One line per length: times and peak extra memory of the calls measured, and the ratios."""

    def mib(record: dict[str, object], method: str) -> str:
        value = record.get(f"{method}_peak_extra_bytes")
        return "—" if value is None else f"{value / 2**20:,.0f}"

    def sec(record: dict[str, object], method: str) -> str:
        value = record.get(f"{method}_s")
        return "—" if value is None else f"{value:.1f}"

    def ratio(record: dict[str, object], key: str) -> str:
        value = record.get(key)
        return "—" if value is None else f"{value:.3f}"

    print(
        "| n | forward s | forward MiB | audit s | audit MiB | audit MiB less its tables "
        "| audit to a folder s | audit to a folder MiB "
        "| eager+stats s | eager+stats MiB "
        "| TL cache+stats s | TL cache+stats MiB | audit ÷ forward (time) | the same, paired "
        "| audit to a folder ÷ forward, paired "
        "| audit MiB ÷ all layers' attention "
        "| audit ÷ eager (time, memory) | audit ÷ TL (time, memory) "
        "| audit, exact ≤ 48, ÷ forward (time, the same paired) | audit, exact ≤ 48 MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in records:
        print(
            f"| {r['seq_len']} | {sec(r, 'forward')} | {mib(r, 'forward')} | {sec(r, 'audit')} | {mib(r, 'audit')} "
            f"| {r['audit_working_bytes'] / 2**20:,.0f} | {sec(r, 'audit_to_folder')} | {mib(r, 'audit_to_folder')} "
            f"| {sec(r, 'eager_posthoc')} | {mib(r, 'eager_posthoc')} "
            f"| {sec(r, 'tl_run_with_cache')} | {mib(r, 'tl_run_with_cache')} | {r['audit_over_forward_time']:.2f} "
            f"| {ratio(r, 'paired_audit_over_forward_time')} | {ratio(r, 'paired_audit_to_folder_over_forward_time')} "
            f"| {r['audit_memory_over_eager_attention_bytes']:.3f} "
            f"| {ratio(r, 'audit_over_eager_posthoc_time')}, {ratio(r, 'audit_over_eager_posthoc_memory')} "
            f"| {ratio(r, 'audit_over_tl_cache_time')}, {ratio(r, 'audit_over_tl_cache_memory')} "
            f"| {ratio(r, 'audit_exact48_over_forward_time')}, {ratio(r, 'paired_audit_exact48_over_forward_time')} "
            f"| {mib(r, 'audit_exact48')} |"
        )


if __name__ == "__main__":
    main()
