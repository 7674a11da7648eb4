"""Reference multi-head attention built from normalized weights: scores, rows, head outputs (docs/math.md §2.6).

This forward pass is the function every attention bound is about, written for reading, not speed: queries,
keys and values per head, optional rotary embedding (RoPE), causal, sliding-window (causal or bidirectional) or
arbitrary masks, grouped-query attention (query head h reads key/value head h // (head / kv_head)), temperature τ,
output projection W_O.

RoPE preserves norms. For position t the rotary map R_t acts on each rotating pair of coordinates
(a, b) ↦ (a cos φ − b sin φ, a sin φ + b cos φ) and leaves the others fixed, so R_t is orthogonal:
‖R_t q‖ = ‖q‖ and ‖R_t W dx‖ ≤ ‖W‖₂‖dx‖. Scores become u_ij = (R_i q_i)·(R_j k_j); every norm estimate of
docs/math.md T4 applies to the rotated vectors unchanged. One consequence differs: the rotated key bias R_j b_K now
depends on j, so it no longer cancels by softmax shift invariance (see ``attention_bounds``).

QK-norm (Qwen3, Gemma 3) normalizes each head's query and key before RoPE: q_i = R_i N_q(a_i) with
a_i = W_Q x_i + b_Q and N(a) = γ ⊙ a / r(a), r(a) = (‖a‖²/d_head + ε)^{1/2}. The forward keeps the pre-norm a_i
(``query_inputs``, ``key_inputs``): the bounds need them for the norm's Jacobian. HunYuan applies the per-head
norm after RoPE instead, q_i = N_q(R_i a_i); the forward then keeps the norm's input R_i a_i, and since diag(γ)
does not commute with R_i (unless γ is constant on each rotating pair) this is a different function. A logit
softcap c (Gemma 2) replaces each score u by c·tanh(u/c) before the mask; the forward keeps the slopes
1 − tanh²(u/c). ALiBi (BLOOM) adds m_h·(j − i), a constant of the input: it moves the rows and leaves every
derivative formula as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import einops
import torch
from torch import Tensor

from attnsens.errors import ConfigError, InputError, ShapeError, UnsupportedModelError
from attnsens.weights import (
    AttentionWeights,
    NormWeights,
    RotaryConfig,
    check_qk_norm_order,
    check_qk_norms,
    qk_norm_is_joint,
)


@dataclass(frozen=True, kw_only=True)
class AttentionBiases:
    """Optional biases of an attention sublayer: q ``[head, d_head]``, k/v ``[kv_head, d_head]``, o ``[d_model]``."""

    q: Tensor | None = None
    k: Tensor | None = None
    v: Tensor | None = None
    o: Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class AttentionForward:
    """Everything a bound needs from one attention evaluation (all per query head).

    output: ``[batch, query, d_model]``; probabilities: ``[batch, head, query, key]`` (zeros where masked);
    queries, keys: rotated, biased ``[batch, head, query|key, d_head]``; values: biased
    ``[batch, head, key, d_head]``; head_outputs: ``[batch, head, query, d_head]`` = P V; allowed: bool
    ``[batch|1, 1|head, query, key]``; query_inputs, key_inputs: under QK-norm, the norm's inputs (the biased
    projections a_t of the module docstring, or R_t a_t when the norm follows RoPE), ``[batch, head, query|key,
    d_head]``, else None; score_slopes: under a
    softcap c, ds/du = 1 − tanh²(u/c) of every score ``[batch, head, query, key]``, else None.
    """

    output: Tensor
    probabilities: Tensor
    queries: Tensor
    keys: Tensor
    values: Tensor
    head_outputs: Tensor
    allowed: Tensor
    query_inputs: Tensor | None = None
    key_inputs: Tensor | None = None
    score_slopes: Tensor | None = None


def qk_norm_forward(x: Tensor, norm: NormWeights) -> Tensor:
    """A QK-norm applied to queries or keys ``[..., head, position, d_head]`` (already repeated per query head for
    keys): per head, or over all heads at once when gamma covers them (``weights.qk_norm_is_joint``; repeated key
    heads keep mean(a²), so the norm over repeated heads is the norm over the key heads)."""
    n_head, d_head = x.shape[-3], x.shape[-1]
    if not qk_norm_is_joint(norm, d_head):
        return rms_norm_forward(x, norm)
    groups = norm.gamma.shape[0] // d_head
    gamma = torch.repeat_interleave(norm.gamma.reshape(groups, d_head), n_head // groups, dim=0).flatten()
    flat = einops.rearrange(x, "... head position e -> ... position (head e)")
    normalized = rms_norm_forward(flat, NormWeights(kind="rmsnorm", gamma=gamma, beta=None, eps=norm.eps))
    return einops.rearrange(normalized, "... position (head e) -> ... head position e", head=n_head)


def alibi_bias(slopes: Tensor, n: int) -> Tensor:
    """ALiBi's additive scores m_h·(j − i) ``[head, n, n]`` (float64) for slopes ``[head]``; softmax rows are
    unchanged by the row constant, so this equals BLOOM's m_h·j."""
    offsets = torch.arange(n, dtype=torch.float64, device=slopes.device)
    return slopes.to(torch.float64)[:, None, None] * (offsets[None, :] - offsets[:, None])


