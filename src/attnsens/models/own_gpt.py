"""attnsens' own GPT (``attnsens.train.model.GPT``): its normalized weights, read through its TransformerLens-style
hook points.

Queries and keys come from ``blocks.{i}.attn.hook_q`` / ``hook_k``; the layer inputs from ``hook_resid_pre``,
``attn.hook_input`` and ``mlp.hook_input``; the layer outputs from ``hook_attn_out``, ``hook_mlp_out`` and
``hook_resid_post``. For post-LN and DeepNorm blocks the sums entering the norms,
α X + F(X), are rebuilt from the block input and the sublayer outputs (``hook_attn_out``, ``hook_mlp_out``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

from attnsens.errors import InputError
from attnsens.models.adapter import ModelAdapter, ModelSpec, QueryKeyCallback
from attnsens.models.attention import AttentionCall
from attnsens.train.model import GPT, Block, GPTConfig
from attnsens.weights import AttentionWeights, LayerWeights, MLPWeights, NormWeights, Placement

PLACEMENTS: dict[str, Placement] = {"pre": "pre", "post": "post", "deepnorm": "post", "none": "none"}
"""``GPTConfig.norm`` → the normalized placement: DeepNorm is "post" with residual scale α."""


SCORE_BYTES = 12
"""Bytes a score of the GPT's attention may hold at the peak of its forward pass: scores, masked scores, pattern."""


class OwnGPTAdapter(ModelAdapter):
    family = "own_gpt"

    module: GPT

    def __init__(self, module: GPT, *, name: str = "attnsens-gpt", tokenizer: Any = None) -> None:
        super().__init__(module, name=name, spec=self.spec_of(module.config))
        self.tokenizer = tokenizer

    @staticmethod
    def spec_of(config: GPTConfig) -> ModelSpec:
        placement = PLACEMENTS[config.norm]
        return ModelSpec(
            n_layer=config.n_layer,
            n_head=config.n_head,
            n_kv_head=config.n_head,
            d_model=config.d_model,
            d_head=config.d_head,
            max_positions=config.max_positions,
            vocab_size=config.vocab_size,
            placement=placement,
            norm=None if placement == "none" else "layernorm",
            causal=bool(config.causal),
        )

    def read_layers(self) -> Sequence[LayerWeights]:
        return gpt_layer_weights(self.module)

    def forward_score_bytes(self, batch: int, n: int) -> int:
        """The GPT's attention holds a layer's float32 scores, masked scores and pattern, [batch, head, n, n]
        each, and an [n, n] boolean mask (``CausalSelfAttention``): ``SCORE_BYTES`` a score and one byte a mask
        entry (builtin:lnfree measured 8.1–8.2 bytes a score at 2,048 and 3,072 tokens)."""
        return batch * self.spec.n_head * n * n * SCORE_BYTES + n * n

    def tokenwise_modules(self) -> list[torch.nn.Module]:
        return [block.mlp for block in self.module.blocks]

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> None:
        if attention_mask is not None and not bool(torch.as_tensor(attention_mask).bool().all()):
            raise InputError("attnsens' own GPT has no padding mask; pass equal-length sequences without padding")
        self.module(input_ids)

    @contextlib.contextmanager
    def query_key_tap(self, on_query_key: QueryKeyCallback) -> Iterator[None]:
        call = AttentionCall(tau=float(self.module.config.tau), causal=bool(self.module.config.causal))
        handles = []
        for layer, block in enumerate(self.module.blocks):
            latest: dict[str, Tensor] = {}

            def keep_query(_m: Any, _a: Any, out: Tensor, latest: dict[str, Tensor] = latest) -> None:
                latest["query"] = out

            def report_key(
                _m: Any, _a: Any, out: Tensor, latest: dict[str, Tensor] = latest, layer: int = layer
            ) -> None:
                on_query_key(layer, latest.pop("query"), out, call)

            # hook_q runs before hook_k in the forward pass, so the key hook reports both.
            handles.append(block.attn.hook_q.register_forward_hook(keep_query))
            handles.append(block.attn.hook_k.register_forward_hook(report_key))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def layer_input_taps(self, record: Callable[[int, str, Tensor], Tensor | None]) -> Iterator[None]:
        alpha = float(self.module.config.deepnorm_alpha)
        post = self.spec.placement == "post"
        handles = []
        for layer, block in enumerate(self.module.blocks):
            seen: dict[str, Tensor] = {}

            def tap(field: str, layer: int = layer, seen: dict[str, Tensor] = seen) -> Callable[..., Tensor | None]:
                def hook(_m: Any, _a: Any, out: Tensor) -> Tensor | None:
                    replacement = record(layer, field, out)
                    seen[field] = out if replacement is None else replacement
                    return replacement

                return hook

            def residual_sum(
                field: str, source: str, layer: int = layer, seen: dict[str, Tensor] = seen
            ) -> Callable[..., None]:
                def hook(_m: Any, _a: Any, out: Tensor) -> None:
                    record(layer, field, alpha * seen[source] + out)

                return hook

            handles.append(block.hook_resid_pre.register_forward_hook(tap("block_input")))
            handles.append(block.attn.hook_input.register_forward_hook(tap("attention_input")))
            handles.append(block.mlp.hook_input.register_forward_hook(tap("mlp_input")))
            if post:
                handles.append(
                    block.hook_attn_out.register_forward_hook(residual_sum("attention_residual_sum", "block_input"))
                )
                handles.append(block.hook_mlp_out.register_forward_hook(residual_sum("mlp_residual_sum", "mlp_input")))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def layer_output_taps(self, record: Callable[[int, str, Tensor], None]) -> Iterator[None]:
        points = {"attention_output": "hook_attn_out", "mlp_output": "hook_mlp_out", "block_output": "hook_resid_post"}
        handles = []
        for layer, block in enumerate(self.module.blocks):
            for field, name in points.items():

                def hook(_m: Any, _a: Any, out: Tensor, layer: int = layer, field: str = field) -> None:
                    record(layer, field, out)

                handles.append(getattr(block, name).register_forward_hook(hook))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def encode(self, text: str, *, max_length: int | None = None, special_tokens: bool = True) -> Tensor:
        # attnsens' GPT is trained on tokens without special tokens: there are none to add.
        if self.tokenizer is None:
            raise InputError(f"model {self.name!r} has no tokenizer; pass token ids, or load(..., tokenizer=...)")
        encoded = self.tokenizer.encode(text)
        # transformers tokenizers return a list of ids, `tokenizers.Tokenizer` an Encoding holding them.
        ids = torch.as_tensor(getattr(encoded, "ids", encoded), dtype=torch.long)
        return ids[:max_length].unsqueeze(0) if max_length is not None else ids.unsqueeze(0)


