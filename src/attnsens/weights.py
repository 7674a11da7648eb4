"""Normalized per-layer weights: the one layout every adapter produces and every bound consumes.

Adapters (GPT-2 Conv1D, NeoX fused QKV, Llama GQA, BERT, attnsens' own GPT) convert their parameters into these
frozen dataclasses, so the geometry and influence code never branches on model families. The module sits below
both (docs/architecture.md, "Layers and import direction"): it imports nothing of attnsens but its errors, so the
bounds read weights without loading the adapters. ``attnsens.models`` re-exports the classes. Conventions:

* Linear maps act on column vectors: ``q = w_q[h] @ x + b_q[h]`` with ``w_q: [head, d_head, d_model]``.
* Key/value projections have ``kv_head`` heads (grouped-query attention); query head ``h`` reads key/value head
  ``kv_head_of(h) = h // (head // kv_head)``.
* ``w_o: [d_model, head * d_head]``; the columns ``h*d_head:(h+1)*d_head`` are head ``h``'s output block.
* ``tau`` is the softmax temperature (``sqrt(d_head)`` for scaled dot-product attention): ``p = softmax(q·k / tau)``.
* ``softcap`` c (Gemma 2): ``p = softmax(c·tanh(q·k / (tau·c)))``.
* ``alibi_slopes`` m (BLOOM): ``p_ij = softmax_j(q_i·k_j / tau + m_h (j − i))``, a bias independent of the input.
* ``sliding_window`` w: query i sees the keys at distance i − j < w before it, its own included (causal: Mistral,
  Qwen2, Gemma 2), or at distance |i − j| < w on either side (bidirectional: ModernBERT's local layers, whose
  module keeps w = local_attention // 2 + 1, so that each query sees local_attention // 2 keys on each side).
* QK-norm (``q_norm``, ``k_norm``): ``q = R_t N_q(w_q[h] @ x + b_q[h])``, an RMSNorm over each head's d_head
  coordinates (gamma ``[d_head]``, shared by the heads) between the projection and RoPE; or, with gamma
  ``[head·d_head]`` (``[kv_head·d_head]`` for keys), one RMSNorm over all heads' projections at once (OLMo 2).
  With ``qk_norm_after_rotary`` (HunYuan) the per-head norm follows RoPE instead: ``q = N_q(R_t(w_q[h] @ x +
  b_q[h]))``, a different function unless γ is constant on every rotating pair. A per-head QK-norm before RoPE
  may carry a beta ``[d_head]``, added after the norm: ``q = R_t(N_q(w_q[h] @ x + b_q[h]) + β_q)``. That is how
  a LayerNorm QK-norm (Persimmon, Phi) is read: LayerNorm(a) = RMSNorm(P a) + β with P = I − 11ᵀ/d_head the
  centring, and the adapter folds P into each head's rows of w_q, w_k and their biases.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from attnsens.errors import ConfigError, ShapeError

__all__ = [
    "ROPE_TYPES",
    "Activation",
    "AttentionWeights",
    "LayerWeights",
    "MLPKind",
    "MLPWeights",
    "MoEGateMode",
    "MoEWeights",
    "NormKind",
    "NormWeights",
    "Placement",
    "RopeType",
    "RotaryConfig",
    "XIELUParameters",
    "check_qk_norm_order",
    "check_qk_norms",
    "qk_norm_is_joint",
]

NormKind = Literal["layernorm", "rmsnorm"]
Placement = Literal["pre", "post", "none"]
Activation = Literal["gelu", "gelu_tanh", "relu", "silu", "quick_gelu", "relu2", "xielu"]
MLPKind = Literal["mlp", "gated"]
MoEGateMode = Literal["softmax", "topk_softmax"]


RopeType = Literal["default", "linear", "dynamic", "yarn", "llama3", "longrope"]
ROPE_TYPES: tuple[str, ...] = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


@dataclass(frozen=True, kw_only=True)
class RotaryConfig:
    """Rotary position embedding applied to queries and keys (after projection, before the scores).

    ``rope_type`` and the fields after it choose the inverse frequencies ω_i (transformers' ``rope_parameters``;
    computed by ``attnsens.geometry.attention.rotary_inverse_frequencies``). Every type only changes the
    frequencies, so the map stays a rotation per position. The cos/sin scale of yarn and longrope (their
    "attention factor" m) is not part of this config: on a fully rotating head it multiplies every score by m²,
    and adapters fold it into the temperature (τ/m²).

    * ``linear``: ω_i / factor. ``dynamic``: NTK base base·(factor·n'/P − (factor − 1))^(d/(d−2)) with
      n' = max(n, P), P = ``original_max_positions``. ``yarn``: a ramp between ω_i and ω_i / factor over the
      dimensions whose rotation count in P lies between ``beta_slow`` and ``beta_fast``. ``llama3``: ω_i / factor
      for wavelengths above P / low_freq_factor, ω_i below P / high_freq_factor, smoothed in between.
      ``longrope``: ω_i / long_factor_i when n > P, else ω_i / short_factor_i.
    """

    base: float
    rotary_dim: int  # number of leading dimensions of each head that rotate (d_head for Llama, less for NeoX)
    interleaved: bool = False  # False: rotate halves (GPT-NeoX/Llama "rotate_half"); True: rotate pairs (GPT-J)
    rope_type: RopeType = "default"
    factor: float = 1.0
    original_max_positions: int | None = None  # P above: the pretraining context (dynamic: max positions)
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: round the ramp's ends outwards
    short_factor: tuple[float, ...] | None = None  # longrope, rotary_dim / 2 values
    long_factor: tuple[float, ...] | None = None  # longrope

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(f"rope_type {self.rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
        if not self.base > 0 or not self.factor > 0:
            raise ConfigError(f"rotary base and factor must be > 0, got base={self.base}, factor={self.factor}")
        if self.rope_type in ("dynamic", "yarn", "llama3", "longrope") and not (self.original_max_positions or 0) > 0:
            raise ConfigError(f"rope_type {self.rope_type!r} needs original_max_positions > 0")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ConfigError(
                f"llama3 rope needs high_freq_factor > low_freq_factor > 0, got {self.high_freq_factor}, "
                f"{self.low_freq_factor}"
            )
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(float(v) for v in value))  # JSON gives lists
        if self.rope_type == "longrope":
            half = self.rotary_dim // 2
            sizes = [None if v is None else len(v) for v in (self.short_factor, self.long_factor)]
            if sizes != [half, half]:
                raise ConfigError(f"longrope needs short_factor and long_factor of {half} values, got sizes {sizes}")


@dataclass(frozen=True, kw_only=True)
class NormWeights:
    """LayerNorm ``γ ⊙ (x − μ)/σ + β`` or RMSNorm ``γ ⊙ x / rms(x)``, with σ = sqrt(var + eps)."""

    kind: NormKind
    gamma: Tensor  # [d_model]
    beta: Tensor | None  # [d_model]; None for RMSNorm and bias-free LayerNorm
    eps: float

    def __post_init__(self) -> None:
        if self.gamma.ndim != 1:
            raise ShapeError(f"norm gamma must be [d_model], got shape {tuple(self.gamma.shape)}")
        if self.beta is not None and self.beta.shape != self.gamma.shape:
            raise ShapeError(f"norm beta shape {tuple(self.beta.shape)} != gamma shape {tuple(self.gamma.shape)}")
        if not self.eps >= 0:
            raise ConfigError(f"norm eps must be >= 0, got {self.eps}")


def check_qk_norms(
    d_head: int, q_norm: NormWeights | None, k_norm: NormWeights | None, n_head: int = 1, n_kv_head: int = 1
) -> None:
    """ShapeError unless each given QK-norm is an RMSNorm whose gamma is ``[d_head]`` (per head) or covers all
    heads of its side jointly (``[n_head·d_head]`` for queries, ``[n_kv_head·d_head]`` for keys); only a per-head
    norm may carry a beta (``[d_head]``, added after the norm: the module docstring's LayerNorm QK-norm)."""
    for name, norm, heads in (("q_norm", q_norm, n_head), ("k_norm", k_norm, n_kv_head)):
        shapes = {(d_head,), (heads * d_head,)}
        if norm is not None and (norm.kind != "rmsnorm" or norm.gamma.shape not in shapes):
            raise ShapeError(
                f"{name} must be an RMSNorm over one head's {d_head} coordinates or over all {heads} heads "
                f"({heads * d_head}); got {norm.kind} with gamma {tuple(norm.gamma.shape)}"
            )
        if norm is not None and norm.beta is not None and qk_norm_is_joint(norm, d_head):
            raise ShapeError(f"{name}: a beta is supported on a per-head QK-norm (gamma [{d_head}]) only")


def check_qk_norm_order(
    after_rotary: bool, rotary: RotaryConfig | None, q_norm: NormWeights | None, k_norm: NormWeights | None,
    d_head: int,
) -> None:  # fmt: skip
    """ConfigError unless a QK-norm said to act after RoPE has a RoPE to follow, at least one norm, and only
    per-head norms without beta (a norm over all heads after RoPE is not bounded)."""
    if not after_rotary:
        return
    norms = [norm for norm in (q_norm, k_norm) if norm is not None]
    if rotary is None or not norms:
        raise ConfigError(
            f"qk_norm_after_rotary needs a rotary and a q_norm or k_norm, got rotary={rotary is not None}, "
            f"{len(norms)} QK-norm(s); leave it False without them"
        )
    if any(qk_norm_is_joint(norm, d_head) for norm in norms):
        raise ConfigError(
            f"qk_norm_after_rotary supports per-head QK-norms (gamma [{d_head}]) only, got gamma "
            f"{[tuple(norm.gamma.shape) for norm in norms]}"
        )
    if any(norm.beta is not None for norm in norms):
        raise ConfigError("qk_norm_after_rotary supports QK-norms without beta only")


def qk_norm_is_joint(norm: NormWeights, d_head: int) -> bool:
    """Whether a QK-norm (``check_qk_norms``) normalizes all heads of its side at once (OLMo 2) rather than each
    head's d_head coordinates (Qwen3, Gemma 3)."""
    return norm.gamma.shape[0] != d_head


@dataclass(frozen=True, kw_only=True)
class AttentionWeights:
    """One multi-head attention sublayer in the normalized layout (see module docstring)."""

    w_q: Tensor  # [head, d_head, d_model]
    w_k: Tensor  # [kv_head, d_head, d_model]
    w_v: Tensor  # [kv_head, d_head, d_model]
    w_o: Tensor  # [d_model, head * d_head]
    b_q: Tensor | None = None  # [head, d_head]
    b_k: Tensor | None = None  # [kv_head, d_head]
    b_v: Tensor | None = None  # [kv_head, d_head]
    b_o: Tensor | None = None  # [d_model]
    tau: float
    causal: bool
    rotary: RotaryConfig | None = None
    sliding_window: int | None = None  # causal: query i sees keys i − w < j ≤ i (Mistral, Qwen2, Phi-3);
    # bidirectional: |i − j| < w (ModernBERT)
    q_norm: NormWeights | None = None  # QK-norm: RMSNorm over each head's d_head (Qwen3, Gemma 3) or all heads (OLMo 2)
    k_norm: NormWeights | None = None  # likewise for keys; both act after the biases and before RoPE
    qk_norm_after_rotary: bool = False  # the per-head q_norm/k_norm act after RoPE instead (HunYuan)
    softcap: float | None = None  # Gemma 2: scores s = c·tanh(u/c) of u = q·k/τ before the mask and softmax
    alibi_slopes: Tensor | None = None  # [head] ALiBi (BLOOM): head h adds m_h·(j − i) to the score of key j

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"sliding_window={self.sliding_window} must be at least 1 (the query's own key)")
        if self.w_q.ndim != 3 or self.w_k.ndim != 3 or self.w_v.ndim != 3:
            raise ShapeError(
                "w_q, w_k, w_v must be [head, d_head, d_model]; got "
                f"{tuple(self.w_q.shape)}, {tuple(self.w_k.shape)}, {tuple(self.w_v.shape)}"
            )
        n_head, d_head, d_model = self.w_q.shape
        n_kv = self.w_k.shape[0]
        if self.w_k.shape != (n_kv, d_head, d_model) or self.w_v.shape != (n_kv, d_head, d_model):
            raise ShapeError(
                f"w_k {tuple(self.w_k.shape)} and w_v {tuple(self.w_v.shape)} must both be "
                f"[kv_head, {d_head}, {d_model}] to match w_q {tuple(self.w_q.shape)}"
            )
        if n_head % n_kv != 0:
            raise ShapeError(f"query heads ({n_head}) must be a multiple of key/value heads ({n_kv})")
        if self.w_o.shape != (d_model, n_head * d_head):
            raise ShapeError(f"w_o must be [{d_model}, {n_head * d_head}], got {tuple(self.w_o.shape)}")
        if not self.tau > 0:
            raise ConfigError(f"attention temperature tau must be > 0, got {self.tau}")
        check_qk_norms(d_head, self.q_norm, self.k_norm, n_head, n_kv)
        check_qk_norm_order(self.qk_norm_after_rotary, self.rotary, self.q_norm, self.k_norm, d_head)
        if self.softcap is not None and not self.softcap > 0:
            raise ConfigError(f"attention softcap must be > 0 (or None), got {self.softcap}")
        if self.alibi_slopes is not None and self.alibi_slopes.shape != (n_head,):
            raise ShapeError(f"alibi_slopes must be [{n_head}] (one slope per query head), got "
                             f"{tuple(self.alibi_slopes.shape)}")  # fmt: skip

    @property
    def n_head(self) -> int:
        return self.w_q.shape[0]

    @property
    def n_kv_head(self) -> int:
        return self.w_k.shape[0]

    @property
    def d_head(self) -> int:
        return self.w_q.shape[1]

    @property
    def d_model(self) -> int:
        return self.w_q.shape[2]

    def kv_head_of(self, head: int) -> int:
        """The key/value head that query head ``head`` reads (grouped-query attention)."""
        return head // (self.n_head // self.n_kv_head)

    def per_query_head(self) -> AttentionWeights:
        """The same attention with key/value weights repeated so that every query head has its own."""
        if self.n_kv_head == self.n_head:
            return self
        group = self.n_head // self.n_kv_head

        def repeat(t: Tensor) -> Tensor:
            return torch.repeat_interleave(t, group, dim=0)

        k_norm = self.k_norm
        if k_norm is not None and qk_norm_is_joint(k_norm, self.d_head):  # repeated heads keep mean(a²): same norm
            gamma = repeat(k_norm.gamma.reshape(self.n_kv_head, self.d_head)).flatten()
            k_norm = dataclasses.replace(k_norm, gamma=gamma)
        return dataclasses.replace(
            self,
            k_norm=k_norm,
            w_k=repeat(self.w_k),
            w_v=repeat(self.w_v),
            b_k=None if self.b_k is None else repeat(self.b_k),
            b_v=None if self.b_v is None else repeat(self.b_v),
        )


@dataclass(frozen=True, kw_only=True)
class XIELUParameters:
    """One layer's xIELU activation (Apertus), as the module applies it:
    f(z) = α_p z² + β z for z > 0 and α_n (expm1(min(z, ε)) − z) + β z for z ≤ 0.

    ``alpha_p`` and ``alpha_n`` are the effective coefficients (transformers keeps raw parameters r_p, r_n and applies
    α_p = softplus(r_p), α_n = β + softplus(r_n)); ``beta`` and ``eps`` are its buffers. With ε < 0 (the default,
    −10⁻⁶) f jumps by α_n expm1(ε) at 0, so it is not continuous there.
    """

    alpha_p: float
    alpha_n: float
    beta: float
    eps: float

    def __post_init__(self) -> None:
        for name in ("alpha_p", "alpha_n", "beta", "eps"):
            value = float(getattr(self, name))
            if not math.isfinite(value):
                raise ConfigError(f"xIELU parameter {name} must be finite, got {value}")
            object.__setattr__(self, name, value)  # a tensor or NumPy scalar becomes a Python float


@dataclass(frozen=True, kw_only=True)
class MLPWeights:
    """Positionwise map: ``w_out @ act(w_in x + b_in) + b_out`` or gated
    ``w_out @ (act(w_gate x + b_gate) ⊙ (w_in x + b_in)) + b_out``; ``xielu`` holds the parameters of the
    activation "xielu" (given exactly for it)."""

    kind: MLPKind
    activation: Activation
    w_in: Tensor  # [d_ff, d_model]
    w_out: Tensor  # [d_model, d_ff]
    b_in: Tensor | None = None  # [d_ff]
    b_out: Tensor | None = None  # [d_model]
    w_gate: Tensor | None = None  # [d_ff, d_model], gated kind only
    b_gate: Tensor | None = None  # [d_ff], gated kind only (Llama's mlp_bias=True)
    xielu: XIELUParameters | None = None  # activation "xielu" only: its layer's parameters

    def __post_init__(self) -> None:
        if (self.activation == "xielu") != (self.xielu is not None):
            raise ConfigError(
                f"xielu parameters must be given exactly when activation == 'xielu' (activation={self.activation!r}, "
                f"xielu={self.xielu})"
            )
        d_ff, d_model = self.w_in.shape
        if self.w_out.shape != (d_model, d_ff):
            raise ShapeError(f"w_out must be [{d_model}, {d_ff}], got {tuple(self.w_out.shape)}")
        if (self.kind == "gated") != (self.w_gate is not None):
            raise ConfigError(f"w_gate must be given exactly when kind == 'gated' (kind={self.kind!r})")
        if self.w_gate is not None and self.w_gate.shape != self.w_in.shape:
            raise ShapeError(f"w_gate shape {tuple(self.w_gate.shape)} != w_in shape {tuple(self.w_in.shape)}")
        if self.b_gate is not None and (self.w_gate is None or self.b_gate.shape != (d_ff,)):
            raise ShapeError(
                f"b_gate must be [{d_ff}] beside a w_gate, got {tuple(self.b_gate.shape)} (kind={self.kind!r})"
            )

    @property
    def gate(self) -> Tensor:
        """``w_gate`` of a gated MLP, typed as present (``__post_init__`` guarantees it for ``kind == "gated"``).

        Raises:
            ConfigError: a plain MLP, which has no gate.
        """
        if self.w_gate is None:
            raise ConfigError(f"a {self.kind!r} MLP has no w_gate; only kind 'gated' has one")
        return self.w_gate


@dataclass(frozen=True, kw_only=True)
class MoEWeights:
    """A mixture of experts on each token: logits ℓ = W_r x, the selected set S(x) of the ``top_k`` largest,
    gate weights g_e for e ∈ S and output Σ_{e∈S} g_e E_e(x) + σ(w_s·x) E_s(x) (the last term only with a shared
    expert, Qwen2-MoE).

    ``gate_mode`` "softmax": g_e = softmax(ℓ)_e over all experts (Qwen2/3-MoE and OLMoE without
    ``norm_topk_prob``); "topk_softmax": g_e = softmax(ℓ_S)_e over the selected logits alone, which equals the
    renormalized p_e / Σ_{f∈S} p_f (Mixtral, Granite-MoE, and the others with ``norm_topk_prob``).
    """

    router: Tensor  # [expert, d_model]
    experts: tuple[MLPWeights, ...]  # E_e, one per router row
    top_k: int
    gate_mode: MoEGateMode
    shared: MLPWeights | None = None  # E_s, always applied
    shared_gate: Tensor | None = None  # [d_model] w_s: E_s is scaled by σ(w_s·x); given exactly beside ``shared``

    def __post_init__(self) -> None:
        object.__setattr__(self, "experts", tuple(self.experts))
        if self.router.ndim != 2 or self.router.shape[0] != len(self.experts):
            raise ShapeError(
                f"router must be [expert, d_model] with one row per expert ({len(self.experts)}), got "
                f"{tuple(self.router.shape)}"
            )
        if not 1 <= self.top_k <= len(self.experts):
            raise ConfigError(f"top_k must lie in [1, {len(self.experts)}] (the number of experts), got {self.top_k}")
        if self.gate_mode not in ("softmax", "topk_softmax"):
            raise ConfigError(f"gate_mode must be 'softmax' or 'topk_softmax', got {self.gate_mode!r}")
        d_model = self.router.shape[1]
        for mlp in (*self.experts, *([] if self.shared is None else [self.shared])):
            if mlp.w_in.shape[1] != d_model:
                raise ShapeError(f"every expert must read d_model = {d_model}, got w_in {tuple(mlp.w_in.shape)}")
        if (self.shared is None) != (self.shared_gate is None):
            raise ConfigError("shared and shared_gate must be given together (the shared expert's sigmoid gate)")
        if self.shared_gate is not None and self.shared_gate.shape != (d_model,):
            raise ShapeError(f"shared_gate must be [{d_model}], got {tuple(self.shared_gate.shape)}")

    @property
    def n_expert(self) -> int:
        return len(self.experts)


@dataclass(frozen=True, kw_only=True)
class LayerWeights:
    """One transformer block.

    placement ``"pre"``:  X ← X + Attn(N1(X)); X ← X + MLP(N2(X))
    placement ``"post"``: X ← N1(X + Attn(X)); X ← N2(X + MLP(X))
    placement ``"none"``: X ← X + Attn(X);     X ← X + MLP(X)      (attn_norm and mlp_norm are None)

    A "pre" layer may lack N1 alone (``attn_norm`` None, never beside ``parallel_residual``): its attention reads
    the residual stream itself, X ← X + Attn(X); X ← X + MLP(N2(X)) (ModernBERT's first layer, whose embeddings end
    with a norm).

    ``residual_scale`` is DeepNorm's α (X ← N(α X + F(X))); 1 otherwise.
    ``parallel_residual`` (GPT-NeoX/Pythia, pre placement only): X ← X + Attn(N1(X)) + MLP(N2(X)), both
    sublayers reading the block input.

    ``mlp`` is a dense positionwise map or a mixture of experts (``MoEWeights``), tokenwise either way.

    ``attn_out_norm`` and ``mlp_out_norm`` are norms applied to a sublayer's *output* before the residual sum
    (post-sublayer norms); each is optional (None: no norm there) and allowed with placements "pre" and "none"
    only, never beside ``parallel_residual``:

    "pre" with them (Gemma 2/3, "sandwich" norms): X ← X + N_ao(Attn(N1(X))); X ← X + N_mo(MLP(N2(X)))
    "none" with them (OLMo 2):                    X ← X + N_ao(Attn(X));     X ← X + N_mo(MLP(X))

    ``beside_attention`` names a branch attnsens does not model that reads N1(X) beside the attention and adds to
    the same residual sum (Falcon-H1's Mamba-2 mixer): X ← X + Attn(N1(X)) + B(N1(X)); X ← X + MLP(N2(X)) ("pre"
    with both norms only). The block is then not the function of these weights: its attention and MLP are bounded
    each on its own, and no block bound, block forward or stream through it exists.
    """

    index: int
    placement: Placement
    attention: AttentionWeights
    mlp: MLPWeights | MoEWeights
    attn_norm: NormWeights | None
    mlp_norm: NormWeights | None
    residual_scale: float = 1.0
    parallel_residual: bool = False
    attn_out_norm: NormWeights | None = None
    mlp_out_norm: NormWeights | None = None
    beside_attention: str | None = None  # a branch beside the attention that attnsens does not model (its name)

    def __post_init__(self) -> None:
        if self.beside_attention is not None and (
            self.placement != "pre" or self.attn_norm is None or self.parallel_residual or self.has_out_norms
        ):
            raise ConfigError(
                f"layer {self.index}: a branch beside the attention ({self.beside_attention}) needs placement 'pre' "
                "with both norms, no parallel residual and no norms after the sublayers"
            )
        if self.placement == "none" and (self.attn_norm is not None or self.mlp_norm is not None):
            raise ConfigError(f"layer {self.index}: placement 'none' requires no attn_norm or mlp_norm")
        if self.placement == "post" and (self.attn_norm is None or self.mlp_norm is None):
            raise ConfigError(f"layer {self.index}: placement 'post' requires both attn_norm and mlp_norm")
        if self.placement == "pre" and self.mlp_norm is None:
            raise ConfigError(
                f"layer {self.index}: placement 'pre' requires mlp_norm (and attn_norm, unless the attention reads "
                "the residual stream itself)"
            )
        if self.parallel_residual and (self.placement != "pre" or self.attn_norm is None):
            raise ConfigError(
                f"layer {self.index}: parallel_residual needs placement 'pre' with both norms, got "
                f"{self.placement!r}" + (" without attn_norm" if self.placement == "pre" else "")
            )
        if self.has_out_norms:
            if self.placement == "post":
                raise ConfigError(
                    f"layer {self.index}: attn_out_norm/mlp_out_norm (norms after each sublayer) need placement "
                    "'pre' (Gemma 2/3) or 'none' (OLMo 2), got 'post'"
                )
            if self.parallel_residual:
                raise ConfigError(
                    f"layer {self.index}: attn_out_norm/mlp_out_norm are not supported beside parallel_residual"
                )

    @property
    def attention_reads_stream(self) -> bool:
        """Whether the attention sublayer reads the block input itself: every placement but "pre", and a "pre"
        layer without ``attn_norm``."""
        return self.placement != "pre" or self.attn_norm is None

    @property
    def has_out_norms(self) -> bool:
        """Whether a norm follows either sublayer (``attn_out_norm`` or ``mlp_out_norm`` is set)."""
        return self.attn_out_norm is not None or self.mlp_out_norm is not None

    def norms(self) -> tuple[NormWeights, NormWeights]:
        """``(attn_norm, mlp_norm)`` of a "post" layer or a "pre" layer with both, typed as present
        (``__post_init__`` guarantees both for "post"), so a branch reads them without rechecking each for None.

        Raises:
            ConfigError: placement "none", which has no norms, or a "pre" layer without ``attn_norm``.
        """
        if self.attn_norm is None or self.mlp_norm is None:
            missing = "norms" if self.placement == "none" else "attn_norm"
            raise ConfigError(f"layer {self.index}: placement {self.placement!r} has no {missing}")
        return self.attn_norm, self.mlp_norm

    def mlp_pre_norm(self) -> NormWeights:
        """``mlp_norm`` of a "pre" or "post" layer, typed as present (``__post_init__`` guarantees it there).

        Raises:
            ConfigError: placement "none", which has no norms.
        """
        if self.mlp_norm is None:
            raise ConfigError(f"layer {self.index}: placement {self.placement!r} has no mlp_norm")
        return self.mlp_norm
