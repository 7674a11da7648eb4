"""Proved-optimal θ(p) per row: meet-in-the-middle up to 48 non-zeros, otherwise the exact cascade stages and
complete Karmarkar–Karp within a node budget (docs/theta-algorithms.md §5; docs/math.md A1)."""

from __future__ import annotations

import torch

from attnsens.errors import TooHardError
from attnsens.theta.certificate import EXACT_SUPPORT_MAX, Backend, run_cascade

EXACT_MITM_MAX_SUPPORT = EXACT_SUPPORT_MAX
EXACT_CKK_MAX_SUPPORT = 4096
NODE_BUDGET = 2_000_000
_NEVER_STOP = -1.0


def exact(
    p: torch.Tensor,
    dim: int = -1,
    *,
    node_budget: int = NODE_BUDGET,
    normalize: bool = False,
    tolerance: float | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """θ(p) = s − 4·min_S (p(S) − s/2)² of every row, proved optimal, as float64.

    Rows with ≤ 48 non-zeros are solved by the cardinality bound, a perfect split found by a short search, or
    meet-in-the-middle over merge-doubled sorted subset sums (2^24 sums per half at 48, about 0.1–0.3 s and 0.5 GiB
    per row); larger rows by the dominant-atom and top-K
    relaxation proofs, the perfect-partition rule, or complete Karmarkar–Karp exhausting its tree within
    ``node_budget`` nodes (at most 4096 non-zeros). The pure-torch backend has no CKK.

    Args:
        p: [..., key, ...] probabilities, key axis ``dim`` (zeros are masked keys); see ``certify``.
        node_budget: CKK nodes per row before giving up.
        normalize, tolerance, backend: as for ``certify`` (tolerance default ``default_sum_tolerance(p.dtype)``).

    Returns:
        float64 tensor with the leading shape of p: fl(ŝ − 4·d̂²) for the proved optimal d̂, clamped into the
        proved enclosure [lower, upper] of ``certify`` (width ≤ 2^-49·max(1, s) when sums are error-free).

    Raises:
        TooHardError: some row could not be proved within the budget (names the rows and support sizes).

    >>> float(exact(torch.tensor([0.25, 0.25, 0.5])))
    1.0
    """
    cert, point = run_cascade(
        p, dim, stop_distance=_NEVER_STOP, mitm_max_support=EXACT_MITM_MAX_SUPPORT, ckk_node_budget=node_budget,
        ckk_max_support=EXACT_CKK_MAX_SUPPORT, normalize=normalize, tolerance=tolerance, backend=backend,
    )  # fmt: skip
    unproved = torch.nonzero(~cert.exact.flatten()).flatten()
    if unproved.numel() > 0:
        support = (p.movedim(dim, -1) != 0).sum(-1).flatten()[unproved.to(p.device)].cpu()
        first = int(unproved[0])
        raise TooHardError(
            f"θ could not be proved optimal for {unproved.numel()} of {cert.lower.numel()} rows (first: row "
            f"{first}, {int(support[0])} non-zero keys; largest support {int(support.max())}); rows above "
            f"{EXACT_MITM_MAX_SUPPORT} non-zeros need CKK to finish within node_budget={node_budget}: raise "
            "node_budget, or use certify(p) for a certified interval"
        )
    return torch.clamp(point, min=cert.lower, max=cert.upper)
