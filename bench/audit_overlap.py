"""Would overlapping a layer's row statistics with the next layer's forward shorten an audit on this machine?

An audit runs the model's forward and, inside each layer, the row-statistics kernel (θ certificate and moments)
on the rows it recomputes. Overlapping the two pays only where the forward leaves cores idle that the kernel could
use. This measures that bound directly, on SmolLM2 and the Shakespeare corpus, before any code is restructured:

1. one audit at ``--seq-len`` tokens, its kernel calls recorded: the float32 chunks of rows it reduced;
2. alternating, ``--repeats`` times: the plain sdpa forward alone (F); the kernel over every recorded chunk alone
   (K, the audit's whole statistics work); and both at once, the kernel in a second Python thread (C; numba's
   parallel kernels release the GIL while their loop runs, so the two really do run side by side).

Overlap can save at most (F + K − C) / (F + K) of the pair; a saving near 0 means both already keep every core
busy, and an overlapped audit would take what the serial one takes. Prints each repeat and the medians; appends
one JSON line to bench/results/audit.jsonl (``"bench": "audit_overlap"``).

Usage: ``python bench/audit_overlap.py [--seq-len 512] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import psutil
import torch

from _jsonl import append_record

RESULTS = Path(__file__).resolve().parent / "results" / "audit.jsonl"


def recorded_chunks(adapter: object, ids: torch.Tensor) -> list[torch.Tensor]:
    """The float32 rows of every chunk one audit of ``ids`` hands to the row-statistics kernel, in order."""
    import attnsens as A
    from attnsens.capture import _numba_row_statistics as kernels

    compiled = kernels.row_statistics_rows
    chunks: list[torch.Tensor] = []

    def recording(x: object, *args: object) -> object:
        chunks.append(torch.from_numpy(x.copy()))  # type: ignore[attr-defined]
        return compiled(x, *args)

    kernels.row_statistics_rows = recording
    try:
        A.study.audit(adapter, ids)
    finally:
        kernels.row_statistics_rows = compiled
    return chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import attnsens as A
    from attnsens.capture import row_statistics
    from attnsens.provenance import provenance
    from attnsens.train.data import read_documents

    adapter = A.models.load("smollm2")
    ids = adapter.encode(read_documents(None)[0][: 16 * args.seq_len])[:, : args.seq_len]
    with torch.no_grad():
        A.study.audit(adapter, ids[:, :128])  # compiled kernels loaded before anything is timed
        chunks = recorded_chunks(adapter, ids)

        def forward() -> None:
            adapter.module(input_ids=ids)

        def kernel() -> None:
            for chunk in chunks:
                row_statistics(chunk)

        def both() -> None:
            side = threading.Thread(target=kernel)
            side.start()
            forward()
            side.join()

        def timed(call: object) -> float:
            start = time.perf_counter()
            call()  # type: ignore[operator]
            return time.perf_counter() - start

        forward(), kernel(), both()  # warm-up
        runs = []
        for repeat in range(args.repeats):
            f, k, c = timed(forward), timed(kernel), timed(both)
            runs.append({"forward_s": f, "statistics_s": k, "concurrent_s": c, "saving": (f + k - c) / (f + k)})
            saving = runs[-1]["saving"]
            print(
                f"repeat {repeat}: forward {f:.3f} s, statistics {k:.3f} s, sum {f + k:.3f} s, "
                f"both at once {c:.3f} s, saving {saving:+.1%}",
                flush=True,
            )
    medians = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    rows = sum(chunk.shape[0] for chunk in chunks)
    print(
        f"n={args.seq_len}: {len(chunks)} chunks, {rows:,} rows; medians: forward {medians['forward_s']:.3f} s, "
        f"statistics {medians['statistics_s']:.3f} s, both at once {medians['concurrent_s']:.3f} s; "
        f"most an overlap could save: {medians['saving']:+.1%} of forward + statistics "
        f"({torch.get_num_threads()} torch threads)"
    )
    append_record(
        RESULTS,
        {
            "bench": "audit_overlap",
            "model": "smollm2",
            "seq_len": args.seq_len,
            "torch_threads": torch.get_num_threads(),
            "load_average_1min": psutil.getloadavg()[0],
            "chunks": len(chunks),
            "rows": rows,
            "runs": runs,
            **{f"median_{name}": value for name, value in medians.items()},
            "provenance": provenance(),
        },
    )


if __name__ == "__main__":
    main()
