"""Heuristic depth-scaling rules beside DeepNet's published constants (docs/math.md T9) — heuristics, not bounds.

The v1 paper attributes DeepNorm's N^{-1/4} to the degree-4 sensitivity path of attention,
‖W_O‖ (θ/τ) 2R² ‖W_Q‖‖W_K‖‖W_V‖: scaling all four maps by β scales it by β⁴, and keeping N such terms O(1)
suggests β = N^{-1/4}; generally N^{-1/m} for a path of m maps. DeepNet (Wang et al. 2022) derives its constants
from a bound on the model update under Adam and scales only W_V, W_O and the FFN matrices (gain β), while up-
weighting the residual by α. Both are exposed so they can be compared; only DeepNet's are published constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from attnsens.errors import ConfigError


def quartic_path_norm_product(w_o: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor) -> Tensor:
    """‖W_O‖‖W_Q^h‖‖W_K^h‖‖W_V^h‖ per head from spectral norms (broadcast); the heuristic's quartic path (T9)."""
    return w_o * w_q * w_k * w_v


def depth_scale_heuristic(n_layers: int, path_length: int = 4) -> float:
    """N^{-1/m}: the v1 design rule's gain for each of the m maps of the dominant path (heuristic, docs/math.md T9).

    >>> depth_scale_heuristic(16)
    0.5
    """
    if n_layers < 1 or path_length < 1:
        raise ConfigError(f"n_layers and path_length must be ≥ 1, got {n_layers}, {path_length}")
    return float(n_layers) ** (-1.0 / path_length)


@dataclass(frozen=True, kw_only=True)
class DeepNetConstants:
    """DeepNorm's residual weight α and initialization gain β (applied to W_V, W_O, FFN; W_Q, W_K keep gain 1)."""

    alpha: float
    beta: float


def deepnet_constants(
    architecture: Literal["encoder", "decoder", "encoder_decoder_encoder", "encoder_decoder_decoder"],
    n_layers: int,
    n_decoder_layers: int | None = None,
) -> DeepNetConstants:
    """Published DeepNet constants (Wang et al. 2022, docs/math.md T9).

    encoder-only (N layers) / decoder-only (M layers): α = (2N)^{1/4}, β = (8N)^{-1/4};
    encoder–decoder: encoder α = 0.81 (N⁴M)^{1/16}, β = 0.87 (N⁴M)^{-1/16}; decoder α = (3M)^{1/4}, β = (12M)^{-1/4}.

    >>> deepnet_constants("decoder", 2).alpha
    1.4142135623730951
    """
    if n_layers < 1:
        raise ConfigError(f"n_layers must be ≥ 1, got {n_layers}")
    if architecture in ("encoder", "decoder"):
        return DeepNetConstants(alpha=(2 * n_layers) ** 0.25, beta=(8 * n_layers) ** -0.25)
    if architecture in ("encoder_decoder_encoder", "encoder_decoder_decoder"):
        if n_decoder_layers is None or n_decoder_layers < 1:
            raise ConfigError("encoder–decoder constants need n_decoder_layers ≥ 1 (M)")
        n, m = n_layers, n_decoder_layers
        if architecture == "encoder_decoder_encoder":
            return DeepNetConstants(alpha=0.81 * (n**4 * m) ** (1 / 16), beta=0.87 * (n**4 * m) ** (-1 / 16))
        return DeepNetConstants(alpha=(3 * m) ** 0.25, beta=(12 * m) ** -0.25)
    raise ConfigError(
        f"unknown architecture {architecture!r}; expected encoder, decoder, encoder_decoder_encoder or "
        "encoder_decoder_decoder"
    )
