"""Per-row statistics of attention rows (docs/math.md §2.4, §9.5): the pure kernel every capture path reduces with."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from attnsens._threads import keep_torch_threads
from attnsens.errors import ShapeError


@dataclass(frozen=True, kw_only=True)
class RowStats:
    """Statistics of attention rows; every field has the leading shape of the rows (``[..., ]`` without key).

    Float fields are float64, computed on the stored float32 values (rows are not renormalised).
    """

    theta_lower: Tensor  # certified lower bound of θ(p) (docs/math.md A2)
    theta_upper: Tensor  # certified upper bound of θ(p)
    theta_exact: Tensor  # bool: lower == upper proved
    theta_method: Tensor  # int8 code of the certificate method (attnsens.theta)
    p_max: Tensor  # max_i p_i
    argmax: Tensor  # int64 key position of p_max
    entropy: Tensor  # H(p) = −Σ p_i log p_i, nats (from the logits where they were given)
    normalized_entropy: Tensor  # H(p) / log n_keys; 0 when n_keys = 1
    n_eff: Tensor  # 1 / Σ p_i²
    row_sum: Tensor  # s = Σ p_i
    n_keys: Tensor  # int64 allowed keys of the row
    dominant: Tensor  # bool: p_max ≥ s / 2

    def flatten(self) -> RowStats:
        """The same statistics with the leading shape flattened to one axis."""
        return RowStats(**{f.name: getattr(self, f.name).reshape(-1) for f in fields(self)})

    def to(self, device: str | torch.device) -> RowStats:
        return RowStats(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def row_statistics(
    probs: Tensor, *, n_keys: Tensor | None = None, exact_support: int | None = None, logits: Tensor | None = None
) -> RowStats:
    """θ certificate, p_max, argmax, entropy H = −Σ p log p, H / log n_keys, n_eff = 1/Σp², s = Σp of every row.

    Args:
        probs: [..., key] attention rows as stored (float32 rows need not sum to exactly 1); zero entries are
            masked keys for the θ certificate.
        n_keys: [...] number of allowed keys per row. Defaults to the number of nonzero entries; pass it when
            an allowed key can underflow to an exact zero.
        exact_support: prove every row of at most this many non-zero keys exact (``certify``'s argument, 24–48;
            default: the cheap proofs only).
        logits: the float32 logits s the rows are the softmax of (probs' shape; −∞ at masked keys). The entropy is
            then log Z · Σp − Σ p_i s_i with log Z = s_a − log p_a at the row's largest entry a: no logarithm a
            key. It and −Σ p log p of the stored values differ by a few float32 ulps of H, the softmax's own
            rounding (docs/math.md §2.4). Default: −Σ p log p of ``probs``.

    Returns:
        RowStats with the leading shape of ``probs``. The θ interval is the θ engine's certificate for the
        stored numbers (attnsens.theta.certify; docs/math.md A2, docs/architecture.md "θ semantics").
        Normalized entropy of a single-key row is defined as 0 (its entropy is exactly 0) so that aggregates
        stay finite.

    Example: p = (½, ½) gives entropy log 2, normalized entropy 1, n_eff 2 and θ = 1.
    """
    from attnsens.theta import certify

    if logits is not None and logits.shape != probs.shape:
        raise ShapeError(f"logits must have the rows' shape {tuple(probs.shape)}, got {tuple(logits.shape)}")
    fused = _fused_row_statistics(probs, n_keys, exact_support, logits)
    if fused is not None:
        return fused
    certificate = certify(probs, dim=-1, exact_support=exact_support)
    p_max, argmax, row_sum, squares, entropy, nonzero = row_moments(probs, logits)
    n_keys = nonzero if n_keys is None else n_keys.to(device=probs.device, dtype=torch.int64)
    log_n = torch.log(n_keys.to(torch.float64))
    normalized = torch.where(n_keys > 1, entropy / torch.where(n_keys > 1, log_n, 1.0), 0.0)
    return RowStats(
        theta_lower=certificate.lower.to(torch.float64),
        theta_upper=certificate.upper.to(torch.float64),
        theta_exact=certificate.exact,
        theta_method=certificate.method,
        p_max=p_max,
        argmax=argmax,
        entropy=entropy,
        normalized_entropy=normalized,
        n_eff=1.0 / squares,
        row_sum=row_sum,
        n_keys=n_keys,
        dominant=p_max >= row_sum / 2,
    )


ROW_STATISTICS_NOTE = ("attnsens' row-statistics kernels", "about a minute")
ROW_MOMENTS_NOTE = ("attnsens' row-moments kernel", "a few seconds")
"""What ``note_compilation`` says when a call compiles these kernels, and the time that took on two cores."""


def _fused_row_statistics(
    probs: Tensor, n_keys: Tensor | None, exact_support: int | None = None, logits: Tensor | None = None
) -> RowStats | None:
    """``row_statistics`` of float32 CPU rows by one compiled pass (``_numba_row_statistics``): the same numbers
    bit for bit (an entropy from ``logits`` to float64 rounding: the sums run in another order), without the
    per-call steps between ``certify`` and the moments. None where it does not apply (other devices and dtypes,
    no numba, no rows), and the caller takes the general path."""
    from attnsens.theta.certificate import enumeration_support

    mitm_max_support = enumeration_support(exact_support)  # refused here and on the general path alike
    if probs.device.type != "cpu" or probs.dtype != torch.float32 or probs.dim() == 0 or probs.numel() == 0:
        return None
    if logits is not None and (logits.device.type != "cpu" or logits.dtype != torch.float32):
        return None
    try:
        from numba import get_num_threads, parallel_chunksize

        from attnsens.capture import _numba_row_statistics as kernels
    except ImportError:
        return None
    from attnsens._numba_cache import note_compilation
    from attnsens.theta.certificate import (
        CKK_MAX_SUPPORT,
        CKK_NODE_BUDGET,
        EXACT_BY_METHOD,
        PARALLEL_MIN_ELEMENTS,
        PARALLEL_MIN_ROWS,
        STOP_DISTANCE,
        default_sum_tolerance,
    )
    from attnsens.theta.kernels import chunk_tasks, raise_for_status, thread_workspaces

    shape = probs.shape[:-1]
    rows = probs.detach().reshape(-1, probs.shape[-1]).contiguous()
    x = rows.numpy()
    count = x.shape[0]
    if logits is None:
        scores = np.empty((0, 0), dtype=np.float32)  # no rows: the kernel takes −Σ p log p
    else:
        scores = logits.detach().reshape(-1, probs.shape[-1]).contiguous().numpy()
    tolerance = default_sum_tolerance(probs.dtype)
    row_sum, theta_p_max, d_found, d_lb, err, lower, upper, total, squares, entropy = np.empty((10, count))
    method = np.empty(count, dtype=np.int8)
    status = np.empty(count, dtype=np.int8)
    p_max = np.empty(count, dtype=np.float32)
    argmax = np.empty(count, dtype=np.int64)
    nonzero = np.empty(count, dtype=np.int64)
    parallel = x.size >= PARALLEL_MIN_ELEMENTS or count >= PARALLEL_MIN_ROWS
    kernel = kernels.row_statistics_rows if parallel else kernels.row_statistics_rows_serial
    block = kernels.statistics_block_rows(x.shape[1])
    args = (
        x, STOP_DISTANCE["float32"], mitm_max_support, CKK_NODE_BUDGET, CKK_MAX_SUPPORT, tolerance, row_sum,
        theta_p_max, d_found, d_lb, err, method, status, lower, upper, p_max, argmax, total, squares, entropy,
        nonzero, scores, thread_workspaces(mitm_max_support, x.shape[1], get_num_threads() if parallel else 1),
        block,
    )  # fmt: skip
    note_compilation(kernel, args, *ROW_STATISTICS_NOTE)
    with keep_torch_threads(), parallel_chunksize(chunk_tasks(count, get_num_threads(), mitm_max_support, block)):
        kernel(*args)
    if status.any():
        raise_for_status(torch.from_numpy(status), rows, tuple(shape), -1, tolerance)
    # The rest in NumPy, the same IEEE float64 operations: on a chunk of 1,152 rows each torch call here took
    # 30–120 µs, the NumPy ones a few.
    keys = nonzero if n_keys is None else n_keys.reshape(-1).to(device="cpu", dtype=torch.int64).numpy()
    p_max_64 = p_max.astype(np.float64)
    several = keys > 1
    with np.errstate(divide="ignore"):
        normalized = np.where(several, entropy / np.where(several, np.log(keys.astype(np.float64)), 1.0), 0.0)
        n_eff = 1.0 / squares
    columns = {
        "theta_lower": lower,
        "theta_upper": upper,
        "theta_exact": EXACT_BY_METHOD.numpy()[method],
        "theta_method": method,
        "p_max": p_max_64,
        "argmax": argmax,
        "entropy": entropy,
        "normalized_entropy": normalized,
        "n_eff": n_eff,
        "row_sum": total,
        "n_keys": keys,
        "dominant": p_max_64 >= total / 2,
    }
    return RowStats(**{name: torch.from_numpy(value.reshape(shape)) for name, value in columns.items()})


def _entropy_from_logits(probs: Tensor, logits: Tensor, argmax: Tensor, row_sum: Tensor, nonzero: Tensor) -> Tensor:
    """log Z · Σp − Σ p_i s_i per row with log Z = s_a − log p_a at ``argmax`` a, clamped at 0; 0 for rows without
    a positive entry (the kernel ``moments_of_row_logits`` in torch operations, for rows off the CPU). The logits
    are taken relative to s_a, so that the sums' terms stay small whatever the logits' scale."""
    p = probs.to(torch.float64)
    at = argmax.unsqueeze(-1)
    scores = logits.to(torch.float64)
    centered = scores - scores.gather(-1, at)
    cross = torch.where(probs > 0, p * centered, 0.0).sum(dim=-1)
    entropy = (-torch.log(p.gather(-1, at)).squeeze(-1) * row_sum - cross).clamp_min(0.0)
    return torch.where(nonzero > 0, entropy, 0.0)


def row_moments(probs: Tensor, logits: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(p_max, argmax, Σp, Σp², entropy, nonzero count) per row; float64 sums, leading shape of ``probs``. The
    entropy is −Σ p log p, or with ``logits`` the entropy from the logits (``_entropy_from_logits``), computed
    instead of it off the CPU kernel: one elementwise logarithm pass fewer."""
    shape = probs.shape[:-1]
    if probs.device.type == "cpu" and probs.dtype == torch.float32:
        from attnsens._numba_cache import note_compilation
        from attnsens.capture import _numba_moments

        rows = probs.reshape(-1, probs.shape[-1]).contiguous().numpy()
        count = rows.shape[0]
        out = [torch.empty(count, dtype=dtype) for dtype in (torch.float32, torch.int64, *[torch.float64] * 3)]
        nonzero = torch.empty(count, dtype=torch.int64)
        args = (rows, *(t.numpy() for t in out), nonzero.numpy())
        note_compilation(_numba_moments.row_moments, args, *ROW_MOMENTS_NOTE)
        with keep_torch_threads():
            _numba_moments.row_moments(*args)
        p_max, argmax, total, squares, entropy = (t.reshape(shape) for t in out)
        nonzero = nonzero.reshape(shape)
        if logits is not None:
            entropy = _entropy_from_logits(probs, logits, argmax, total, nonzero)
        return p_max.to(torch.float64), argmax, total, squares, entropy, nonzero
    p = probs.to(torch.float64)
    p_max, argmax = probs.max(dim=-1)
    total = p.sum(dim=-1)
    nonzero = (probs > 0).sum(dim=-1)
    if logits is None:
        entropy = -torch.special.xlogy(p, p).sum(dim=-1)
    else:
        entropy = _entropy_from_logits(probs, logits, argmax, total, nonzero)
    return p_max.to(torch.float64), argmax, total, (p * p).sum(dim=-1), entropy, nonzero
