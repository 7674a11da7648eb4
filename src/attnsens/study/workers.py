"""Training a study's runs side by side on the CPU: one process per run, each with its share of the threads.

A 0.94M-parameter GPT does not keep two cores busy: its matrix products are too small for torch's thread pool to
pay off (docs/performance.md). Two processes with one thread each train two runs in about the time one
takes. A study therefore fixes each run's threads from the configuration and the machine alone,
``threads_per_run = max(1, threads // runs)``, and trains up to ``threads // threads_per_run`` runs at once. On the
CPU a run's result depends on its thread count (the order of float sums), not on how many runs train beside it, so
an interrupted study that resumes on the same machine continues every run bit for bit, whichever of them were
finished.

Each worker is a fresh interpreter (``python -m attnsens.study.workers``, so nothing of the caller's script runs
again in it). It reads its job from stdin, with the study's token stream, tokenized once by the parent, and writes
one JSON line per training record and checkpoint, then the run's log. The parent relays the records to the study's
callbacks and writes every manifest unit, so the study's writer lock stays with one process.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from queue import Queue
from typing import TYPE_CHECKING, Any

import torch

from attnsens import errors

if TYPE_CHECKING:
    from attnsens.study.study import StudyConfig
    from attnsens.train.data import TokenData


def threads_per_run(runs: int, threads: int | None = None) -> int:
    """Threads each of ``runs`` training runs gets out of ``threads`` (default: torch's count in this process)."""
    threads = torch.get_num_threads() if threads is None else threads
    return max(1, threads // max(1, runs))


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` while the block runs."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def relays_only_records(callbacks: Sequence[object]) -> bool:
    """Whether every callback reads only ``on_record`` (what a worker process can relay: not the model)."""
    return not any(hasattr(c, "on_step_end") or hasattr(c, "on_checkpoint") for c in callbacks)


@dataclass(frozen=True)
class TrainedRun:
    """What a worker sends back: the run's training and gradient-norm records and its seconds."""

    placement: str
    seed: int
    training: list[dict[str, Any]]
    grad_norms: list[dict[str, Any]]
    seconds: float


def train_in_processes(
    config: StudyConfig,
    out: Path,
    runs: Sequence[tuple[str, int]],
    data: TokenData,
    *,
    threads: int,
    workers: int,
    device: str | None,
    on_record: Callable[[dict[str, Any]], None],
    on_checkpoint: Callable[[str, int, float], None],
    on_done: Callable[[TrainedRun], None],
) -> None:
    """Train ``runs`` (placement, seed) in up to ``workers`` worker processes of ``threads`` threads each.

    ``on_record(record)`` and ``on_checkpoint(label, step, seconds)`` are called in this process as the workers
    report; ``on_done(result)`` as each run finishes, in the order they finish. A worker's AttnsensError is raised
    here as itself (other failures as a RuntimeError with the worker's last lines), after the other workers are
    stopped; so is an interrupt.
    """
    messages: Queue[tuple[int, dict[str, Any] | None]] = Queue()
    waiting = list(runs)
    running: dict[int, tuple[subprocess.Popen[bytes], tuple[str, int], list[str]]] = {}
    number = 0
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                run = waiting.pop(0)
                job = pickle.dumps(
                    {"config": config, "out": out, "run": run, "data": data, "device": device, "threads": threads}
                )
                process = subprocess.Popen(
                    [sys.executable, "-m", "attnsens.study.workers"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                )  # fmt: skip
                assert process.stdin is not None
                process.stdin.write(job)
                process.stdin.close()
                stderr: list[str] = []
                running[number] = (process, run, stderr)
                threading.Thread(target=_read_lines, args=(number, process, messages, stderr), daemon=True).start()
                number += 1
            key, message = messages.get()
            if message is None:  # the worker's output ended
                process, run, stderr = running.pop(key)
                if process.wait() != 0:
                    raise RuntimeError(
                        f"training {run[0]} seed {run[1]} failed in its worker process: " + " | ".join(stderr[-5:])
                    )
            elif "record" in message:
                on_record(message["record"])
            elif "checkpoint" in message:
                on_checkpoint(*message["checkpoint"])
            elif "error" in message:
                raise _rebuilt(message["error"], message["message"])
            else:
                on_done(TrainedRun(**message["done"]))
    finally:
        for process, _, _ in running.values():
            process.terminate()
        for process, _, _ in running.values():
            process.wait()


def _rebuilt(name: str, message: str) -> errors.AttnsensError:
    """A worker's AttnsensError as its own class where that takes the message alone, else as an AttnsensError."""
    kind = getattr(errors, name, None)
    if isinstance(kind, type) and issubclass(kind, errors.AttnsensError):
        with contextlib.suppress(TypeError):
            return kind(message)
    return errors.AttnsensError(message)


def _read_lines(
    key: int, process: subprocess.Popen[bytes], messages: Queue[tuple[int, dict[str, Any] | None]], stderr: list[str]
) -> None:
    """Every JSON line of a worker's stdout to ``messages``, then None; its stderr lines into ``stderr``."""
    assert process.stdout is not None and process.stderr is not None
    collect = threading.Thread(
        target=lambda: stderr.extend(line.decode(errors="replace").rstrip() for line in process.stderr or ()),
        daemon=True,
    )
    collect.start()
    for line in process.stdout:
        messages.put((key, json.loads(line)))
    collect.join()
    messages.put((key, None))


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message, default=float) + "\n")
    sys.stdout.flush()


class _Relay:
    """Trainer callback in a worker: every record, and a note per checkpoint, as JSON lines on stdout."""

    def __init__(self, label: str) -> None:
        self.label, self.started = label, time.perf_counter()

    def on_record(self, record: dict[str, Any]) -> None:
        _send({"record": record})

    def on_checkpoint(self, step: int, model: torch.nn.Module, path: Path) -> None:
        _send({"checkpoint": [self.label, step, time.perf_counter() - self.started]})


def _train_run(
    config: StudyConfig, out: Path, placement: str, seed: int, data: TokenData, device: str | None
) -> TrainedRun:
    """One run, in a worker process, on the token stream the parent tokenized."""
    from attnsens.study.study import train_run

    started = time.perf_counter()
    relay = _Relay(f"{placement} seed {seed}")
    result = train_run(config, out, placement, seed, data, device=device, callbacks=[relay])
    return TrainedRun(
        placement=placement,
        seed=seed,
        training=list(result.training),
        grad_norms=list(result.grad_norms),
        seconds=time.perf_counter() - started,
    )


def _die_with_parent() -> None:
    """End this worker when its parent ends, however it ends (kill -9 included): a worker left running would go on
    writing checkpoints into a study folder whose lock it does not hold. Linux delivers SIGKILL on the parent's
    death (prctl PR_SET_PDEATHSIG); elsewhere a thread polls the parent's pid."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent ended before the request took effect
                os._exit(1)
            return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _main() -> None:
    """A worker: one pickled job from the parent on stdin (the parent's own objects, never a file's), JSON out."""
    _die_with_parent()
    job = pickle.loads(sys.stdin.buffer.read())
    torch.set_num_threads(job["threads"])
    try:
        placement, seed = job["run"]
        result = _train_run(job["config"], job["out"], placement, seed, job["data"], job["device"])
    except errors.AttnsensError as err:
        _send({"error": type(err).__name__, "message": str(err)})
        return
    _send({"done": vars(result)})


if __name__ == "__main__":
    _main()
