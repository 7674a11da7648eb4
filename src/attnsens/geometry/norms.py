"""Block norms of token matrices and the induced norms of tokenwise and token-mixing linear maps (docs/math.md §2.5).

Two conventions for a token matrix X ∈ ℝ^{L×d} (rows x_i are tokens):

* ``"rms"`` (primary): ‖X‖_{∞,rms} = max_i ‖x_i‖₂ / √d — the worst token, RMS within the token;
* ``"l2"``: ‖X‖_{b∞} = max_i ‖x_i‖₂ = √d ‖X‖_{∞,rms}.

For maps ℝ^{L×d} → ℝ^{L×d} (same width in and out, e.g. attention and residual blocks) both conventions give
the same operator norm; they differ for maps that change the width, and in the numbers used for radii.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from attnsens.errors import ConfigError, ShapeError

Geometry = Literal["rms", "l2"]
GEOMETRIES: tuple[Geometry, ...] = ("rms", "l2")


def check_geometry(geometry: str) -> Geometry:
    """Validate a norm-convention name."""
    if geometry not in GEOMETRIES:
        raise ConfigError(f"geometry must be 'rms' or 'l2', got {geometry!r}; pick one of {GEOMETRIES}")
    return geometry


def block_l2_norm(X: Tensor) -> Tensor:
    """‖X‖_{b∞} = max_i ‖x_i‖₂ over the tokens of X.

    Args:
        X: ``[..., query, d_model]``.

    Returns:
        ``[...]`` exact block-ℓ2 norm (docs/math.md §2.5).

    >>> float(block_l2_norm(torch.tensor([[3.0, 4.0], [0.0, 1.0]])))
    5.0
    """
    if X.ndim < 2:
        raise ShapeError(f"X must be [..., query, d_model], got shape {tuple(X.shape)}")
    return torch.linalg.vector_norm(X, dim=-1).amax(dim=-1)


def block_rms_norm(X: Tensor) -> Tensor:
    """‖X‖_{∞,rms} = max_i ‖x_i‖₂ / √d over the tokens of X.

    Args:
        X: ``[..., query, d_model]``.

    Returns:
        ``[...]`` exact block-RMS norm (docs/math.md §2.5).

    >>> round(float(block_rms_norm(torch.tensor([[3.0, 4.0], [0.0, 1.0]]))), 6)  # 5 / √2
    3.535534
    """
    return block_l2_norm(X) / math.sqrt(X.shape[-1])


def block_norm(X: Tensor, geometry: Geometry) -> Tensor:
    """``block_rms_norm`` or ``block_l2_norm`` by convention name."""
    return block_rms_norm(X) if check_geometry(geometry) == "rms" else block_l2_norm(X)


def spectral_norm(W: Tensor) -> Tensor:
    """‖W‖₂ = √λ_max(W Wᵀ) (Gram matrix of the smaller side, eigvalsh) in float64, batched over leading dims.

    Args:
        W: ``[..., rows, cols]``.

    Returns:
        ``[...]`` float64 spectral norms (an SVD of the full matrix gives the same value several times slower).
    """
    if W.ndim < 2:
        raise ShapeError(f"W must be [..., rows, cols], got shape {tuple(W.shape)}")
    W = W.to(torch.float64)
    gram = W @ W.transpose(-1, -2) if W.shape[-2] <= W.shape[-1] else W.transpose(-1, -2) @ W
    return torch.linalg.eigvalsh(gram)[..., -1].clamp_min(0.0).sqrt()


def tokenwise_linear_operator_norm(W: Tensor, geometry: Geometry = "rms") -> Tensor:
    """Operator norm of X ↦ X Wᵀ on token matrices: ‖W‖₂ (``"l2"``) or ‖W‖₂ √(d_in / d_out) (``"rms"``).

    Args:
        W: ``[..., d_out, d_in]``.
        geometry: block norm convention of input and output.

    Returns:
        ``[...]`` exact float64 operator norm (docs/math.md §2.5): the worst token is attained by a top singular vector.
    """
    norm = spectral_norm(W)
    if check_geometry(geometry) == "rms":
        norm = norm * math.sqrt(W.shape[-1] / W.shape[-2])
    return norm


def token_mixing_operator_norm(A: Tensor) -> Tensor:
    """Operator norm of X ↦ A X in either block convention: ‖A‖_{∞→∞} = max_i Σ_j |A_ij|.

    Args:
        A: ``[..., query, key]``.

    Returns:
        ``[...]`` exact float64 operator norm (docs/math.md §2.5, T3); equal to 1 for row-stochastic A.
    """
    if A.ndim < 2:
        raise ShapeError(f"A must be [..., query, key], got shape {tuple(A.shape)}")
    return A.to(torch.float64).abs().sum(dim=-1).amax(dim=-1)
