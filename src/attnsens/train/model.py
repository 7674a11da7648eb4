"""attnsens' own GPT: one readable decoder whose attention probabilities exist as a tensor.

The forward pass reads like docs/math.md §2.6–2.9: token (+ position) embedding, N blocks, optional final LayerNorm,
tied unembedding. Attention is computed explicitly (scores → mask → softmax → mix) so every probability row can
be hooked at ``blocks.{i}.attn.hook_pattern`` ([batch, head, query, key]). Block variants (docs/math.md §2.9):

* ``norm="pre"``:      X ← X + Attn(LN_1(X));   X ← X + MLP(LN_2(X));   final LN before the unembedding
* ``norm="post"``:     X ← LN_1(X + Attn(X));   X ← LN_2(X + MLP(X))
* ``norm="deepnorm"``: X ← LN_1(αX + Attn(X));  X ← LN_2(αX + MLP(X)),  α = (2N)^{1/4}, β = (8N)^{-1/4} (T9)
* ``norm="none"``:     X ← X + Attn(X);         X ← X + MLP(X);         no LayerNorm anywhere (influence, §10.1)

Hook points (``HookPoint`` modules, so ``model.get_submodule(name).register_forward_hook`` works):
``blocks.{i}.hook_resid_pre``, ``blocks.{i}.attn.hook_input`` (LN_1 output for pre-LN), ``blocks.{i}.attn.hook_q``,
``.hook_k``, ``.hook_v``, ``.hook_scores``, ``.hook_pattern``, ``.hook_z``, ``blocks.{i}.hook_attn_out``,
``blocks.{i}.hook_resid_mid``, ``blocks.{i}.mlp.hook_input``, ``blocks.{i}.hook_mlp_out``,
``blocks.{i}.hook_resid_post``, ``hook_final``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, cast, overload

import torch
from einops import rearrange
from torch import Tensor, nn
from torch.nn import functional as F

from attnsens.errors import ConfigError, ShapeError

NormPlacement = Literal["pre", "post", "deepnorm", "none"]
NORM_PLACEMENTS: tuple[NormPlacement, ...] = ("pre", "post", "deepnorm", "none")
PositionKind = Literal["learned", "sinusoidal", "none"]
ActivationKind = Literal["gelu_tanh", "gelu", "relu"]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Shape and variant of a GPT; ``d_ff`` defaults to ``4 * d_model``."""

    vocab_size: int
    n_layer: int
    n_head: int
    d_model: int
    max_positions: int
    d_ff: int | None = None
    norm: NormPlacement = "pre"
    positions: PositionKind = "learned"
    position_scale: float = 1.0  # amplitude of the sinusoidal embeddings
    causal: bool = True  # False: every query attends to every key (the influence theorem's setting)
    activation: ActivationKind = "gelu_tanh"
    bias: bool = True
    layer_norm_eps: float = 1e-5
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head != 0:
            raise ConfigError(
                f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head}); pick d_model = n_head * d_head"
            )
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", self.mlp_width)
        elif not isinstance(self.d_ff, int) or self.d_ff < 1:
            raise ConfigError(f"GPTConfig.d_ff must be a positive integer, got {self.d_ff!r}")
        choices = {
            "norm": NORM_PLACEMENTS,
            "positions": ("learned", "sinusoidal", "none"),
            "activation": ("gelu_tanh", "gelu", "relu"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"GPTConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not self.position_scale >= 0:
            raise ConfigError(f"GPTConfig.position_scale must be >= 0, got {self.position_scale}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")
        if not self.layer_norm_eps > 0:
            raise ConfigError(f"GPTConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        if not self.init_std > 0:
            raise ConfigError(f"GPTConfig.init_std must be > 0, got {self.init_std}")

    @property
    def mlp_width(self) -> int:
        """``d_ff`` as an int: the value given, else 4 · d_model (what ``__post_init__`` stores for None)."""
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    @property
    def tau(self) -> float:
        """Softmax temperature √d_head of scaled dot-product attention (docs/math.md §2.1)."""
        return math.sqrt(self.d_head)

    @property
    def deepnorm_alpha(self) -> float:
        """DeepNorm residual scale α = (2N)^{1/4} for a decoder of N layers (docs/math.md T9); 1 for other variants."""
        return (2 * self.n_layer) ** 0.25 if self.norm == "deepnorm" else 1.0

    @property
    def deepnorm_beta(self) -> float:
        """DeepNorm initialization gain β = (8N)^{-1/4} on W_V, W_O and the FFN (docs/math.md T9)."""
        return (8 * self.n_layer) ** -0.25


PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(vocab_size=1024, n_layer=4, n_head=4, d_model=128, max_positions=128),
    "small": GPTConfig(vocab_size=50257, n_layer=12, n_head=12, d_model=768, max_positions=1024),
    "medium": GPTConfig(vocab_size=50257, n_layer=24, n_head=16, d_model=1024, max_positions=1024),
    "large": GPTConfig(vocab_size=50257, n_layer=36, n_head=20, d_model=1280, max_positions=1024),
}


def norm_placement(name: str) -> NormPlacement:
    """``name`` as a block placement (``GPTConfig.norm``); ConfigError naming the choices otherwise."""
    if name not in NORM_PLACEMENTS:
        raise ConfigError(f"GPTConfig.norm must be one of {NORM_PLACEMENTS}, got {name!r}")
    return name


def preset(name: str, **overrides: Any) -> GPTConfig:
    """The named configuration (tiny, small, medium, large = GPT-2 large, 774,030,080 parameters) with overrides."""
    if name not in PRESETS:
        raise ConfigError(f"unknown GPT preset {name!r}; choose one of {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


class HookPoint(nn.Identity):
    """A named identity: register forward hooks on it to read (or replace) the tensor passing through."""


def sinusoidal_position_embeddings(n_positions: int, d_model: int, *, scale: float = 1.0) -> Tensor:
    """Fixed embeddings E[t, 2i] = s·sin(t/10000^{2i/d}), E[t, 2i+1] = s·cos(t/10000^{2i/d}), for any length.

    Returns: [query, d_model] float32; every entry has magnitude ≤ s, so ‖E[t]‖₂ ≤ s·√(d_model/2) + s for all t
    (bounded positions, as the influence theorem requires, docs/math.md §10.1).
    """
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]
    frequency = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d_model // 2])
    return (scale * table).float()


class CausalSelfAttention(nn.Module):
    """Multi-head attention with an explicit softmax: P = softmax(QKᵀ/τ + mask), Z = P V (docs/math.md §2.6)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.tau, self.causal = config.n_head, config.tau, config.causal
        self.c_attn = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)  # W_Q; W_K; W_V stacked
        self.c_proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)  # W_O
        self.attn_dropout = nn.Dropout(config.dropout)
        self.hook_input = HookPoint()
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        x = self.hook_input(x)  # (batch, query, d_model)
        n_query = x.shape[1]
        qkv = self.c_attn(x)  # (batch, query, 3·d_model)
        q, k, v = rearrange(
            qkv, "batch query (three head d_head) -> three batch head query d_head", three=3, head=self.n_head
        )
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)  # (batch, head, query, d_head)
        scores = (q @ k.transpose(-2, -1)) / self.tau  # (batch, head, query, key)
        if self.causal:
            future = torch.ones(n_query, n_query, dtype=torch.bool, device=x.device).triu(1)  # (query, key)
            scores = scores.masked_fill(future, float("-inf"))
        scores = self.hook_scores(scores)  # (batch, head, query, key), masked keys are -inf
        pattern = self.hook_pattern(torch.softmax(scores, dim=-1))  # (batch, head, query, key), rows sum to 1
        z = self.hook_z(self.attn_dropout(pattern) @ v)  # (batch, head, query, d_head)
        return self.c_proj(rearrange(z, "batch head query d_head -> batch query (head d_head)"))


class MLP(nn.Module):
    """Positionwise map φ(x) = W_2 act(W_1 x + b_1) + b_2 (docs/math.md §2.7)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.d_model, config.mlp_width, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_width, config.d_model, bias=config.bias)
        self.activation = config.activation
        self.hook_input = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.c_fc(self.hook_input(x))  # (batch, query, d_ff)
        if self.activation == "relu":
            hidden = F.relu(hidden)
        else:
            hidden = F.gelu(hidden, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return self.c_proj(hidden)


class Block(nn.Module):
    """One residual block in the configured placement (module docstring; docs/math.md §2.9)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.norm, self.alpha = config.norm, config.deepnorm_alpha
        has_ln = config.norm != "none"
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.bias) if has_ln else None
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.bias) if has_ln else None
        self.attn = CausalSelfAttention(config)
        self.mlp = MLP(config)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        x = self.hook_resid_pre(x)  # (batch, query, d_model)
        if self.ln_1 is None or self.ln_2 is None:  # norm == "none"
            x = self.hook_resid_mid(x + self._attn_out(x))
            return self.hook_resid_post(x + self._mlp_out(x))
        if self.norm == "pre":
            x = self.hook_resid_mid(x + self._attn_out(self.ln_1(x)))
            return self.hook_resid_post(x + self._mlp_out(self.ln_2(x)))
        x = self.hook_resid_mid(self.ln_1(self.alpha * x + self._attn_out(x)))  # post-LN; DeepNorm when α > 1
        return self.hook_resid_post(self.ln_2(self.alpha * x + self._mlp_out(x)))

    def _attn_out(self, x: Tensor) -> Tensor:
        return self.hook_attn_out(self.resid_dropout(self.attn(x)))

    def _mlp_out(self, x: Tensor) -> Tensor:
        return self.hook_mlp_out(self.resid_dropout(self.mlp(x)))


class BlockList(nn.ModuleList):
    """The ``nn.ModuleList`` of a GPT's blocks, typed: indexing and iterating give ``Block``s, not plain Modules."""

    def __init__(self, blocks: Iterable[Block]) -> None:
        super().__init__(blocks)

    @overload
    def __getitem__(self, index: slice) -> BlockList: ...

    @overload
    def __getitem__(self, index: int) -> Block: ...

    def __getitem__(self, index: int | slice) -> Block | BlockList:
        return cast("Block | BlockList", super().__getitem__(index))  # only Blocks are ever added

    def __iter__(self) -> Iterator[Block]:
        return cast(Iterator[Block], super().__iter__())


class GPT(nn.Module):
    """Decoder-only transformer: logits = U · h_final, h_final = LN_f(blocks(E[tokens] + P[positions]))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.max_positions, config.d_model) if config.positions == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = BlockList(Block(config) for _ in range(config.n_layer))
        # Post-LN and DeepNorm blocks already end in a LayerNorm; only pre-LN needs a final one.
        self.ln_f = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.bias) if config.norm == "pre" else None
        )
        self.hook_final = HookPoint()
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialization: N(0, σ²) weights, zero biases, residual projections scaled by 1/√(2N).

        DeepNorm instead uses DeepNet's Xavier-normal initialization with gain β on W_V, W_O and both FFN
        matrices and gain 1 on W_Q, W_K (docs/math.md T9).
        """
        config, std = self.config, self.config.init_std
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        d = config.d_model
        for block in self.blocks:
            if config.norm == "deepnorm":
                beta = config.deepnorm_beta
                for rows, gain in ((slice(0, d), 1.0), (slice(d, 2 * d), 1.0), (slice(2 * d, 3 * d), beta)):
                    nn.init.xavier_normal_(block.attn.c_attn.weight[rows], gain=gain)
                for linear in (block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
                    nn.init.xavier_normal_(linear.weight, gain=beta)
            else:
                for linear in (block.attn.c_proj, block.mlp.c_proj):
                    nn.init.normal_(linear.weight, std=std / math.sqrt(2 * config.n_layer))

    def position_embeddings(self, n_positions: int) -> Tensor:
        """Positional embeddings added to the first ``n_positions`` tokens. Returns: [query, d_model]."""
        config, device = self.config, self.wte.weight.device
        if self.wpe is not None:  # learned positions
            if n_positions > config.max_positions:
                raise ShapeError(
                    f"sequence length {n_positions} exceeds max_positions={config.max_positions} of learned "
                    "positions; shorten the input or use positions='sinusoidal'"
                )
            return self.wpe.weight[:n_positions]
        if config.positions == "sinusoidal":
            table = sinusoidal_position_embeddings(n_positions, config.d_model, scale=config.position_scale)
            return table.to(device=device, dtype=self.wte.weight.dtype)
        return torch.zeros(n_positions, config.d_model, device=device, dtype=self.wte.weight.dtype)

    @property
    def unembedding(self) -> Tensor:
        """U with logits = U h: [vocab, d_model] (the token embedding when tied)."""
        return self.wte.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids: Tensor) -> Tensor:
        """Next-token logits. Args: input_ids [batch, query] integer. Returns: [batch, query, vocab]."""
        if input_ids.ndim != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise ShapeError(
                f"input_ids must be an integer tensor [batch, query], got dtype {input_ids.dtype} "
                f"shape {tuple(input_ids.shape)}"
            )
        x = self.drop(self.wte(input_ids) + self.position_embeddings(input_ids.shape[1]))  # (batch, query, d_model)
        for block in self.blocks:
            x = block(x)
        if self.ln_f is not None:
            x = self.ln_f(x)
        return F.linear(self.hook_final(x), self.unembedding)  # (batch, query, vocab)

    def loss(self, input_ids: Tensor, targets: Tensor) -> Tensor:
        """Mean next-token cross-entropy (nats). Args: input_ids, targets [batch, query]. Returns: scalar."""
        if targets.shape != input_ids.shape:
            raise ShapeError(f"targets shape {tuple(targets.shape)} != input_ids shape {tuple(input_ids.shape)}")
        logits = self(input_ids)
        return F.cross_entropy(
            rearrange(logits, "batch query vocab -> (batch query) vocab").float(), targets.reshape(-1)
        )

    def n_params(self) -> int:
        """Number of distinct parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())
