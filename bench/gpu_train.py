"""Step time, tokens/s and MFU of the attnsens trainer on the 774M (GPT-2 large) config, beside a bare loop.

Needs CUDA (bf16 autocast, fp32 master weights). Both loops train the same model on the same random token
blocks; the trainer adds the gradient-norm log and records. Model FLOPs per token follow the PaLM accounting,
6·N + 12·n_layer·d_model·T (weights forward+backward, plus attention scores and mixing); MFU divides the
achieved FLOP/s by the chip's dense bf16 peak (``--peak-tflops``, default from the device name).

    python bench/gpu_train.py [--config large] [--micro-batch 8] [--steps 10] [--warmup 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from _jsonl import append_record
from attnsens.provenance import provenance
from attnsens.train.data import DataConfig, TokenData
from attnsens.train.model import GPT, preset
from attnsens.train.trainer import TrainConfig, Trainer, parameter_groups

RESULTS = Path(__file__).parent / "results" / "gpu_train.jsonl"
DENSE_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


def peak_tflops(name: str) -> float | None:
    return next((value for key, value in DENSE_BF16_TFLOPS.items() if key in name), None)


def random_tokens(model_config, block_size: int) -> TokenData:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model_config.vocab_size, (4_000_000,), generator=generator)
    config = DataConfig(vocab_size=model_config.vocab_size, block_size=block_size, eval_sequences=2)
    return TokenData(
        config=config, train_tokens=tokens[:-100_000], eval_tokens=tokens[-100_000:], corpus_sha256="random"
    )


def bare_step_seconds(model_config, train_config: TrainConfig, data: TokenData, warmup: int) -> float:
    torch.manual_seed(0)
    model = GPT(model_config).cuda()
    c = train_config
    optimizer = torch.optim.AdamW(parameter_groups(model, c.weight_decay), lr=c.lr, betas=(c.beta1, c.beta2))
    times = []
    for step in range(1, c.steps + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        inputs, targets = (t.cuda(non_blocking=True) for t in data.train_batch(0, step, c.batch_size))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model.loss(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - start)
    del model, optimizer
    torch.cuda.empty_cache()
    return sum(times[warmup:]) / len(times[warmup:])


class StepTimer:
    """A trainer callback recording the wall time between consecutive step ends."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, step: int, model: torch.nn.Module, batch: torch.Tensor) -> None:
        torch.cuda.synchronize()
        self.ends.append(time.perf_counter())


def trainer_step_seconds(model_config, train_config: TrainConfig, data: TokenData, warmup: int) -> float:
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(model_config, train_config, data, run_dir, callbacks=[timer], device="cuda")
        trainer.run()
        del trainer
    torch.cuda.empty_cache()
    gaps = [b - a for a, b in zip(timer.ends[warmup:], timer.ends[warmup + 1 :], strict=False)]
    return sum(gaps) / len(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="large")
    parser.add_argument("--micro-batch", type=int, default=8, help="blocks of max_positions tokens per step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="steps excluded from the timing")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of the chip")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/gpu_train.py needs a CUDA device and none is visible; run it on a GPU machine")
    if args.steps <= args.warmup + 1:
        sys.exit(f"--steps ({args.steps}) must exceed --warmup + 1 ({args.warmup + 1}) to leave timed steps")

    model_config = preset(args.config)
    block = model_config.max_positions
    train_config = TrainConfig(steps=args.steps, batch_size=args.micro_batch, warmup_steps=2, checkpoints=())
    data = random_tokens(model_config, block)
    device_name = torch.cuda.get_device_name()
    peak = args.peak_tflops or peak_tflops(device_name)
    with torch.device("meta"):
        n_params = GPT(model_config).n_params()
    flops_per_token = 6 * n_params + 12 * model_config.n_layer * model_config.d_model * block
    tokens_per_step = args.micro_batch * block

    results = {}
    for name, measure in (("bare_loop", bare_step_seconds), ("trainer", trainer_step_seconds)):
        torch.cuda.reset_peak_memory_stats()
        seconds = measure(model_config, train_config, data, args.warmup)
        tokens_per_s = tokens_per_step / seconds
        results[name] = {
            "step_s": seconds,
            "tokens_per_s": tokens_per_s,
            "mfu": tokens_per_s * flops_per_token / (peak * 1e12) if peak else None,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        }
    ratio = results["trainer"]["tokens_per_s"] / results["bare_loop"]["tokens_per_s"]
    print(f"{args.config} ({n_params:,} parameters) on {device_name}: {args.micro_batch} × {block} tokens per step")
    for name, r in results.items():
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a (pass --peak-tflops)"
        print(
            f"  {name:<10} step {r['step_s'] * 1e3:8.1f} ms  {r['tokens_per_s']:10.0f} tokens/s  MFU {mfu}  "
            f"peak memory {r['peak_memory_gib']:.1f} GiB"
        )
    print(f"  trainer / bare loop tokens/s: {ratio:.3f}")
    record = {
        "bench": "gpu_train",
        "config": args.config,
        "n_params": n_params,
        "device": device_name,
        "peak_tflops": peak,
        "micro_batch": args.micro_batch,
        "block_size": block,
        "steps": args.steps,
        "warmup": args.warmup,
        "results": results,
        "ratio_trainer": ratio,
        "provenance": provenance(),
    }
    append_record(RESULTS, record)


if __name__ == "__main__":
    main()
