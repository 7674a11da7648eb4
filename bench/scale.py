"""Audits past one process and one device: torchrun ranks against one process, disk offload against memory.

1. The same audit (``A.study.audit`` of B windows of N tokens of the Shakespeare corpus into a run folder) run
   once in one process with all the threads and once under ``torchrun --nproc_per_node=RANKS`` with the threads
   divided among the ranks; the ratio is the ranks' time ÷ one process's, from every rank ready to the summary
   written (start-up, the model's load and the findings, which one process computes either way, excluded).
2. A tiny random Llama saved to a folder, audited in memory and with every other block on disk
   (``device_map`` with ``"disk"``, accelerate's big-model loading); the ratio is offloaded ÷ in memory, the audit
   alone (the load excluded), median of ``--repeats``.

    .venv/bin/python bench/scale.py [--batch 32] [--seq-len 256] [--ranks 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from _jsonl import append_record
from attnsens.provenance import provenance

RESULTS = Path(__file__).parent / "results" / "scale.jsonl"
REPO = Path(__file__).resolve().parents[1]


AUDIT_SCRIPT = """
import sys, time
import torch.distributed as dist
import attnsens as A
from attnsens.train.data import read_documents
from attnsens.train.trainer import init_distributed

init_distributed()
model = A.models.load(sys.argv[1])
text = "\\n\\n".join(read_documents(None))  # the built-in corpus, as attnsens audit reads it
if dist.is_initialized():
    dist.barrier()
start = time.perf_counter()
A.study.audit(model, text, seq_len=int(sys.argv[3]), n_sequences=int(sys.argv[2]), out_dir=sys.argv[4], note=print)
if not dist.is_initialized() or dist.get_rank() == 0:
    print(f"audit_s {time.perf_counter() - start}")
"""


def timed_audit(launcher: list[str], arguments: list[str], threads: int) -> float:
    """Seconds of the audit proper (model loaded, every rank ready, until the summary is written) of one run of
    ``AUDIT_SCRIPT`` launched by ``launcher`` with ``threads`` torch threads a process."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "NUMBA_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(REPO / "src")}  # fmt: skip
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(AUDIT_SCRIPT)
    try:
        done = subprocess.run([*launcher, script.name, *arguments], env=env, check=True, capture_output=True, text=True)
    finally:
        os.unlink(script.name)
    return float(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("audit_s")))


def ranks_against_one_process(model: str, batch: int, seq_len: int, ranks: int, threads: int) -> dict[str, float]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    with tempfile.TemporaryDirectory() as folder:
        arguments = [model, str(batch), str(seq_len)]
        one = timed_audit([sys.executable], [*arguments, f"{folder}/one"], threads)
        shared = timed_audit(torchrun, [*arguments, f"{folder}/shared"], max(1, threads // ranks))
    return {"one_process_s": one, "ranks_s": shared, "ranks_ratio": shared / one}


def offload_against_memory(layers: int, width: int, seq_len: int, repeats: int) -> dict[str, float]:
    from transformers import LlamaConfig, LlamaForCausalLM

    import attnsens as A

    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=width, intermediate_size=4 * width, num_attention_heads=width // 64,
        num_key_value_heads=width // 64, vocab_size=4096, max_position_embeddings=4 * seq_len,
    )  # fmt: skip
    ids = torch.randint(0, 4096, (4, seq_len), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as folder:
        LlamaForCausalLM(config).save_pretrained(folder)
        on_disk = {"embed_tokens": "cpu", "norm": "cpu", "rotary_emb": "cpu"}
        on_disk |= {f"layers.{i}": "disk" if i % 2 else "cpu" for i in range(layers)}
        models = {
            "memory": A.models.load(folder),
            "disk": A.models.load(folder, device_map=on_disk, offload_folder=f"{folder}/offload"),
        }
        seconds: dict[str, list[float]] = {name: [] for name in models}
        for model in models.values():  # untimed: the first audit of a process compiles and allocates
            A.study.audit(model, ids, note=lambda _: None)
        for _ in range(repeats):
            for name, model in models.items():  # alternated, so that drift of the machine hits both alike
                start = time.perf_counter()
                A.study.audit(model, ids, note=lambda _: None)
                seconds[name].append(time.perf_counter() - start)
    memory, disk = (statistics.median(seconds[name]) for name in ("memory", "disk"))
    return {"memory_s": memory, "disk_s": disk, "offload_ratio": disk / memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:lnfree")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shared = ranks_against_one_process(args.model, args.batch, args.seq_len, args.ranks, args.threads)
    print(
        f"audit of {args.batch} × {args.seq_len} tokens of {args.model}: one process ({args.threads} threads) "
        f"{shared['one_process_s']:.1f} s, {args.ranks} ranks ({max(1, args.threads // args.ranks)} thread each) "
        f"{shared['ranks_s']:.1f} s, ratio {shared['ranks_ratio']:.2f}"
    )
    torch.set_num_threads(args.threads)
    offload = offload_against_memory(args.layers, args.width, args.seq_len, args.repeats)
    print(
        f"audit of a {args.layers}-layer, d={args.width} Llama, 4 × {args.seq_len} tokens: in memory "
        f"{offload['memory_s']:.2f} s, every other block on disk {offload['disk_s']:.2f} s, "
        f"ratio {offload['offload_ratio']:.2f}"
    )
    append_record(RESULTS, {"benchmark": "scale", **vars(args), **shared, **offload, **provenance()})


if __name__ == "__main__":
    main()
