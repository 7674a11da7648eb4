"""Plain float64 reference implementations of a transformer block from normalized weights.

Written from docs/math.md §2.6–2.9 one head and one position at a time; they take bare tensors (never attnsens
objects or functions) so that they can check the adapters' weight layouts and the row-statistics kernel.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def activation_plain(name: str, x: Tensor) -> Tensor:
    if name == "gelu":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if name == "relu":
        return x.clamp_min(0)
    if name == "silu":
        return x / (1 + torch.exp(-x))
    raise ValueError(name)


def norm_plain(kind: str, x: Tensor, gamma: Tensor, beta: Tensor | None, eps: float) -> Tensor:
    """LayerNorm or RMSNorm of every row of x [n, d]."""
    if kind == "layernorm":
        centred = x - x.mean(dim=-1, keepdim=True)
        out = gamma * centred / torch.sqrt((centred**2).mean(dim=-1, keepdim=True) + eps)
    else:
        out = gamma * x / torch.sqrt((x**2).mean(dim=-1, keepdim=True) + eps)
    return out if beta is None else out + beta


def rotate_half_plain(x: Tensor, base: float, rotary_dim: int) -> Tensor:
    """Rotary embedding of x [n, d_head] at positions 0..n−1: pairs (k, k + rotary_dim/2) turn by t·base^(−2k/r)."""
    out = x.clone()
    half = rotary_dim // 2
    for t in range(x.shape[0]):
        for k in range(half):
            angle = t * base ** (-2 * k / rotary_dim)
            a, b = x[t, k], x[t, k + half]
            out[t, k] = a * math.cos(angle) - b * math.sin(angle)
            out[t, k + half] = a * math.sin(angle) + b * math.cos(angle)
    return out


def attention_plain(x: Tensor, a: dict, *, positions_rotary: tuple[float, int] | None) -> Tensor:
    """Multi-head attention of x [n, d]; ``a`` holds w_q, w_k, w_v, w_o, b_* (None allowed), tau, causal."""
    n_head, n_kv = a["w_q"].shape[0], a["w_k"].shape[0]
    n = x.shape[0]
    outputs = []
    for h in range(n_head):
        g = h // (n_head // n_kv)
        q = x @ a["w_q"][h].T + (0 if a["b_q"] is None else a["b_q"][h])
        k = x @ a["w_k"][g].T + (0 if a["b_k"] is None else a["b_k"][g])
        v = x @ a["w_v"][g].T + (0 if a["b_v"] is None else a["b_v"][g])
        if positions_rotary is not None:
            q, k = rotate_half_plain(q, *positions_rotary), rotate_half_plain(k, *positions_rotary)
        rows = []
        for i in range(n):
            keys = list(range(i + 1)) if a["causal"] else list(range(n))
            scores = torch.stack([q[i] @ k[j] for j in keys]) / a["tau"]
            p = torch.softmax(scores, dim=0)
            rows.append(sum(p[m] * v[j] for m, j in enumerate(keys)))
        outputs.append(torch.stack(rows))
    out = torch.cat(outputs, dim=-1) @ a["w_o"].T
    return out if a["b_o"] is None else out + a["b_o"]


def mlp_plain(x: Tensor, m: dict) -> Tensor:
    """w_out act(w_in x + b_in) + b_out, or gated w_out (act(w_gate x + b_gate) ⊙ (w_in x + b_in)) + b_out."""
    hidden = x @ m["w_in"].T + (0 if m["b_in"] is None else m["b_in"])
    if m["w_gate"] is not None:
        gate = x @ m["w_gate"].T + (0 if m.get("b_gate") is None else m["b_gate"])
        hidden = activation_plain(m["activation"], gate) * hidden
    else:
        hidden = activation_plain(m["activation"], hidden)
    out = hidden @ m["w_out"].T
    return out if m["b_out"] is None else out + m["b_out"]


def block_plain(x: Tensor, block: dict) -> Tensor:
    """One residual block (docs/math.md §2.9) on x [n, d]; ``block`` holds placement, parallel, alpha, attention, mlp,
    norm1, norm2 (dicts of kind, gamma, beta, eps) and rotary (base, rotary_dim) or None."""

    def attention(h: Tensor) -> Tensor:
        return attention_plain(h, block["attention"], positions_rotary=block["rotary"])

    def mlp(h: Tensor) -> Tensor:
        return mlp_plain(h, block["mlp"])

    def n1(h: Tensor) -> Tensor:
        return norm_plain(x=h, **block["norm1"])

    def n2(h: Tensor) -> Tensor:
        return norm_plain(x=h, **block["norm2"])

    if block["placement"] == "pre":
        if block["parallel"]:
            return x + attention(n1(x)) + mlp(n2(x))
        h = x + attention(n1(x))
        return h + mlp(n2(h))
    if block["placement"] == "post":
        h = n1(block["alpha"] * x + attention(x))
        return n2(block["alpha"] * h + mlp(h))
    h = x + attention(x)
    return h + mlp(h)


def row_statistics_plain(row: list[float], n_keys: int) -> dict[str, float]:
    """p_max, argmax, entropy (nats), normalized entropy (0 for one key), n_eff, row_sum and θ by enumeration
    (θ = s − 4 min_S (p(S) − s/2)², the stored-row form of docs/architecture.md) of one row given as Python floats."""
    s = math.fsum(row)
    support = [v for v in row if v > 0]
    best = min(
        abs(math.fsum(v for bit, v in enumerate(support) if mask >> bit & 1) - s / 2)
        for mask in range(1 << len(support))
    )
    entropy = -math.fsum(v * math.log(v) for v in support)
    p_max = max(row)
    return {
        "p_max": p_max,
        "argmax": row.index(p_max),
        "entropy": entropy,
        "normalized_entropy": entropy / math.log(n_keys) if n_keys > 1 else 0.0,
        "n_eff": 1.0 / math.fsum(v * v for v in row),
        "row_sum": s,
        "theta": s - 4 * best**2,
        "dominant": p_max >= s / 2,
    }
