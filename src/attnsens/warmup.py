"""Compile every numba kernel of attnsens once, ahead of the first command (``attnsens warmup``, ``make setup``).

A kernel compiles on its first call with a new type of input, once per version of attnsens and machine; the machine
code then lies in the on-disk cache (``attnsens._numba_cache``), shared by every checkout and install of the same
version. Each stage below makes one small call through the public function a user calls, so that exactly the
specialisations real calls need are compiled: float32 and float64 rows, on one thread and on the thread pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class KernelWarmup:
    """One stage of ``warm_up``: what it readied, how long it took, and whether it compiled (False: the machine
    code was loaded from the on-disk cache, or was in this process already)."""

    name: str
    seconds: float
    compiled: bool


def warmup_stages() -> tuple[tuple[str, Callable[[], Any], tuple[Any, ...]], ...]:
    """(name, call, kernels the call runs) per stage, in the order a first ``attnsens theta`` needs them."""
    import torch

    from attnsens.capture import kernels as capture_kernels
    from attnsens.capture.statistics import row_moments, row_statistics
    from attnsens.theta import certify, softmax_jacobian_inf_to_one_norm
    from attnsens.theta import kernels as theta_kernels
    from attnsens.theta.certificate import PARALLEL_MIN_ROWS

    def rows(count: int, dtype: torch.dtype) -> torch.Tensor:
        scores = torch.linspace(-2.0, 2.0, 7 * count, dtype=torch.float64).reshape(count, 7)
        return torch.softmax(scores, dim=-1).to(dtype)

    few, many = 3, PARALLEL_MIN_ROWS
    serial, pool = theta_kernels.certify_rows_serial, theta_kernels.certify_rows
    serial_stats, pool_stats = (
        (capture_kernels.row_statistics_rows_serial,),
        (capture_kernels.row_statistics_rows,),
    )
    return (
        ("θ certificate, float32 rows, one thread", lambda: certify(rows(few, torch.float32)), (serial,)),
        ("θ certificate, float32 rows, thread pool", lambda: certify(rows(many, torch.float32)), (pool,)),
        (
            "θ certificate, float64 rows, one thread (softmax_jacobian_inf_to_one_norm)",
            lambda: softmax_jacobian_inf_to_one_norm(torch.zeros(few, 7)),
            (serial,),
        ),
        ("θ certificate, float64 rows, thread pool", lambda: certify(rows(many, torch.float64)), (pool,)),
        ("row statistics (audit, monitor), one thread", lambda: row_statistics(rows(few, torch.float32)), serial_stats),
        ("row statistics (audit, monitor), thread pool", lambda: row_statistics(rows(many, torch.float32)), pool_stats),
        ("row moments", lambda: row_moments(rows(few, torch.float32)), (capture_kernels.row_moments_rows,)),
    )  # fmt: skip


def _misses(kernels: tuple[Any, ...]) -> int:
    """Compilations so far of ``kernels`` in this process (numba's cache misses: a load from disk is a hit)."""
    return sum(sum(kernel.stats.cache_misses.values()) for kernel in kernels)


def warm_up(on_start: Callable[[int, int, str], None] | None = None) -> list[KernelWarmup]:
    """Compile (or load from the on-disk cache) every numba kernel of attnsens, stage by stage.

    Args:
        on_start: called as ``on_start(index, count, name)`` before each stage (``index`` from 1), for progress.

    Returns:
        One KernelWarmup per stage of ``warmup_stages``. Without numba there is nothing to compile: an empty list.
    """
    try:
        import numba  # noqa: F401
    except ImportError:
        return []
    from attnsens._numba_cache import notes_silenced

    stages = warmup_stages()
    done = []
    for index, (name, call, kernels) in enumerate(stages, start=1):
        if on_start is not None:
            on_start(index, len(stages), name)
        before = _misses(kernels)
        start = time.perf_counter()
        with notes_silenced():
            call()
        done.append(KernelWarmup(name=name, seconds=time.perf_counter() - start, compiled=_misses(kernels) > before))
    return done