def rms_norm_forward(x: Tensor, norm: NormWeights) -> Tensor:
    """γ ⊙ x / r(x) (+ β when present), r(x) = (mean(x²) + ε)^{1/2} over the last axis, in x's dtype (RMSNorm)."""
    y = x / torch.sqrt(x.square().mean(dim=-1, keepdim=True) + norm.eps) * norm.gamma.to(x.dtype)
    return y if norm.beta is None else y + norm.beta.to(x.dtype)


@dataclass(frozen=True)
class _AttentionTensors:
    """The tensor form of an attention sublayer, for the kernels of this package and their tests: what an
    ``AttentionWeights`` carries, with two freedoms it lacks: projections (and biases) may carry a leading batch
    axis matching X (one set of weights per sequence), and ``mask`` is any bool ``[query, key]`` or
    ``[batch, query, key]`` (True = allowed; None: all keys).

    Wq ``[(batch,) head, d_head, d_model]``; Wk, Wv ``[(batch,) kv_head, d_head, d_model]``; Wo
    ``[(batch,) d_model, head * d_head]``; tau: softmax temperature; biases; rotary: RoPE applied to queries and
    keys after their biases; q_norm, k_norm: QK-norm applied after the biases, before RoPE (after it when
    ``qk_norm_after_rotary``, per-head norms only); softcap: the logit cap
    c (scores u = q·k/τ become c·tanh(u/c) before the mask, Gemma 2); alibi_slopes: ``[head]`` ALiBi slopes m
    (head h adds m_h·(j − i) to the capped scores).
    """

    Wq: Tensor
    Wk: Tensor
    Wv: Tensor
    Wo: Tensor
    tau: float
    mask: Tensor | None = None
    biases: AttentionBiases = field(default_factory=AttentionBiases)
    rotary: RotaryConfig | None = None
    q_norm: NormWeights | None = None
    k_norm: NormWeights | None = None
    softcap: float | None = None
    alibi_slopes: Tensor | None = None
    qk_norm_after_rotary: bool = False

    def __post_init__(self) -> None:
        if not self.tau > 0:
            raise ConfigError(f"temperature tau must be > 0, got {self.tau}")
        check_qk_norm_order(self.qk_norm_after_rotary, self.rotary, self.q_norm, self.k_norm, self.Wq.shape[-2])


