"""Tokens/s of a study's training: runs side by side in worker processes (one thread each) vs one after another.

Both train the same runs (the ``tiny`` preset, seeds 0 and 1, ``--steps`` steps each) through ``run_study``'s own
training (``attnsens.study.study._train_runs``): the baseline with all of torch's threads in this process, one run
after another, as studies trained before; the figure with ``attnsens.study.workers``, each run in its own process
with ``threads // runs`` threads. The ratio is side by side / one after another, in tokens/s (goal ≥ 1.3 on 2 cores).

    .venv/bin/python bench/study_training.py [--steps 80] [--threads 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from _jsonl import append_record
from attnsens.provenance import provenance
from attnsens.store import Manifest
from attnsens.study import workers
from attnsens.study.study import StudyConfig, _train_runs, _train_seed
from attnsens.train.data import prepare_data

RESULTS = Path(__file__).parent / "results" / "study_training.jsonl"


def train_once(config: StudyConfig, *, side_by_side: bool) -> float:
    """Seconds to train every run of ``config`` into a fresh folder, side by side or one after another."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        data = prepare_data(config.data, out / "data")
        manifest = Manifest.open(out, config=config.describe())
        runs = [(p, seed) for p in config.norm_placements for seed in config.seeds]
        threads = torch.get_num_threads()
        start = time.perf_counter()
        if side_by_side:
            _train_runs(
                config, out, runs, data, manifest, {run: {} for run in runs}, rank=0, world=1, device="cpu",
                say=lambda _: None, callbacks=(),
            )  # fmt: skip
        else:
            for run in runs:  # the former study: every run in this process with all the threads
                with workers.torch_threads(threads):
                    _train_seed(config, out, *run, data, manifest, rank=0, device="cpu", say=lambda _: None)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = StudyConfig.from_preset("tiny", seeds=(0, 1), steps=args.steps, bounds=False)
    tokens = len(config.seeds) * args.steps * config.train.batch_size * config.data.block_size
    serial = train_once(config, side_by_side=False)
    parallel = train_once(config, side_by_side=True)
    record = {
        "benchmark": "study_training",
        "steps": args.steps,
        "threads": args.threads,
        "runs": len(config.seeds),
        "one_after_another_tokens_per_s": tokens / serial,
        "side_by_side_tokens_per_s": tokens / parallel,
        "ratio": serial / parallel,
        **provenance(),
    }
    print(
        f"{len(config.seeds)} tiny runs × {args.steps} steps, {args.threads} threads: one after another "
        f"{tokens / serial:,.0f} tokens/s, side by side {tokens / parallel:,.0f} tokens/s, "
        f"ratio {serial / parallel:.2f}"
    )
    append_record(RESULTS, record)


if __name__ == "__main__":
    main()
