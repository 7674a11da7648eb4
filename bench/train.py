"""Tokens/s of the attnsens trainer (bare and with the sensitivity monitor) vs a bare PyTorch loop.

All three loops train the same GPT preset on the same blocks of the same corpus with the same AdamW settings
and gradient clipping; the trainer adds the gradient-norm log, its records and callbacks. Runs are interleaved
and repeated, the median of each is reported, and the ratios trainer / bare loop are the figure (goal ≥ 0.9).

    .venv/bin/python bench/train.py [--config tiny] [--steps 60] [--repeats 3] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from _jsonl import append_record
from attnsens.capture import SensitivityMonitor
from attnsens.provenance import provenance
from attnsens.train.data import prepare_data
from attnsens.train.model import GPT, preset
from attnsens.train.run import default_data_config
from attnsens.train.trainer import TrainConfig, Trainer, parameter_groups

RESULTS = Path(__file__).parent / "results" / "train.jsonl"


def bare_loop(model_config, train_config: TrainConfig, data) -> float:
    """Seconds for ``steps`` steps of the plainest equivalent loop."""
    torch.manual_seed(train_config.seed)
    model = GPT(model_config)
    c = train_config
    optimizer = torch.optim.AdamW(
        parameter_groups(model, c.weight_decay), lr=c.lr, betas=(c.beta1, c.beta2), eps=c.adam_eps
    )
    start = time.perf_counter()
    for step in range(1, c.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = c.lr_at(step)
        inputs, targets = data.train_batch(c.seed, step, c.batch_size)
        loss = model.loss(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # the loop reads its loss, as any loop that logs does
    return time.perf_counter() - start


def trainer_loop(model_config, train_config: TrainConfig, data, callbacks: list) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(model_config, train_config, data, run_dir, callbacks=callbacks, device="cpu")
        start = time.perf_counter()
        trainer.run()
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--monitor-every", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.steps < args.monitor_every:
        parser.error(f"--steps ({args.steps}) must reach --monitor-every ({args.monitor_every}) so the monitor probes")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    model_config = preset(args.config)
    train_config = TrainConfig(steps=args.steps, batch_size=args.batch_size, warmup_steps=10, checkpoints=())
    with tempfile.TemporaryDirectory() as data_dir:
        data = prepare_data(default_data_config(model_config), data_dir)
    tokens = args.steps * args.batch_size * model_config.max_positions

    timings: dict[str, list[float]] = {"bare_loop": [], "trainer": [], "trainer_with_monitor": []}
    probe = data.eval_batch()[0]
    for _ in range(args.repeats):
        timings["bare_loop"].append(bare_loop(model_config, train_config, data))
        timings["trainer"].append(trainer_loop(model_config, train_config, data, []))
        monitor = SensitivityMonitor(probe, every=args.monitor_every)
        timings["trainer_with_monitor"].append(trainer_loop(model_config, train_config, data, [monitor]))

    tokens_per_s = {name: tokens / statistics.median(seconds) for name, seconds in timings.items()}
    baseline = tokens_per_s["bare_loop"]
    print(
        f"{args.config}: {args.steps} steps × {args.batch_size} × {model_config.max_positions} tokens, "
        f"median of {args.repeats}, {torch.get_num_threads()} threads"
    )
    for name, value in tokens_per_s.items():
        print(f"  {name:<22} {value:>10.0f} tokens/s   ratio to bare loop {value / baseline:.3f}")
    record = {
        "bench": "train",
        "config": args.config,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "block_size": model_config.max_positions,
        "repeats": args.repeats,
        "monitor_every": args.monitor_every,
        "tokens_per_s": tokens_per_s,
        "ratio_trainer": tokens_per_s["trainer"] / baseline,
        "ratio_trainer_with_monitor": tokens_per_s["trainer_with_monitor"] / baseline,
        "threads": torch.get_num_threads(),
        "provenance": provenance(),
    }
    append_record(RESULTS, record)


if __name__ == "__main__":
    main()
