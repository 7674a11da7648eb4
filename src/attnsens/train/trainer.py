"""The training loop: AdamW, linear warmup + cosine decay, gradient clipping, log-spaced checkpoints, DDP.

Choices (docs/math.md §9.3): AdamW β = (0.9, 0.95), ε = 1e-8, weight decay on the Linear weight matrices only (not on
LayerNorm gains, biases, or the token/position embeddings — the token embedding is also the tied unembedding);
the gradient's global ℓ2 norm is clipped to 1.0; bf16 autocast on CUDA only (fp32 master weights), full fp32 on
CPU so that a resumed run is bit-identical to an uninterrupted one.

Observers are named callbacks, objects with any of ``on_train_begin(trainer)`` (once ``run`` starts, before this
process's first step: the trainer's ``data``, ``model`` and ``step``), ``on_step_end(step, model, batch)`` (after the
optimizer update; ``batch`` is the step's input ids), ``on_checkpoint(step, model, path)`` (``model`` is the bare
GPT) and ``on_record(record)`` (the step's record of the training table: loss, lr, tokens_seen, wall_time_s, and
eval_loss at checkpoints; for progress displays).
``attnsens.capture.SensitivityMonitor`` is such an object.
Under ``torchrun`` every rank trains its share of the global batch and rank 0 alone writes.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from attnsens._ranks import ranks
from attnsens.errors import CheckpointError, ConfigError
from attnsens.train.checkpoint import (
    checkpoint_steps,
    load_checkpoint,
    prune_deleted,
    restore_rng,
    resume_step,
    save_checkpoint,
)
from attnsens.train.data import TokenData
from attnsens.train.model import GPT, GPTConfig

GRADIENT_GROUPS = {"c_attn": "attn_qkv", "attn.c_proj": "attn_out", "c_fc": "mlp_in", "mlp.c_proj": "mlp_out"}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimization settings of one run; ``steps`` optimizer steps of ``batch_size`` blocks each."""

    steps: int
    seed: int = 0
    batch_size: int = 16
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    micro_batch_size: int | None = None  # gradient accumulation: blocks per forward/backward (None: whole batch)
    checkpoints: tuple[int, ...] | None = None  # None: checkpoint_steps(steps)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"TrainConfig.{name} must be a positive integer, got {getattr(self, name)!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"need lr > 0 and 0 <= min_lr_ratio <= 1, got lr={self.lr}, ratio={self.min_lr_ratio}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.adam_eps > 0 and self.weight_decay >= 0):
            raise ConfigError(f"invalid AdamW settings beta=({self.beta1}, {self.beta2}), eps={self.adam_eps}")
        if self.micro_batch_size is not None and (
            not isinstance(self.micro_batch_size, int) or self.micro_batch_size < 1
        ):
            raise ConfigError(f"micro_batch_size must be a positive integer or None, got {self.micro_batch_size!r}")
        if not self.grad_clip > 0:
            raise ConfigError(f"grad_clip must be > 0, got {self.grad_clip}")
        if self.checkpoints is not None:
            object.__setattr__(self, "checkpoints", tuple(sorted(set(self.checkpoints))))
            if not all(isinstance(s, int) and 0 <= s <= self.steps for s in self.checkpoints):
                raise ConfigError(f"checkpoint steps must be integers in [0, {self.steps}], got {self.checkpoints}")

    @property
    def checkpoint_schedule(self) -> tuple[int, ...]:
        return self.checkpoints if self.checkpoints is not None else tuple(checkpoint_steps(self.steps))

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (1-based): linear warmup to ``lr``, cosine to ``min_lr_ratio·lr``.

        Step 1 already has a nonzero rate, so checkpoints 0 and 1 always differ.
        """
        if step <= self.warmup_steps:
            return self.lr * step / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        floor = self.lr * self.min_lr_ratio
        return floor + 0.5 * (self.lr - floor) * (1.0 + math.cos(math.pi * progress))


def parameter_groups(model: GPT, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on Linear weight matrices; none on LayerNorm, biases and embeddings."""
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay = [p for p in model.parameters() if id(p) in linear_weights]
    no_decay = [p for p in model.parameters() if id(p) not in linear_weights]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def gradient_group(name: str) -> tuple[int, str]:
    """(layer, group) of a parameter name for the grad_norms table; layer -1 outside the blocks."""
    parts = name.split(".")
    layer = int(parts[1]) if parts[0] == "blocks" else -1
    if ".ln_" in name or name.startswith("ln_f"):
        return layer, "ln"
    if name.startswith(("wte", "wpe")):
        return layer, "embedding"
    if name.startswith("lm_head"):
        return layer, "unembedding"
    for fragment, group in GRADIENT_GROUPS.items():
        if fragment in name:
            return layer, group
    raise ConfigError(f"parameter {name!r} belongs to no gradient-norm group")


