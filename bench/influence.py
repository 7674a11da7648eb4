"""Benchmark: influence certificate and batched measurement vs a naive per-sample loop, on builtin:lnfree.

Prints the time of ``certified_constant``, of ``measure`` over the default grid (16 … 2048, 4 samples per
position kind) and of a naive loop that runs each x and x' alone through the model (the same numbers, one forward
per sequence), with the ratio naive/measure; appends one JSON line to bench/results/influence.jsonl.

    .venv/bin/python bench/influence.py [--samples 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from _jsonl import append_record
from attnsens.influence import POSITION_KINDS, builtin_lnfree, certified_constant, fit_loglog_slope, measure
from attnsens.influence.experiment import DEFAULT_LENGTHS
from attnsens.provenance import provenance

RESULTS = Path(__file__).resolve().parent / "results" / "influence.jsonl"


def naive_loop(model: torch.nn.Module, lengths: tuple[int, ...], n_samples: int, seed: int = 0) -> list[float]:
    """max ‖Δy_n‖ per length, one sequence per forward pass, full logits for every position."""
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    captured: list[torch.Tensor] = []
    handle = model.hook_final.register_forward_hook(lambda _m, _i, out: captured.append(out[0, -1]))
    worst = []
    with torch.no_grad():
        for n in lengths:
            largest = 0.0
            for kind in POSITION_KINDS:
                for _ in range(n_samples):
                    tokens = torch.randint(0, vocab, (1, n), generator=generator)
                    i = {"first": 0, "middle": (n - 1) // 2}.get(kind)
                    i = int(torch.randint(0, n - 1, (1,), generator=generator)) if i is None else i
                    replaced = tokens.clone()
                    replaced[0, i] = (tokens[0, i] + int(torch.randint(1, vocab, (1,), generator=generator))) % vocab
                    torch.softmax(model(tokens)[0, -1], -1), torch.softmax(model(replaced)[0, -1], -1)
                    largest = max(largest, float(torch.linalg.vector_norm(captured[-2] - captured[-1])))
            worst.append(largest)
    handle.remove()
    return worst


def timed(function, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    model = builtin_lnfree()
    lengths = DEFAULT_LENGTHS
    certificate_s, cert = timed(lambda: certified_constant(model), repeats=20)
    forward_s, _ = timed(lambda: model(torch.zeros(1, 16, dtype=torch.long)), repeats=20)
    measure_s, table = timed(lambda: measure(model, lengths, n_samples=args.samples), repeats=1)
    naive_s, _ = timed(lambda: naive_loop(model, lengths, args.samples), repeats=1)
    fit = fit_loglog_slope(table)
    record = {
        "bench": "influence",
        "model": "builtin:lnfree",
        "lengths": list(lengths),
        "n_samples": args.samples,
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],  # other processes on the machine distort every timing
        "certificate_s": certificate_s,
        "forward_n16_s": forward_s,
        "certificate_over_forward_n16": certificate_s / forward_s,
        "measure_s": measure_s,
        "naive_loop_s": naive_s,
        "naive_over_measure": naive_s / measure_s,
        "log10_certified_C": cert.log10_constant,
        "slope": fit.slope,
        "slope_ci": list(fit.slope_ci),
        "provenance": provenance(),
    }
    print(
        f"certified_constant: {certificate_s * 1e3:.2f} ms  (one forward at n=16: {forward_s * 1e3:.2f} ms, ratio "
        f"{certificate_s / forward_s:.1f})"
    )
    print(
        f"measure over {lengths[0]}…{lengths[-1]} ({args.samples}×{len(POSITION_KINDS)} samples per n): "
        f"{measure_s:.2f} s; naive per-sample loop {naive_s:.2f} s; naive/measure = {naive_s / measure_s:.2f}×"
    )
    print(f"C = 10^{cert.log10_constant:.3f}, slope {fit.slope:.3f} [{fit.slope_ci[0]:.3f}, {fit.slope_ci[1]:.3f}]")
    append_record(RESULTS, record)


if __name__ == "__main__":
    main()