def _attention_tensors(
    weights: AttentionWeights, n_query: int | None = None, device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> _AttentionTensors:  # fmt: skip
    """The tensor form of ``weights`` for sequences of ``n_query`` tokens on ``device`` (its causal or
    sliding-window mask; None without ``n_query``), weights and biases cast to ``dtype`` when given."""

    def cast(t: Tensor) -> Tensor:
        return t if dtype is None else t.to(dtype)

    def cast_bias(t: Tensor | None) -> Tensor | None:
        return None if t is None else cast(t)

    biases = AttentionBiases(q=cast_bias(weights.b_q), k=cast_bias(weights.b_k), v=cast_bias(weights.b_v),
                             o=cast_bias(weights.b_o))  # fmt: skip
    return _AttentionTensors(
        cast(weights.w_q), cast(weights.w_k), cast(weights.w_v), cast(weights.w_o), weights.tau,
        mask=None if n_query is None else attention_mask_of(weights, n_query, device), biases=biases,
        rotary=weights.rotary, q_norm=weights.q_norm, k_norm=weights.k_norm, softcap=weights.softcap,
        alibi_slopes=weights.alibi_slopes, qk_norm_after_rotary=weights.qk_norm_after_rotary,
    )  # fmt: skip


def causal_mask(n_query: int, device: torch.device | None = None, *, window: int | None = None) -> Tensor:
    """Boolean ``[query, key]`` mask, True where key ≤ query (allowed), and query − key < window when given
    (a sliding window of ``window`` keys, the query's own included)."""
    allowed = torch.ones(n_query, n_query, dtype=torch.bool, device=device).tril()
    return allowed if window is None else allowed.triu(-(window - 1))


def window_mask(n_query: int, device: torch.device | None = None, *, window: int) -> Tensor:
    """Boolean ``[query, key]`` mask of a bidirectional sliding window: True where |query − key| < window (the
    query's own key and window − 1 on either side; transformers' ``sliding_window_bidirectional_overlay`` of a
    half-window w is window = w + 1, which ModernBERT's attention modules keep as their ``sliding_window``).

    >>> window_mask(4, window=2).int().tolist()
    [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    """
    allowed = torch.ones(n_query, n_query, dtype=torch.bool, device=device)
    return allowed.triu(-(window - 1)).tril(window - 1)


def attention_mask_of(weights: AttentionWeights, n_query: int, device: torch.device | None = None) -> Tensor | None:
    """The ``[query, key]`` mask of an attention sublayer: causal (windowed when ``sliding_window``), a
    bidirectional window, or None (every key)."""
    if weights.causal:
        return causal_mask(n_query, device, window=weights.sliding_window)
    return None if weights.sliding_window is None else window_mask(n_query, device, window=weights.sliding_window)


def rotary_inverse_frequencies(rotary: RotaryConfig, n_positions: int, device: torch.device | None = None) -> Tensor:
    """The float64 inverse frequencies ω_i, i < rotary_dim/2, of a sequence of ``n_positions`` tokens.

    Default RoPE has ω_i = base^(−2i/d) (d = rotary_dim); the scaled types of ``RotaryConfig`` change only the
    ω_i (dynamic and longrope depending on n), following transformers' ``modeling_rope_utils``. Position t rotates
    pair i by the angle t·ω_i, so any ω gives an orthogonal R_t and the bounds of this package hold unchanged.
    """
    dim = rotary.rotary_dim
    exponent = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim
    kind, factor, base = rotary.rope_type, rotary.factor, rotary.base
    if kind in ("default", "linear"):
        inv_freq = base**-exponent
        return inv_freq / factor if kind == "linear" else inv_freq
    context = rotary.original_max_positions
    if context is None:  # RotaryConfig refuses this already; the types cannot say so
        raise ConfigError(f"rope_type {kind!r} needs original_max_positions")
    if kind == "dynamic":
        if dim <= 2:  # the scaled base's exponent dim / (dim − 2), transformers' too, has no value
            raise UnsupportedModelError(f"dynamic NTK RoPE over {dim} rotating dimensions has no scaled base")
        n = max(n_positions, context)
        base = base * (factor * n / context - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = base**-exponent
    if kind == "longrope":
        scales = rotary.long_factor if n_positions > context else rotary.short_factor
        if scales is None:  # likewise refused by RotaryConfig
            raise ConfigError("rope_type 'longrope' needs short_factor and long_factor")
        return inv_freq / torch.tensor(scales, dtype=torch.float64, device=device)
    if kind == "llama3":
        wavelength = 2 * math.pi / inv_freq
        low, high = context / rotary.low_freq_factor, context / rotary.high_freq_factor
        scaled = torch.where(wavelength > low, inv_freq / factor, inv_freq)
        smooth = (context / wavelength - rotary.low_freq_factor) / (rotary.high_freq_factor - rotary.low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelength >= high) & (wavelength <= low)
        return torch.where(medium, smoothed, scaled)
    if kind == "yarn":
        # dimension index at which a frequency makes `rotations` full turns over the pretraining context
        def dimension_of(rotations: float) -> float:
            return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = dimension_of(rotary.beta_fast), dimension_of(rotary.beta_slow)
        if rotary.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64, device=device) - low) / (high - low)).clamp(0, 1)
        return inv_freq / factor * ramp + inv_freq * (1 - ramp)
    return inv_freq


