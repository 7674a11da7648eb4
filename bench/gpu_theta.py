"""Benchmark: the Triton θ kernel vs one device-to-device copy and torch.sort of the same rows, on one GPU.

Tensors: 65,536 × 1024 and 262,144 × 4096 float32 attention rows softmax(σ·z), σ cycling 0.5/1/2/4/8 over the rows,
with full and causal masks (row r of each key-length block sees keys 0…r). For each tensor the script first checks
the certificates against the CPU cascade on a sample of rows (intervals overlap, rows both prove exact agree to
their widths), then times, median of ``--repeats``:

    kernel    one launch of the Triton kernel (rows it leaves open keep method 0),
    certify   ``attnsens.theta.certify(rows)`` end to end (kernel, CPU cascade for open rows, enclosure),
    copy      one device-to-device copy of the rows (one read + one write: the memory floor),
    sort      ``torch.sort(rows, dim=-1)`` on the same device,

and prints kernel/copy (goal ≤ 2), kernel/sort, certify/copy, the fraction of rows certified to float32 resolution
(width ≤ 2^-25), the exact fraction, the fraction the one-target pass leaves open ("open 1") and the fraction
left to the CPU cascade after the 16-target pass ("to CPU"). One JSON line per run is
appended to bench/results/gpu_theta.jsonl. Without CUDA it exits with status 2; a failed soundness check exits 1.

    .venv/bin/python bench/gpu_theta.py [--repeats 5] [--sweep] [--shapes 65536x1024,262144x4096]
    .venv/bin/python bench/gpu_theta.py --interpret-smoke [--results PATH]   # tiny CPU run, TRITON_INTERPRET=1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _jsonl import append_record

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_theta.jsonl"
SIGMAS = (0.5, 1.0, 2.0, 4.0, 8.0)
GPU_SHAPES = ((65_536, 1024), (262_144, 4096))
SMOKE_SHAPES = ((40, 96), (24, 300))
FLOAT32_WIDTH = 2.0**-25
SWEEP = {1024: [(r, w) for r in (1, 2, 4) for w in (1, 2, 4, 8)], 4096: [(r, w) for r in (1, 2) for w in (4, 8, 16)]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interpret-smoke", action="store_true", help="tiny CPU run under TRITON_INTERPRET=1")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions per measurement (median)")
    parser.add_argument("--sample", type=int, default=4096, help="rows checked against the CPU cascade per tensor")
    parser.add_argument("--sweep", action="store_true", help="also time the kernel over launch shapes")
    parser.add_argument("--results", type=Path, default=None, help=f"JSON lines file (default {RESULTS})")
    parser.add_argument(
        "--shapes", type=parse_shapes, default=None, help="ROWSxKEYS[,ROWSxKEYS…] instead of the defaults"
    )
    return parser.parse_args(argv)


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """ "65536x1024,262144x4096" → ((65536, 1024), (262144, 4096))."""
    try:
        return tuple((int(rows), int(keys)) for rows, keys in (part.split("x") for part in text.split(",")))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--shapes {text!r} is not ROWSxKEYS[,ROWSxKEYS…]") from error


def attention_rows(n_rows: int, n_keys: int, *, causal: bool, device, seed: int):
    """[n_rows, n_keys] float32 rows softmax(σ_r·z), σ_r = SIGMAS[r mod 5]; causal rows see keys 0…(r mod n_keys)."""
    import torch

    out = torch.empty(n_rows, n_keys, dtype=torch.float32, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    sigma = torch.tensor(SIGMAS, dtype=torch.float32, device=device)
    chunk = max(1, 2**26 // n_keys)
    for start in range(0, n_rows, chunk):
        index = torch.arange(start, min(n_rows, start + chunk), device=device)
        scores = sigma[index % len(SIGMAS)].unsqueeze(-1) * torch.randn(
            index.numel(), n_keys, generator=gen, device=device
        )
        if causal:
            visible = torch.arange(n_keys, device=device).unsqueeze(0) <= (index % n_keys).unsqueeze(-1)
            scores = scores.masked_fill(~visible, -torch.inf)
        out[index] = torch.softmax(scores, dim=-1)
    return out


def median_seconds(fn: Callable[[], object], device, repeats: int) -> float:
    """Median wall time of ``fn`` after one warm-up call; device work is synchronised before and after."""
    import torch

    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_device_seconds(fn: Callable[[], object], device, repeats: int) -> float:
    """Median time of ``fn`` between CUDA events (device time only); wall time on the CPU."""
    import torch

    if device.type != "cuda":
        return median_seconds(fn, device, repeats)
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def soundness_violations(rows, cert, sample: int, seed: int) -> tuple[int, int]:
    """Rows of a random sample whose interval contradicts the CPU cascade (disjoint, or exact and apart)."""
    import torch

    from attnsens.theta import certify

    gen = torch.Generator().manual_seed(seed)
    picked = torch.randperm(rows.shape[0], generator=gen)[:sample]
    cpu_rows = rows[picked.to(rows.device)].cpu()
    cpu = certify(cpu_rows, backend="numba")
    gpu = cert[picked.to(rows.device)]
    lo_g, hi_g, exact_g = gpu.lower.cpu(), gpu.upper.cpu(), gpu.exact.cpu()
    disjoint = (lo_g > cpu.upper) | (cpu.lower > hi_g)
    slack = (hi_g - lo_g) + cpu.width
    both_exact = exact_g & cpu.exact
    differ = both_exact & (((lo_g - cpu.lower).abs() > slack) | ((hi_g - cpu.upper).abs() > slack))
    return int((disjoint | differ | (gpu.p_max.cpu() != cpu.p_max)).sum()), int(picked.numel())


def measure(n_rows: int, n_keys: int, causal: bool, device, args: argparse.Namespace) -> dict[str, object]:
    import torch

    from attnsens.theta import ThetaMethod, certify
    from attnsens.theta import _triton_kernel as triton_kernel
    from attnsens.theta.certificate import MITM_MAX_SUPPORT, STOP_DISTANCE

    rows = attention_rows(n_rows, n_keys, causal=causal, device=device, seed=n_keys + int(causal))
    stop = STOP_DISTANCE["float32"]
    cert = certify(rows, backend="triton")
    violations, checked = soundness_violations(rows, cert, args.sample, seed=n_rows)
    kernel_out = triton_kernel.kernel_pass(rows, stop, MITM_MAX_SUPPORT, True, 1e-3)
    sent_to_cpu = []

    def count_only(sub: torch.Tensor) -> dict[str, torch.Tensor]:
        sent_to_cpu.append(sub.shape[0])
        return {name: torch.zeros(sub.shape[0], dtype=value.dtype) for name, value in kernel_out.items()}

    triton_kernel.certify_rows_triton(rows, stop, MITM_MAX_SUPPORT, True, 1e-3, count_only)
    methods = torch.bincount(cert.method.long().flatten().cpu(), minlength=len(ThetaMethod) + 1)

    copy_target = torch.empty_like(rows)
    timings = {
        "kernel_s": median_device_seconds(
            lambda: triton_kernel.kernel_pass(rows, stop, MITM_MAX_SUPPORT, True, 1e-3), device, args.repeats
        ),
        "certify_s": median_seconds(lambda: certify(rows, backend="triton"), device, args.repeats),
        "copy_s": median_device_seconds(lambda: copy_target.copy_(rows), device, args.repeats),
        "sort_s": median_device_seconds(lambda: torch.sort(rows, dim=-1), device, args.repeats),
    }
    sweep = {}
    if args.sweep:
        for launch in SWEEP.get(n_keys, [(16, 1), (64, 1)]):
            run = lambda launch=launch: triton_kernel.kernel_pass(rows, stop, MITM_MAX_SUPPORT, True, 1e-3, launch)  # noqa: E731
            sweep[f"{launch[0]}x{launch[1]}"] = median_device_seconds(run, device, args.repeats)
    return {
        "rows": n_rows,
        "keys": n_keys,
        "mask": "causal" if causal else "full",
        "bytes": rows.numel() * rows.element_size(),
        **timings,
        "kernel_over_copy": timings["kernel_s"] / timings["copy_s"],
        "kernel_over_sort": timings["kernel_s"] / timings["sort_s"],
        "certify_over_copy": timings["certify_s"] / timings["copy_s"],
        "certify_over_sort": timings["certify_s"] / timings["sort_s"],
        "certified_float32_fraction": float((cert.width <= FLOAT32_WIDTH).double().mean()),
        "exact_fraction": float(cert.exact.double().mean()),
        "open_after_first_pass_fraction": float(
            ((kernel_out["method"] == 0) & (kernel_out["status"] == 0)).double().mean()
        ),
        "fallback_fraction": sum(sent_to_cpu) / n_rows,
        "methods": {
            ThetaMethod(code).name: int(count) for code, count in enumerate(methods.tolist()) if code and count
        },
        "sample_checked": checked,
        "sample_violations": violations,
        "launch_sweep_s": sweep,
    }


def print_table(records: list[dict[str, object]]) -> None:
    header = (f"{'rows × keys':>15} {'mask':>6} {'kernel ms':>10} {'certify ms':>11} {'copy ms':>8} {'sort ms':>9} "
              f"{'kern/copy':>9} {'kern/sort':>9} {'cert/copy':>9} {'f32 cert':>9} {'exact':>6} {'open 1':>7} "
              f"{'to CPU':>7} {'unsound':>7}")  # fmt: skip
    print(header)
    for r in records:
        print(f"{r['rows']:>7} × {r['keys']:<5} {r['mask']:>6} {1e3 * r['kernel_s']:>10.3f} "
              f"{1e3 * r['certify_s']:>11.3f} {1e3 * r['copy_s']:>8.3f} {1e3 * r['sort_s']:>9.3f} "
              f"{r['kernel_over_copy']:>9.2f} {r['kernel_over_sort']:>9.3f} {r['certify_over_copy']:>9.2f} "
              f"{r['certified_float32_fraction']:>9.5f} {r['exact_fraction']:>6.3f} "
              f"{r['open_after_first_pass_fraction']:>7.4f} {r['fallback_fraction']:>7.4f} "
              f"{r['sample_violations']:>3}/{r['sample_checked']:<4}")  # fmt: skip
        for launch, seconds in r["launch_sweep_s"].items():
            print(f"{'':>23} launch rows×warps {launch:>5}: kernel {1e3 * seconds:.3f} ms")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.interpret_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if args.interpret_smoke:
        device, shapes, results = torch.device("cpu"), args.shapes or SMOKE_SHAPES, args.results
        args.sample = min(args.sample, 64)
    elif torch.cuda.is_available():
        device, shapes, results = torch.device("cuda"), args.shapes or GPU_SHAPES, args.results or RESULTS
    else:
        print("bench/gpu_theta.py needs a CUDA device (torch.cuda.is_available() is False); "
              "run it on a GPU machine, or pass --interpret-smoke for a tiny CPU check", file=sys.stderr)  # fmt: skip
        return 2

    from attnsens.provenance import provenance

    records = [measure(n_rows, n_keys, causal, device, args) for n_rows, n_keys in shapes for causal in (False, True)]
    print_table(records)
    if results is not None:
        line = {
            "benchmark": "gpu_theta",
            "mode": "interpret-smoke" if args.interpret_smoke else "cuda",
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (Triton interpreter)",
            "repeats": args.repeats,
            "records": records,
            "provenance": provenance(),
        }
        append_record(results, line)
    unsound = sum(r["sample_violations"] for r in records)
    if unsound:
        print(f"{unsound} sampled rows contradict the CPU cascade: the kernel is unsound, see above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
