"""Input checks for θ certificates: dtype/shape rules and the per-row status → one-line InputError."""

from __future__ import annotations

import numpy as np
import torch

from attnsens.errors import InputError, ShapeError
from attnsens.theta.methods import RowStatus

ACCEPTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(p: object, dim: int) -> torch.Tensor:
    """The argument as a floating tensor with a non-empty ``dim``; raises InputError/ShapeError otherwise."""
    if not isinstance(p, torch.Tensor):
        raise InputError(f"expected a torch.Tensor of attention probabilities, got {type(p).__name__}; "
                         "wrap arrays with torch.as_tensor(...)")  # fmt: skip
    if p.dtype not in ACCEPTED_DTYPES:
        raise InputError(f"dtype {p.dtype} is not supported; pass float16, bfloat16, float32 or float64 "
                         "probabilities (e.g. p.float())")  # fmt: skip
    if p.dim() == 0:
        raise ShapeError("got a 0-d tensor; attention rows need a key axis (shape [..., key])")
    if not -p.dim() <= dim < p.dim():
        raise ShapeError(f"dim={dim} is out of range for a tensor of shape {tuple(p.shape)}")
    if p.shape[dim] == 0:
        raise InputError(f"the key axis dim={dim} of shape {tuple(p.shape)} is empty: every row is empty; "
                         "an attention row needs at least one key")  # fmt: skip
    return p


def row_status(x: torch.Tensor, *, check_sum: bool, tolerance: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorised per-row status (RowStatus codes, int8) and float64 row sums of ``x`` [row, key]."""
    x64 = x.to(torch.float64)
    s = x64.sum(-1)
    finite = torch.isfinite(x64).all(-1) & torch.isfinite(s)  # finite values whose sum overflows float64 too
    negative = (x64 < 0).any(-1)
    empty = (x64 > 0).sum(-1) == 0
    bad_sum = (s - 1.0).abs() > tolerance if check_sum else torch.zeros_like(finite)
    status = torch.zeros(x.shape[0], dtype=torch.int8, device=x.device)
    for code, flag in (
        (RowStatus.BAD_SUM, bad_sum),
        (RowStatus.EMPTY, empty),
        (RowStatus.NEGATIVE, negative),
        (RowStatus.NON_FINITE, ~finite),
    ):
        status = torch.where(flag, torch.tensor(int(code), dtype=torch.int8, device=x.device), status)
    return status, s


def raise_for_status(
    status: torch.Tensor, rows: torch.Tensor, leading_shape: tuple[int, ...], dim: int, tolerance: float
) -> None:
    """Raise InputError for the first invalid row, naming its flat and multi-index, the problem and the fix."""
    bad = torch.nonzero(status != 0).flatten()
    if bad.numel() == 0:
        return
    r = int(bad[0])
    code = RowStatus(int(status[r]))
    row = rows[r].to(torch.float64).cpu()
    where = f"row {r}" + (f" (index {tuple(int(i) for i in np.unravel_index(r, leading_shape))} of the leading "
                         f"shape {leading_shape}, key axis dim={dim})" if len(leading_shape) > 0 else "")  # fmt: skip
    more = f" ({bad.numel() - 1} more invalid rows)" if bad.numel() > 1 else ""
    if code == RowStatus.NON_FINITE and bool(torch.isfinite(row).all()):
        msg = f"{where} sums to {float(row.sum())}: values this large are not probabilities; rescale the row"
    elif code == RowStatus.NON_FINITE:
        key = int(torch.nonzero(~torch.isfinite(row)).flatten()[0])
        msg = (f"{where} holds {float(row[key])} at key {key}: probabilities must be finite; "
               "check the softmax input for overflow or NaN-filled masks")  # fmt: skip
    elif code == RowStatus.NEGATIVE:
        key = int(torch.nonzero(row < 0).flatten()[0])
        msg = (f"{where} holds the negative value {float(row[key]):.6g} at key {key}: probabilities must be ≥ 0; "
               "pass softmax outputs, not scores or log-probabilities")  # fmt: skip
    elif code == RowStatus.EMPTY:
        msg = (f"{where} is empty (all {row.numel()} entries are zero): a row needs at least one key with "
               "positive probability; drop fully masked rows first")  # fmt: skip
    else:
        s = float(row.sum())
        msg = (f"{where} sums to {s:.9g}, off 1 by {abs(s - 1.0):.3g} > tolerance {tolerance:g}: pass "
               "normalize=True to certify the renormalised row, or a larger tolerance")  # fmt: skip
    raise InputError(msg + more)
