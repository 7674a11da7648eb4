"""Empirical lower estimates of Jacobian operator norms with JVPs and VJPs (autograd); never certificates.

Block-∞ operator norm. For F: ℝ^{L×d_in} → ℝ^{L×d_out} with Jacobian blocks J_ij = ∂F_i/∂x_j,

    ‖DF(X)‖_{b∞→b∞} = max_i max_{‖dx_j‖₂ ≤ 1 ∀j} ‖Σ_j J_ij dx_j‖₂ .

For each output token i the inner problem maximizes a convex function over a product of balls; its maximum sits
on the product of spheres and computing it is hard in general (it contains the ∞→2 norm). We ascend it:
w = J_i dX (JVP), G = J_iᵀ w (VJP), dx_j ← G_j/‖G_j‖. Because f(D) = ‖J_i D‖² is convex and each step maximizes
its linearization ⟨∇f(D), ·⟩ over the feasible set, f never decreases (a block power method). Every iterate is
feasible, so every value is a lower bound of the true norm; with one input and one output token the iteration is
power iteration for ‖J‖₂ and converges to the exact norm. Restarts start from
random unit directions per token; all output tokens (or a chosen subset) are probed, in chunks to bound memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from attnsens.errors import ConfigError, ShapeError
from attnsens.geometry.norms import Geometry, check_geometry

TokenMap = Callable[[Tensor], Tensor]


def _unit_per_token(D: Tensor, fallback: Tensor) -> Tensor:
    norms = torch.linalg.vector_norm(D, dim=-1, keepdim=True)
    return torch.where(norms > 0, D / norms.clamp_min(torch.finfo(D.dtype).tiny), fallback)


def _linearize(f: TokenMap, X: Tensor) -> tuple[Tensor, Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
    """(f(X), v ↦ J v, c ↦ Jᵀ c) with one forward graph, reverse mode only.

    J v is the gradient with respect to c of ⟨Jᵀ c, v⟩ (double backward); this avoids forward-mode AD, whose
    first use on scalar arithmetic costs a one-time import of the torch compiler stack.
    """
    leaf = X.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        output = f(leaf)
        probe = torch.zeros_like(output, requires_grad=True)
        (transpose,) = torch.autograd.grad(output, leaf, probe, create_graph=True)

    def jvp(v: Tensor) -> Tensor:
        return torch.autograd.grad(transpose, probe, v, retain_graph=True)[0]

    def vjp(c: Tensor) -> Tensor:
        return torch.autograd.grad(output, leaf, c, retain_graph=True)[0]

    return output.detach(), jvp, vjp


def block_jacobian_norm_estimate(
    f: TokenMap,
    X: Tensor,
    *,
    geometry: Geometry = "rms",
    iterations: int = 30,
    restarts: int = 2,
    queries: Tensor | None = None,
    chunk: int = 16,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Lower estimate of ‖DF(X)‖ in the block-∞ operator norm by block power ascent (module docstring).

    Args:
        f: maps ``[batch, query, d_in]`` → ``[batch, query, d_out]`` with batch elements independent.
        X: ``[batch, query, d_in]`` point of evaluation.
        geometry: ``"rms"`` multiplies the ℓ2 value by √(d_in/d_out) (same value when d_in = d_out).
        iterations, restarts: ascent steps per start and number of random starts.
        queries: optional ``[n]`` output token indices to probe (default: all).
        chunk: output tokens probed together (memory ∝ chunk × one forward).
        generator: random source for the starts.

    Returns:
        ``[batch]`` estimate ≤ the true operator norm (a lower bound, up to floating-point rounding).
    """
    geometry = check_geometry(geometry)
    if X.ndim != 3:
        raise ShapeError(f"X must be [batch, query, d_in], got shape {tuple(X.shape)}")
    if iterations < 1 or restarts < 1 or chunk < 1:
        raise ConfigError(f"iterations, restarts, chunk must be ≥ 1, got {iterations}, {restarts}, {chunk}")
    X = X.detach()
    n_batch = X.shape[0]
    with torch.no_grad():
        n_query = f(X).shape[1]  # output tokens (usually the input's)
    targets = torch.arange(n_query, device=X.device) if queries is None else queries.to(X.device)
    best = torch.zeros(n_batch, dtype=X.dtype, device=X.device)
    d_out = X.shape[-1]
    for start in range(0, targets.numel(), chunk):
        target = targets[start : start + chunk]
        # Probes ride along the batch axis (f treats batch elements independently): row k·batch + b probes
        # output token target[k] of sequence b. One forward graph serves every VJP of the chunk.
        tiled = X.repeat(target.numel(), 1, 1)
        select = torch.nn.functional.one_hot(target, n_query).to(X.dtype).repeat_interleave(n_batch, dim=0)
        select = select[:, :, None]  # [probe, query, 1]
        output, jvp, vjp = _linearize(f, tiled)
        d_out = output.shape[-1]
        for _ in range(restarts):
            noise = torch.randn(tiled.shape, dtype=X.dtype, device=X.device, generator=generator)
            D = _unit_per_token(noise, noise)
            for step in range(iterations + 1):
                w = (jvp(D) * select).sum(dim=1)  # [probe, d_out]
                value = torch.linalg.vector_norm(w, dim=-1).reshape(target.numel(), n_batch).amax(dim=0)
                best = torch.maximum(best, value)
                if step == iterations:
                    break
                D = _unit_per_token(vjp(select * w[:, None, :]), D)
    if geometry == "rms":
        best = best * math.sqrt(X.shape[-1] / d_out)
    return best


def spectral_jacobian_norm_estimate(
    f: TokenMap, X: Tensor, *, iterations: int = 50, generator: torch.Generator | None = None
) -> Tensor:
    """Lower estimate of ‖DF(X)‖₂ (whole sequence flattened, Frobenius geometry) by power iteration on JᵀJ.

    Args:
        f: maps ``[batch, ...]`` → ``[batch, ...]`` with batch elements independent.
        X: ``[batch, ...]``.
        iterations: power steps.

    Returns:
        ``[batch]`` estimate ≤ ‖DF(X)‖₂ (each value is ‖J v‖ for a unit v).
    """
    if iterations < 1:
        raise ConfigError(f"iterations must be ≥ 1, got {iterations}")
    _, jvp, vjp = _linearize(f, X)
    v = torch.randn(X.shape, dtype=X.dtype, device=X.device, generator=generator)
    dims = tuple(range(1, X.ndim))
    best = torch.zeros(X.shape[0], dtype=X.dtype, device=X.device)
    for _ in range(iterations):
        v = v / torch.linalg.vector_norm(v, dim=dims, keepdim=True).clamp_min(torch.finfo(v.dtype).tiny)
        w = jvp(v)
        best = torch.maximum(best, torch.linalg.vector_norm(w, dim=tuple(range(1, w.ndim))))
        v = vjp(w)
    return best