def apply_rotary(x: Tensor, rotary: RotaryConfig) -> Tensor:
    """Rotate ``x: [..., position, d_head]`` by RoPE at positions 0..position−1 (an orthogonal map per position).

    Returns:
        Tensor of x's shape; the first ``rotary_dim`` coordinates rotate in pairs (halves, or adjacent pairs when
        ``interleaved``), the rest pass through.
    """
    n_pos, d_head = x.shape[-2], x.shape[-1]
    dim = rotary.rotary_dim
    if dim % 2 or dim > d_head:
        raise ShapeError(f"rotary_dim must be even and ≤ d_head ({d_head}), got {dim}")
    inv_freq = rotary_inverse_frequencies(rotary, n_pos, x.device)
    angle = torch.arange(n_pos, dtype=torch.float64, device=x.device)[:, None] * inv_freq[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    rotating, passing = x[..., :dim], x[..., dim:]
    if rotary.interleaved:
        a, b = rotating[..., 0::2], rotating[..., 1::2]
        ra, rb = a * cos - b * sin, a * sin + b * cos
        rotated = einops.rearrange(torch.stack((ra, rb), dim=-1), "... pair two -> ... (pair two)")
    else:
        a, b = rotating[..., : dim // 2], rotating[..., dim // 2 :]
        rotated = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return torch.cat((rotated, passing), dim=-1)


def expand_kv_heads(t: Tensor, n_head: int, dim: int) -> Tensor:
    """Repeat key/value heads along ``dim`` so that query head h sees kv head h // (n_head / kv_head)."""
    return torch.repeat_interleave(t, n_head // t.shape[dim], dim=dim)


def check_attention_shapes(X: Tensor, Wq: Tensor, Wk: Tensor, Wv: Tensor, Wo: Tensor) -> None:
    """Raise ShapeError unless X ``[batch, query, d_model]`` fits Wq/Wk/Wv ``[(batch,) head|kv_head, d_head,
    d_model]`` and Wo ``[(batch,) d_model, head * d_head]`` (weights optionally batched like X)."""
    if X.ndim != 3:
        raise ShapeError(f"X must be [batch, query, d_model], got shape {tuple(X.shape)}")
    if Wq.ndim not in (3, 4) or Wk.ndim != Wq.ndim or Wv.ndim != Wq.ndim or Wo.ndim != Wq.ndim - 1:
        raise ShapeError(
            f"Wq, Wk, Wv must be [(batch,) head, d_head, d_model] and Wo [(batch,) d_model, head*d_head]; got "
            f"{tuple(Wq.shape)}, {tuple(Wk.shape)}, {tuple(Wv.shape)}, {tuple(Wo.shape)}"
        )
    n_head, d_head, d_model = Wq.shape[-3:]
    if X.shape[-1] != d_model or (Wq.ndim == 4 and Wq.shape[0] not in (1, X.shape[0])):
        raise ShapeError(f"X {tuple(X.shape)} does not fit Wq {tuple(Wq.shape)}: width d_model and batch must match")
    if Wk.shape != Wv.shape or Wk.shape[-2:] != (d_head, d_model) or n_head % Wk.shape[-3]:
        raise ShapeError(
            f"Wk {tuple(Wk.shape)} and Wv {tuple(Wv.shape)} must be [kv_head, {d_head}, {d_model}] "
            f"with kv_head dividing {n_head}"
        )
    if Wo.shape[-2:] != (d_model, n_head * d_head):
        raise ShapeError(f"Wo must be [{d_model}, {n_head * d_head}], got {tuple(Wo.shape)}")


def allowed_keys(mask: Tensor | None, n_query: int, device: torch.device) -> Tensor:
    """Boolean ``[batch|1, head|1, query, key]`` of allowed keys from an optional ``[query, key]`` or
    ``[batch, query, key]`` mask (True = allowed); every query must keep at least one key."""
    if mask is None:
        return torch.ones(1, 1, n_query, n_query, dtype=torch.bool, device=device)
    if mask.dtype != torch.bool or mask.shape[-2:] != (n_query, n_query) or mask.ndim not in (2, 3):
        raise InputError(
            f"mask must be bool [query, key] or [batch, query, key] with query={n_query}, "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    allowed = mask if mask.ndim == 3 else mask[None]
    if not bool(allowed.any(dim=-1).all()):
        raise InputError("mask leaves a query row with no allowed key; allow at least one key per query")
    return allowed[:, None]


def mha_forward(X: Tensor, weights: AttentionWeights) -> AttentionForward:
    """z_i = W_O [y_i^1; …; y_i^H] + b_O with y_i^h = Σ_j P^h_ij v^h_j, P^h_i = softmax_{j allowed}(q_i·k_j/τ).

    Args:
        X: ``[batch, query, d_model]`` attention input (the tensor W_Q, W_K, W_V act on).
        weights: the sublayer: its projections and biases (cast to X's dtype), τ, its causal or sliding-window
            mask, RoPE (after the biases), QK-norm (after the biases, before RoPE, or after it under
            ``qk_norm_after_rotary``), logit softcap c (scores
            u = q·k/τ become c·tanh(u/c) before the mask, Gemma 2) and ALiBi slopes (head h adds m_h·(j − i) to
            the capped scores).

    Returns:
        ``AttentionForward`` (docs/math.md §2.6), in X's dtype.
    """
    return _mha_forward(X, _attention_tensors(weights, X.shape[1], X.device, X.dtype))


def _mha_forward(X: Tensor, a: _AttentionTensors) -> AttentionForward:
    """``mha_forward`` of the tensor form ``a`` (batched weights, any mask)."""
    Wq, Wk, Wv, Wo, biases = a.Wq, a.Wk, a.Wv, a.Wo, a.biases
    q_norm, k_norm, rotary, softcap, alibi_slopes, tau = a.q_norm, a.k_norm, a.rotary, a.softcap, a.alibi_slopes, a.tau
    check_attention_shapes(X, Wq, Wk, Wv, Wo)
    check_qk_norms(Wq.shape[-2], q_norm, k_norm, Wq.shape[-3], Wk.shape[-3])
    n_head = Wq.shape[-3]
    q = torch.einsum("...hed,...qd->...hqe", Wq, X)
    k = torch.einsum("...hed,...kd->...hke", expand_kv_heads(Wk, n_head, -3), X)
    v = torch.einsum("...hed,...kd->...hke", expand_kv_heads(Wv, n_head, -3), X)
    if biases.q is not None:
        q = q + biases.q[..., :, None, :]
    if biases.k is not None:
        k = k + expand_kv_heads(biases.k, n_head, -2)[..., :, None, :]
    if biases.v is not None:
        v = v + expand_kv_heads(biases.v, n_head, -2)[..., :, None, :]
    if rotary is not None and a.qk_norm_after_rotary:  # HunYuan: N(R_t a_t)
        q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
    query_inputs, key_inputs = (None if norm is None else x for x, norm in ((q, q_norm), (k, k_norm)))
    if q_norm is not None:
        q = qk_norm_forward(q, q_norm)
    if k_norm is not None:
        k = qk_norm_forward(k, k_norm)
    if rotary is not None and not a.qk_norm_after_rotary:
        q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
    allowed = allowed_keys(a.mask, X.shape[1], X.device)
    scores = (q @ k.transpose(-1, -2)) / tau
    score_slopes = None
    if softcap is not None:
        capped = torch.tanh(scores / softcap)
        scores, score_slopes = capped * softcap, 1.0 - capped.square()
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, X.shape[1]).to(scores.dtype)
    # The most negative finite value, not −inf: masked weights are still exactly 0 after the softmax, and
    # higher-order autograd through the mask stays finite (no 0·∞).
    probabilities = torch.softmax(scores.masked_fill(~allowed, torch.finfo(scores.dtype).min), dim=-1)
    head_outputs = probabilities @ v
    concatenated = einops.rearrange(head_outputs, "batch head query d_head -> batch query (head d_head)")
    output = concatenated @ Wo.transpose(-1, -2)
    if biases.o is not None:
        output = output + biases.o[..., None, :]
    return AttentionForward(
        output=output,
        probabilities=probabilities,
        queries=q,
        keys=k,
        values=v,
        head_outputs=head_outputs,
        allowed=allowed,
        query_inputs=query_inputs,
        key_inputs=key_inputs,
        score_slopes=score_slopes,
    )
