"""Per-row statistics of attention rows (docs/math.md §2.4, §9.5): the pure kernel every capture path reduces with."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from attnsens._threads import keep_torch_threads


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
    entropy: Tensor  # H(p) = −Σ p_i log p_i, nats
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


def row_statistics(probs: Tensor, *, n_keys: Tensor | None = None) -> RowStats:
    """θ certificate, p_max, argmax, entropy H = −Σ p log p, H / log n_keys, n_eff = 1/Σp², s = Σp of every row.

    Args:
        probs: [..., key] attention rows as stored (float32 rows need not sum to exactly 1); zero entries are
            masked keys for the θ certificate.
        n_keys: [...] number of allowed keys per row. Defaults to the number of nonzero entries; pass it when
            an allowed key can underflow to an exact zero.

    Returns:
        RowStats with the leading shape of ``probs``. The θ interval is the θ engine's certificate for the
        stored numbers (attnsens.theta.certify; docs/math.md A2, docs/architecture.md "θ semantics").
        Normalized entropy of a single-key row is defined as 0 (its entropy is exactly 0) so that aggregates
        stay finite.

    Example: p = (½, ½) gives entropy log 2, normalized entropy 1, n_eff 2 and θ = 1.
    """
    from attnsens.theta import certify

    certificate = certify(probs, dim=-1)
    p_max, argmax, row_sum, squares, entropy, nonzero = _row_moments(probs)
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


def _row_moments(probs: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(p_max, argmax, Σp, Σp², −Σ p log p, nonzero count) per row; float64 sums, leading shape of ``probs``."""
    shape = probs.shape[:-1]
    if probs.device.type == "cpu" and probs.dtype == torch.float32:
        from attnsens.capture._numba_moments import row_moments

        rows = probs.reshape(-1, probs.shape[-1]).contiguous().numpy()
        count = rows.shape[0]
        out = [torch.empty(count, dtype=dtype) for dtype in (torch.float32, torch.int64, *[torch.float64] * 3)]
        nonzero = torch.empty(count, dtype=torch.int64)
        with keep_torch_threads():
            row_moments(rows, *(t.numpy() for t in out), nonzero.numpy())
        p_max, argmax, total, squares, entropy = out
        return (
            p_max.to(torch.float64).reshape(shape),
            argmax.reshape(shape),
            total.reshape(shape),
            squares.reshape(shape),
            entropy.reshape(shape),
            nonzero.reshape(shape),
        )
    p = probs.to(torch.float64)
    p_max, argmax = probs.max(dim=-1)
    return (
        p_max.to(torch.float64),
        argmax,
        p.sum(dim=-1),
        (p * p).sum(dim=-1),
        -torch.special.xlogy(p, p).sum(dim=-1),
        (probs > 0).sum(dim=-1),
    )
