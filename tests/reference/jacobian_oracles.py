"""Slow, obvious float64 oracles for Jacobians and their block norms; never imports attnsens.geometry.

Block-∞ operator norm of a token Jacobian J ``[query, d_out, key, d_in]`` (J[i, :, j, :] = ∂F_i/∂x_j):
‖J‖ = max_i max_{‖dx_j‖₂ ≤ 1} ‖Σ_j J_ij dx_j‖₂. It is computed exactly here in two special cases —
one input token (the spectral norm of J_i0) and scalar tokens d_in = 1 (the feasible set is the cube
[−1, 1]^L and a convex function peaks at a vertex: enumerate all 2^L sign vectors) — and bracketed otherwise:
a block power ascent gives a lower bound and max_i Σ_j ‖J_ij‖₂ an upper bound.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor


def dense_token_jacobian(f, X: Tensor) -> Tensor:
    """J ``[query, d_out, key, d_in]`` of f: ``[query, d_in]`` → ``[query, d_out]`` at X by torch.func.jacrev."""
    return torch.func.jacrev(f)(X)


def block_inf_norm_single_input_token(J: Tensor) -> Tensor:
    """Exact norm when there is one input token: max_i ‖J_i0‖₂. J ``[..., query, d_out, 1, d_in]``."""
    return torch.linalg.matrix_norm(J[..., 0, :], ord=2).amax(dim=-1)


def block_inf_norm_scalar_tokens(J: Tensor) -> Tensor:
    """Exact norm when d_in = 1 by enumerating the 2^key sign vectors. J ``[..., query, d_out, key, 1]``."""
    n_key = J.shape[-2]
    signs = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=n_key)), dtype=J.dtype)  # [2^key, key]
    images = torch.einsum("...iok,sk->...sio", J[..., 0], signs)
    return torch.linalg.vector_norm(images, dim=-1).amax(dim=(-1, -2))


def block_inf_norm_row_sum_upper(J: Tensor) -> Tensor:
    """max_i Σ_j ‖J_ij‖₂ ≥ the block-∞ operator norm (triangle inequality). J ``[..., query, d_out, key, d_in]``."""
    blocks = J.movedim(-2, -3)  # [..., query, key, d_out, d_in]
    return torch.linalg.matrix_norm(blocks, ord=2).sum(dim=-1).amax(dim=-1)


def block_inf_norm_lower_dense(J: Tensor, *, iterations: int = 60, restarts: int = 4, seed: int = 0) -> Tensor:
    """Lower bound of the block-∞ norm of dense J ``[..., query, d_out, key, d_in]`` by block power ascent."""
    generator = torch.Generator().manual_seed(seed)
    best = torch.zeros(J.shape[:-4], dtype=J.dtype)
    n_query = J.shape[-4]
    for _ in range(restarts):
        D = torch.randn((*J.shape[:-4], n_query, *J.shape[-2:]), generator=generator, dtype=J.dtype)
        for _ in range(iterations + 1):
            D = D / torch.linalg.vector_norm(D, dim=-1, keepdim=True).clamp_min(1e-300)
            W = torch.einsum("...iokd,...ikd->...io", J, D)  # probe i uses its own direction D[..., i, :, :]
            best = torch.maximum(best, torch.linalg.vector_norm(W, dim=-1).amax(dim=-1))
            D = torch.einsum("...iokd,...io->...ikd", J, W)
    return best


def matrix_inf_to_inf_norm(M: Tensor) -> Tensor:
    """max_i Σ_j |M_ij| (dense)."""
    return M.abs().sum(dim=-1).amax(dim=-1)


def matrix_inf_to_one_norm_brute(M: Tensor) -> Tensor:
    """max over sign vectors x of ‖M x‖₁ (exact for small sizes). M ``[..., n, n]``."""
    n = M.shape[-1]
    signs = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=n)), dtype=M.dtype)
    return (signs @ M.transpose(-1, -2)).abs().sum(dim=-1).amax(dim=-1)


def theta_brute(p: Tensor) -> Tensor:
    """θ(p) = 4 max_S p(S)(1 − p(S)) for a normalized row, by enumerating subsets. p ``[..., key]``."""
    n = p.shape[-1]
    masks = torch.tensor(list(itertools.product((0.0, 1.0), repeat=n)), dtype=p.dtype)
    s = p @ masks.T
    return (4 * s * (1 - s)).amax(dim=-1)


def softmax_tempered(u: Tensor, tau: float) -> Tensor:
    return torch.softmax(u / tau, dim=-1)


def layernorm_plain(x: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
    mu = x.mean()
    var = ((x - mu) ** 2).mean()
    return gamma * (x - mu) / torch.sqrt(var + eps) + beta


def rmsnorm_plain(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    return gamma * x / torch.sqrt((x**2).mean() + eps)


def rope_plain(x: Tensor, base: float, rotary_dim: int, interleaved: bool) -> Tensor:
    """RoPE by complex multiplication, one position at a time. x ``[position, d_head]``."""
    out = x.clone()
    half = rotary_dim // 2
    for t in range(x.shape[0]):
        for k in range(half):
            angle = t * base ** (-2 * k / rotary_dim)
            a_idx, b_idx = (2 * k, 2 * k + 1) if interleaved else (k, k + half)
            z = complex(float(x[t, a_idx]), float(x[t, b_idx])) * complex(math.cos(angle), math.sin(angle))
            out[t, a_idx], out[t, b_idx] = z.real, z.imag
    return out


def attention_plain(X, Wq, Wk, Wv, Wo, *, tau, causal, bq=None, bk=None, bv=None, bo=None, rope=None):
    """Loop-based multi-head attention for one sequence X ``[query, d_model]`` (GQA by h // group)."""
    n_head, n_kv = Wq.shape[0], Wk.shape[0]
    group = n_head // n_kv
    L = X.shape[0]
    heads = []
    for h in range(n_head):
        g = h // group
        q = X @ Wq[h].T + (0 if bq is None else bq[h])
        k = X @ Wk[g].T + (0 if bk is None else bk[g])
        v = X @ Wv[g].T + (0 if bv is None else bv[g])
        if rope is not None:
            q, k = rope_plain(q, *rope), rope_plain(k, *rope)
        rows = []
        for i in range(L):
            keys = range(i + 1) if causal else range(L)
            scores = torch.stack([q[i] @ k[j] for j in keys]) / tau
            p = torch.softmax(scores, dim=0)
            rows.append(sum(p[n] * v[j] for n, j in enumerate(keys)))
        heads.append(torch.stack(rows))
    out = torch.cat(heads, dim=-1) @ Wo.T
    return out if bo is None else out + bo