def gpt_layer_weights(model: GPT) -> list[LayerWeights]:
    """The blocks of attnsens' own GPT in the normalized layout (attnsens/weights.py), as detached float32 copies.

    Returns: one LayerWeights per block; placement "pre" | "post" | "none", DeepNorm as "post" with
    residual_scale α; tau = √d_head; w_q/w_k/w_v [head, d_head, d_model] (rows of the stacked ``c_attn``),
    w_o [d_model, head·d_head].
    """
    return [_block_weights(index, block, model.config) for index, block in enumerate(model.blocks)]


def _block_weights(index: int, block: Block, config: GPTConfig) -> LayerWeights:
    n_head = config.n_head
    w_q, w_k, w_v = block.attn.c_attn.weight.chunk(3, dim=0)
    bias = block.attn.c_attn.bias
    b_q, b_k, b_v = (None, None, None) if bias is None else bias.chunk(3)
    attention = AttentionWeights(
        w_q=_per_head(w_q, n_head),
        w_k=_per_head(w_k, n_head),
        w_v=_per_head(w_v, n_head),
        w_o=_copy(block.attn.c_proj.weight),
        b_q=_per_head_bias(b_q, n_head),
        b_k=_per_head_bias(b_k, n_head),
        b_v=_per_head_bias(b_v, n_head),
        b_o=_copy_bias(block.attn.c_proj.bias),
        tau=config.tau,
        causal=config.causal,
    )
    mlp = MLPWeights(
        kind="mlp",
        activation=config.activation,
        w_in=_copy(block.mlp.c_fc.weight),
        w_out=_copy(block.mlp.c_proj.weight),
        b_in=_copy_bias(block.mlp.c_fc.bias),
        b_out=_copy_bias(block.mlp.c_proj.bias),
    )
    return LayerWeights(
        index=index,
        placement=PLACEMENTS[config.norm],
        attention=attention,
        mlp=mlp,
        attn_norm=_layer_norm(block.ln_1, config.layer_norm_eps),
        mlp_norm=_layer_norm(block.ln_2, config.layer_norm_eps),
        residual_scale=config.deepnorm_alpha,
    )


def _copy(t: Tensor) -> Tensor:
    """A detached float32 copy, so the normalized weights never alias (or train with) the model's parameters."""
    return t.detach().float().clone()


def _copy_bias(t: Tensor | None) -> Tensor | None:
    return None if t is None else _copy(t)


def _per_head(t: Tensor, n_head: int) -> Tensor:
    return rearrange(_copy(t), "(head d_head) d_model -> head d_head d_model", head=n_head)


def _per_head_bias(t: Tensor | None, n_head: int) -> Tensor | None:
    return None if t is None else rearrange(_copy(t), "(head d_head) -> head d_head", head=n_head)


def _layer_norm(ln: nn.LayerNorm | None, eps: float) -> NormWeights | None:
    if ln is None:
        return None
    return NormWeights(kind="layernorm", gamma=_copy(ln.weight), beta=_copy_bias(ln.bias), eps=eps)