class Trainer:
    """Trains a GPT on TokenData; ``run()`` returns the training log as lists of records (schema tables)."""

    def __init__(
        self,
        model_config: GPTConfig,
        train_config: TrainConfig,
        data: TokenData,
        run_dir: str | Path,
        *,
        run_id: str | None = None,
        callbacks: Sequence[object] = (),
        device: str | torch.device | None = None,
    ) -> None:
        if model_config.max_positions < data.config.block_size and model_config.positions == "learned":
            raise ConfigError(
                f"block_size {data.config.block_size} exceeds the model's max_positions {model_config.max_positions}; "
                "lower the block size or raise max_positions"
            )
        self.model_config, self.train_config, self.data = model_config, train_config, data
        self.run_dir = Path(run_dir)
        self.run_id = run_id or self.run_dir.name
        self.callbacks = list(callbacks)
        if device is None:
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        self.device = torch.device(device)
        self.rank, self.world_size = ranks()
        if train_config.batch_size % self.world_size:
            raise ConfigError(
                f"batch_size {train_config.batch_size} is not divisible by {self.world_size} processes; "
                "pick a multiple of --nproc_per_node"
            )
        torch.manual_seed(train_config.seed)
        self.model = GPT(model_config).to(self.device)
        self.parallel_model = DistributedDataParallel(self.model) if self.world_size > 1 else self.model
        c = train_config
        self.optimizer = torch.optim.AdamW(
            parameter_groups(self.model, c.weight_decay), lr=c.lr, betas=(c.beta1, c.beta2), eps=c.adam_eps
        )
        self.named_parameters = list(self.model.named_parameters())
        self._groups = [gradient_group(name) for name, _ in self.named_parameters]
        self.step = 0
        self.inputs: Tensor | None = None
        self.training: list[dict[str, Any]] = []
        self.grad_norms: list[dict[str, Any]] = []
        self._elapsed = 0.0

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def _describe(self) -> dict[str, Any]:
        return {
            "model_config": asdict(self.model_config),
            "train_config": asdict(self.train_config),
            "data_config": asdict(self.data.config),
            "corpus_sha256": self.data.corpus_sha256,
        }

    def resume(self, *, extend: bool = False) -> bool:
        """Load the checkpoint to continue from; False when there is none (training starts from scratch).

        That is the latest registered checkpoint, unless a scheduled one below it is missing (its directory was
        deleted): then the last one before the gap, so the run rebuilds every checkpoint after it. With ``extend``
        the run may continue to more ``steps`` than it was started with (every other setting must match): the
        steps taken keep their learning rates and the cosine decay is stretched to the new total from the resumed
        step on, so the result differs from a run started with the larger ``steps``.
        """
        if self.is_writer:
            prune_deleted(self.run_dir)
        step = resume_step(self.run_dir, self.train_config.checkpoint_schedule)
        if step is None:
            return False
        checkpoint = load_checkpoint(self.run_dir, step)
        state = checkpoint["state"]
        recorded = {key: state[key] for key in self._describe()}
        current = _jsonable(self._describe())
        if extend:
            recorded_steps = recorded["train_config"]["steps"]
            if recorded_steps > self.train_config.steps:
                raise CheckpointError(
                    f"cannot extend {self.run_dir} from {recorded_steps} to {self.train_config.steps} steps; "
                    f"give --steps {recorded_steps} or more"
                )
            recorded = {**recorded, "train_config": {**recorded["train_config"], "steps": self.train_config.steps}}
        if recorded != current:
            changed = [key for key in recorded if recorded[key] != current[key]]
            raise CheckpointError(
                f"cannot resume {self.run_dir}: its {', '.join(changed)} differ from this command's; "
                "rerun with the original settings or use a new --out directory"
            )
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        restore_rng(checkpoint["rng"])
        self.step, self._elapsed = state["step"], state["wall_time_s"]
        self.training, self.grad_norms = state["training"], state["grad_norms"]
        return True

    def run(self) -> dict[str, list[dict[str, Any]]]:
        """Train up to ``train_config.steps``, checkpointing on the schedule. Returns {"training", "grad_norms"}."""
        config = self.train_config
        schedule = set(config.checkpoint_schedule)
        for callback in self.callbacks:
            if hasattr(callback, "on_train_begin"):
                callback.on_train_begin(self)
        if self.step == 0 and 0 in schedule:  # the same decision on every rank: _checkpoint ends in a barrier
            self._checkpoint()
        start = time.perf_counter() - self._elapsed
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda" else nullcontext()
        while self.step < config.steps:
            self.step += 1
            lr = config.lr_at(self.step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            inputs, targets = self.data.train_batch(
                config.seed, self.step, config.batch_size, rank=self.rank, world_size=self.world_size
            )
            self.inputs, targets = inputs.to(self.device), targets.to(self.device)
            loss = self._accumulate_gradients(self.inputs, targets, autocast)
            global_norm, norms = self._gradient_norms()
            clip = (config.grad_clip / (global_norm + 1e-6)).clamp(max=1.0)  # as clip_grad_norm_, norm reused
            torch._foreach_mul_(self._gradients(), clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            record = self._record(loss, lr, global_norm, norms, time.perf_counter() - start)
            for callback in self.callbacks:
                if hasattr(callback, "on_step_end"):
                    callback.on_step_end(self.step, self.model, self.inputs)
            if self.step in schedule:
                self._elapsed = time.perf_counter() - start
                record["eval_loss"] = self.evaluate()
                self._checkpoint()
            for callback in self.callbacks:
                if hasattr(callback, "on_record"):
                    callback.on_record(record)
        return {"training": self.training, "grad_norms": self.grad_norms}

    def _accumulate_gradients(self, inputs: Tensor, targets: Tensor, autocast: Any) -> Tensor:
        """Backward over the step's batch in micro-batches; returns the batch's mean loss (detached)."""
        size = self.train_config.micro_batch_size or len(inputs)
        pieces = list(zip(inputs.split(size), targets.split(size), strict=True))
        total = torch.zeros((), device=self.device)
        for index, (x, y) in enumerate(pieces):
            last = index == len(pieces) - 1
            # DDP all-reduces gradients only on the last micro-batch of the step.
            ddp = self.parallel_model if isinstance(self.parallel_model, DistributedDataParallel) else None
            sync = ddp.no_sync() if ddp is not None and not last else nullcontext()  # DDP: world_size > 1
            with sync, autocast:
                logits = self.parallel_model(x)  # (batch, query, vocab)
                loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten()) * (len(x) / len(inputs))
            loss.backward()
            total += loss.detach()
        return total

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss of the current weights on the fixed held-out batch."""
        was_training = self.model.training
        self.model.eval()
        inputs, targets = self.data.eval_batch()
        loss = self.model.loss(inputs.to(self.device), targets.to(self.device)).item()
        self.model.train(was_training)
        return loss

    def _gradient_norms(self) -> tuple[Tensor, Tensor]:
        """ℓ2 norm of every parameter's gradient (one tensor, no host sync) and the global norm."""
        norms = torch.stack(torch._foreach_norm(self._gradients())).float()
        return norms.square().sum().sqrt(), norms

    def _gradients(self) -> list[Tensor]:
        """Every parameter's gradient after the step's backward pass, in ``named_parameters`` order (every parameter
        enters the loss, so none may be missing: the norms are recorded by parameter name)."""
        grads = [p.grad for _, p in self.named_parameters]
        missing = [name for (name, _), grad in zip(self.named_parameters, grads, strict=True) if grad is None]
        if missing:
            raise ConfigError(f"parameters {missing} received no gradient; every parameter must enter the loss")
        return [grad for grad in grads if grad is not None]

    def _record(self, loss: Tensor, lr: float, global_norm: Tensor, norms: Tensor, elapsed: float) -> dict[str, Any]:
        loss = loss.detach().float()
        if self.world_size > 1:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        values = torch.cat([loss[None], global_norm[None], norms]).tolist()
        common = {"run_id": self.run_id, "seed": self.train_config.seed, "step": self.step}
        record = {
            **common,
            "loss": values[0],
            "eval_loss": None,
            "lr": lr,
            "grad_norm_global": values[1],
            "tokens_seen": self.step * self.train_config.batch_size * self.data.config.block_size,
            "wall_time_s": elapsed,
        }
        squares: dict[tuple[int, str], float] = {}
        for key, value in zip(self._groups, values[2:], strict=True):
            squares[key] = squares.get(key, 0.0) + value * value
        self.grad_norms.extend(
            {**common, "layer": layer, "group": group, "grad_norm": math.sqrt(total)}
            for (layer, group), total in squares.items()
        )
        self.training.append(record)
        return record

    def _checkpoint(self) -> None:
        if self.is_writer:
            path = save_checkpoint(
                self.run_dir,
                self.step,
                model_state=self.model.state_dict(),
                optimizer=self.optimizer,
                state={
                    **self._describe(),
                    "run_id": self.run_id,
                    "wall_time_s": self._elapsed,
                    "training": self.training,
                    "grad_norms": self.grad_norms,
                },
            )
            for callback in self.callbacks:
                if hasattr(callback, "on_checkpoint"):
                    callback.on_checkpoint(self.step, self.model, path)
        if self.world_size > 1:
            dist.barrier()


def init_distributed() -> None:
    """Join the torchrun process group when launched by torchrun (WORLD_SIZE > 1); gloo on CPU, nccl on CUDA."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))
