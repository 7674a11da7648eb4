"""Families read from one declarative table (:data:`LAYOUTS`): the decoders GPT-2 (Conv1D weights), GPT-BigCode
(GPT-2's block on nn.Linear, multi-query attention), GPT-NeoX (Pythia), Llama (SmolLM2; Seed-OSS and InternLM3 are
Llama's block; Granite with a residual multiplier; OLMo with parameter-free LayerNorms; SmolLM3 with NoPE layers;
Helium and ERNIE 4.5 with RoPE on adjacent pairs; GLM and GLM-4 with a fused gate-up projection and a partial RoPE on
adjacent pairs, GLM-4 with sandwich norms), Mistral, Ministral, Qwen2, Qwen3 (per-head QK-norm), Gemma, Gemma 2
(sandwich norms, attention logit softcap; VaultGemma with pre-norms only), Gemma 3 (sandwich norms, per-head QK-norm,
one RoPE per layer type), OLMo 2 (norms after each sublayer only, QK-norm over all heads; OLMo 3 the same, with
sliding windows), Phi, Phi-3, StableLM, StarCoder2, Cohere (Cohere 2 with windows, RoPE on its sliding layers alone),
BioGPT, OPT, GPT-J, CodeGen (GPT-J's block, its fused qkv in model-parallel shards), BLOOM and MPT (ALiBi; their
taps live in ``bloom`` and ``mpt``), Falcon (``falcon`` picks its arrangement), Arcee, Nemotron (LayerNorms scaling by
1 + w) and Persimmon (relu² MLPs), Apertus (per-head QK-norm, a plain MLP whose xIELU activation has trained
parameters, read from each layer's activation module), EXAONE 4 (OLMo 2's block, windows and RoPE on its sliding
layers alone), HunYuan dense (Llama's block with a per-head QK-norm after RoPE, and RoPE's base stretched by its NTK
α), CLIP's text tower, and the encoders BERT (all-MiniLM-L6-v2), RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA,
DistilBERT, ViT, CLIP's vision tower, DINOv2 (a LayerScale on each sublayer) and ModernBERT (pre-LN with a GeGLU MLP,
bidirectional local windows on its sliding layers, one RoPE θ per layer type, no norm before its first attention),
and the mixtures of experts Mixtral (Mistral's block), Qwen3-MoE, OLMoE (QK-norm over all heads), Qwen2-MoE (with a
sigmoid-gated shared expert) and Granite-MoE (Granite's block), bounded locally only (docs/math.md T7).
The hybrids Bamba, Jamba, LFM2 and Granite 4 are read on their attention blocks alone (``BlockLayout.hybrid``).

A :class:`BlockLayout` says where a family keeps each part of a block and what it does differently: fused
projections (Phi-3's ``qkv_proj`` = [q; k; v] rows, ``gate_up_proj`` = [gate; up] rows), Gemma's RMSNorm scale
(1 + w), a plain MLP (OPT's fc1/fc2), the query scaling folded into q_proj (OPT), GPT-J's parallel residual and
interleaved rotary, norms after each sublayer (Gemma 2/3 beside their pre-norms, where ``post_attention_layernorm``
is the norm of the attention *output*, unlike Llama; OLMo 2 without pre-norms), QK-norm (before RoPE, or after it in
HunYuan), the softcap, where a sliding window is read (a window on both sides of the query in a bidirectional
family, ModernBERT), an ``nn.Identity`` in a norm's place read as no norm (ModernBERT's first layer), a mixture of
experts in the MLP's place (:class:`MoELayout`: a router and transformers 5's experts module, read per expert).
Everything else — GQA, every RoPE type
(``hf.rotary_of``, per layer type from ``config.layer_types``), biases, the yarn/longrope attention factor folded
into τ — is common.

A GGUF Llama checkpoint stores q/k rows permuted for llama.cpp's interleaved rotary; transformers undoes that
permutation while loading, so ``q_proj``/``k_proj`` are already in the rotate-half layout RotaryConfig uses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from attnsens.errors import UnsupportedModelError
from attnsens.models.adapter import NORMED_OUTPUT_FIELDS, ModelSpec, MoEModules
from attnsens.models.hf import (
    HFAdapter,
    HFModule,
    HookPoint,
    activation_of,
    check_norm_eps,
    copied,
    is_vision,
    layer_norm,
    rotary_of,
    rotary_temperature,
    spec_rotary,
    split_bias,
    split_heads,
    vision_positions,
    xielu_parameters,
)
from attnsens.models.hf_tap import exposes_scores
from attnsens.models.offload import LayerSequence, is_offloaded
from attnsens.weights import (
    Activation,
    AttentionWeights,
    LayerWeights,
    MLPWeights,
    MoEWeights,
    NormKind,
    NormWeights,
    Placement,
    RotaryConfig,
)


@dataclass(frozen=True, kw_only=True)
class MoELayout:
    """Where a family keeps a mixture of experts in its blocks (transformers 5: a router module returning
    (logits, gate weights, indices), and an experts module holding ``gate_up_proj`` [expert, 2 d_ff, d_model] =
    [gate; up] rows per expert and ``down_proj`` [expert, d_model, d_ff])."""

    router: str = "mlp.gate"
    experts: str = "mlp.experts"
    renormalized_if: str | None = None  # router attribute under which the top-k weights are renormalized (Qwen's,
    # OLMoE's ``norm_topk_prob``): softmax over the selected logits; without it, the softmax over all experts.
    # None: ``renormalized`` says which
    renormalized: bool = True  # without renormalized_if: always renormalized (Mixtral, Granite-MoE) or never (Jamba)
    shared: str | None = None  # an always-applied expert with Llama's MLP names (Qwen2-MoE's shared_expert)
    shared_gate: str | None = None  # the linear map [1, d_model] of the shared expert's sigmoid gate


@dataclass(frozen=True, kw_only=True)
class BlockLayout:
    """Where one family keeps the parts of a block (attribute names) and its departures from Llama."""

    blocks: str = "layers"  # attribute of the base model (dotted) holding the blocks
    attention: str = "self_attn"  # the attention sublayer (q, k, v, o, qkv and scaling are read relative to it)
    tapped: str | None = None  # the module inside it that calls the attention function (BERT), default itself
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    qkv: str | None = None  # fused [q; k; v] projection replacing q, k, v
    qkv_order: Literal["blocks", "heads", "groups", "shards"] = "blocks"  # rows of the fused qkv: [q; k; v] blocks,
    # [head, (q, k, v), d_head] (BLOOM, Falcon without multi-query), [kv_head, (q × group, k, v), d_head] (Falcon's
    # new decoder architecture) or [shard, (q, v, k), d_model/shards] (CodeGen, its module's mp_num shards)
    qkv_in_blocks_if: str | None = None  # config flag under which the fused qkv is in [q; k; v] blocks; without it
    # the rows are per head (GPT-BigCode: blocks under multi_query, one head of keys and values)
    attention_output: str | None = None  # module (in the block) whose output is the attention sublayer's output,
    # when the attention module itself returns the residual sum (BLOOM); default the attention module
    mlp: str = "mlp"  # the module whose output is the MLP's output
    up: str = "mlp.up_proj"
    gate: str | None = "mlp.gate_proj"  # None: plain MLP down(act(up x))
    down: str = "mlp.down_proj"
    gate_up: str | None = None  # fused [gate; up] projection replacing gate and up
    attn_norm: str | None = "input_layernorm"  # None (with mlp_norm None): no pre-norms, placement "none"
    mlp_norm: str | None = "post_attention_layernorm"
    attn_out_norm: str | None = None  # norm of the attention output before the residual sum (Gemma 2/3, OLMo 2)
    mlp_out_norm: str | None = None  # norm of the MLP output before the residual sum
    norm: NormKind = "rmsnorm"
    norm_eps: float | None = None  # ε of norm modules that keep none (OLMo's parameter-free LayerNorm: 10⁻⁵),
    # checked on each module as it is read (hf.check_norm_eps)
    gamma_offset: float = 0.0  # Gemma's RMSNorm multiplies by (1 + weight)
    activation: str = "hidden_act"  # config attribute naming the MLP activation
    activation_module: str = "mlp.act_fn"  # the activation's module, read for one with parameters (xIELU)
    fixed_activation: Activation | None = None  # the activation of families whose config names none (BLOOM)
    rotary: Literal["rope_parameters", "gptj", "none"] = "rope_parameters"  # gptj: base 10⁴, pairs, rotary_dim
    parallel_residual: bool = False  # X + Attn(N1(X)) + MLP(N2(X)) (GPT-J: N1 = N2 = ln_1)
    post_norm: bool = False  # post-LN blocks always (DistilBERT); OPT reads do_layer_norm_before instead
    causal: bool = True  # False: bidirectional encoder; Gemma's use_bidirectional_attention also turns it off
    causal_if: str | None = None  # config flag that makes an encoder layout causal (BERT's is_decoder)
    query_scaled_in_projection: bool = False  # OPT: q = scaling·q_proj(x), the attention function gets scaling 1
    window: Literal["none", "config", "module"] = "none"  # where a sliding window is read
    qk_norm: bool = False  # the attention's q_norm/k_norm: per head (Qwen3, Gemma 3) or over all heads (OLMo 2)
    qk_norm_names: tuple[str, str] = ("q_norm", "k_norm")  # the attention's QK-norm modules under qk_norm
    qk_norm_after_rotary: bool = False  # the per-head QK-norm follows RoPE (HunYuan) instead of preceding it
    # the config attribute that, when true, gives the attention a LayerNorm per head over its queries and keys
    # (``q_layernorm``/``k_layernorm``, one γ, β shared by the heads, before RoPE: Persimmon, Phi), read as an
    # RMSNorm of the centred projection plus β (``_layernorm_qk``)
    qk_layernorm_if: str | None = None
    softcap: str | None = None  # config attribute of the attention logit softcap (Gemma 2), None when absent
    alibi: Literal["none", "bloom", "mpt"] = "none"  # ALiBi, with the slopes formula of the family
    scaling: str = "scaling"  # attention-module attribute holding the score scale 1/τ (default 1/√d_head)
    positions: str = "max_position_embeddings"  # config attribute of the context length
    rotary_interleaved: bool = False  # RoPE on adjacent pairs (Cohere) instead of halves
    rotary_alpha: bool = False  # a "dynamic" RoPE with an ``alpha`` is HunYuan's fixed NTK stretch of the base
    rotary_if: str | None = None  # attention-module attribute saying whether its layer applies RoPE (SmolLM3's NoPE
    # layers), default every layer of a family with RoPE
    conv1d: bool = False  # GPT-2's Conv1D modules store weights as [in, out]
    parallel_if: str | None = None  # config flag that makes the block parallel (StableLM, GPT-NeoX)
    parallel_shares_norm: bool = True  # under parallel_if: the MLP reads the attention norm (StableLM), or its own
    residual_multiplier: str | None = None  # config attribute r of blocks X + r·Attn(N1 X), then + r·MLP(N2 ·)
    # (Granite): folded into both output projections, so each sublayer's output is what it adds to the stream
    layer_scale: tuple[str, str] | None = None  # per-channel scales (block parameters) of the attention and MLP
    # outputs (DINOv2's LayerScale): folded into both output projections, as the residual multiplier is
    swiglu_if: str | None = None  # config flag under which the MLP is SwiGLU with Llama's names inside ``mlp``
    # (DINOv2's use_swiglu_ffn): silu(gate_proj x) ⊙ up_proj x, then down_proj
    sliding_if: str | None = None  # attention-module attribute saying its layer slides (EXAONE 4 keeps
    # sliding_window on every layer): a layer without it has no window and, in a model with a window, no RoPE
    unsupported: tuple[tuple[str, str], ...] = ()  # (config attribute, why) refused for bounds when it is set
    rope_if: tuple[str, str] | None = None  # (config attribute, value) under which the family applies RoPE, with
    # none otherwise (Granite 4's position_embedding_type "rope")
    moe: MoELayout | None = None  # where a block's MLP is a mixture of experts (a block whose ``moe.experts``
    # module exists; Qwen-MoE's dense layers read as the dense MLP)
    experts: str | None = None  # block attribute of a mixture of experts beside the MLP (Granite 4's
    # block_sparse_moe): a block where it is set is refused for bounds
    beside_attention: str | None = None  # a branch beside the attention attnsens does not model (Falcon-H1's
    # Mamba-2 mixer, reading N1's output and adding to the same sum): each block's attention and MLP are bounded on
    # their own, the block is not (``LayerWeights.beside_attention``)
    hybrid: str | None = None  # what a hybrid's other blocks hold instead of attention (Bamba's Mamba-2 mixers):
    # only the blocks that hold the attention module are read, audited and bounded; the others are named as not
    # covered (``LayoutAdapter.not_bounded``)


_LAYERNORM_QK = (
    "a LayerNorm of each head's queries and keys whose γ differs across heads, which attnsens does not bound "
    "(it bounds a LayerNorm QK-norm that the heads share)"
)
_BERT = BlockLayout(
    blocks="encoder.layer",
    attention="attention",
    tapped="attention.self",
    q="self.query",
    k="self.key",
    v="self.value",
    o="output.dense",
    scaling="self.scaling",
    attention_output="attention.output.dense",
    mlp="output.dense",
    up="intermediate.dense",
    gate=None,
    down="output.dense",
    attn_norm="attention.output.LayerNorm",
    mlp_norm="output.LayerNorm",
    norm="layernorm",
    rotary="none",
    post_norm=True,
    causal=False,
    causal_if="is_decoder",
)
"""BERT and the encoders with its block layout (RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA; all-MiniLM-L6-v2):
A = LN1(X + Attn(X)), Y = LN2(A + MLP(A)); the sums entering the norms are their inputs."""
_SANDWICH: dict[str, Any] = {
    "mlp_norm": "pre_feedforward_layernorm",
    "attn_out_norm": "post_attention_layernorm",
    "mlp_out_norm": "post_feedforward_layernorm",
}
"""Gemma 2/3: X + N_ao(Attn(N1 X)), then + N_mo(MLP(N2 ·)); ``post_attention_layernorm`` normalizes the attention
output there, and the MLP's pre-norm is ``pre_feedforward_layernorm``."""
_GPT2 = BlockLayout(
    blocks="h",
    attention="attn",
    qkv="c_attn",
    o="c_proj",
    up="mlp.c_fc",
    gate=None,
    down="mlp.c_proj",
    attn_norm="ln_1",
    mlp_norm="ln_2",
    norm="layernorm",
    activation="activation_function",
    rotary="none",
    conv1d=True,
)
"""GPT-2 (and GPT-BigCode on nn.Linear): a fused [q; k; v] projection, learned positions, a plain MLP."""
_GLM = BlockLayout(gate_up="mlp.gate_up_proj", rotary_interleaved=True)
"""GLM: Llama's names with a fused [gate; up] projection and a partial RoPE on adjacent pairs."""
_COHERE = BlockLayout(
    mlp_norm="input_layernorm",
    norm="layernorm",
    parallel_residual=True,
    rotary_interleaved=True,
    unsupported=(("use_qk_norm", _LAYERNORM_QK),),
)
"""Cohere: a parallel block on one LayerNorm, RoPE on adjacent pairs."""
_OLMO2 = BlockLayout(
    attn_norm=None,
    mlp_norm=None,
    attn_out_norm="post_attention_layernorm",
    mlp_out_norm="post_feedforward_layernorm",
    qk_norm=True,
)
"""OLMo 2: norms after each sublayer only, a QK-norm over all heads."""
_OPT = BlockLayout(
    blocks="decoder.layers",
    o="out_proj",
    mlp="fc2",
    up="fc1",
    gate=None,
    down="fc2",
    attn_norm="self_attn_layer_norm",
    mlp_norm="final_layer_norm",
    norm="layernorm",
    activation="activation_function",
    rotary="none",
    query_scaled_in_projection=True,
)
"""OPT: pre- or post-LN (``do_layer_norm_before``), the query scaling folded into q_proj."""
_GPTJ = BlockLayout(
    blocks="h",
    attention="attn",
    o="out_proj",
    up="mlp.fc_in",
    gate=None,
    down="mlp.fc_out",
    attn_norm="ln_1",
    mlp_norm="ln_1",
    norm="layernorm",
    activation="activation_function",
    rotary="gptj",
    parallel_residual=True,
)
"""GPT-J: one LayerNorm feeding attention and MLP in parallel, RoPE on adjacent pairs of ``rotary_dim``."""
_CLIP = BlockLayout(
    blocks="encoder.layers",
    o="out_proj",
    up="mlp.fc1",
    gate=None,
    down="mlp.fc2",
    attn_norm="layer_norm1",
    mlp_norm="layer_norm2",
    norm="layernorm",
    rotary="none",
)
"""CLIP's text tower (and, bidirectional, its vision tower): pre-LN blocks with learned positions, causal attention."""
_HYBRID = BlockLayout(
    mlp="feed_forward",
    up="feed_forward.up_proj",
    gate="feed_forward.gate_proj",
    down="feed_forward.down_proj",
    mlp_norm="pre_ff_layernorm",
)
"""Bamba's and Jamba's attention blocks: Llama's block with its MLP named ``feed_forward`` after a
``pre_ff_layernorm``; their other blocks run a Mamba mixer where this one runs attention."""
LAYOUTS: dict[str, BlockLayout] = {
    "llama": BlockLayout(),
    "gpt2": _GPT2,
    "gpt_bigcode": dataclasses.replace(  # GPT-2's block on nn.Linear, multi-query attention (StarCoder, SantaCoder)
        _GPT2,
        conv1d=False,
        qkv_in_blocks_if="multi_query",
        unsupported=(("add_cross_attention", "cross-attention blocks, which attnsens does not bound"),),
    ),
    "gpt_neox": BlockLayout(
        attention="attention",
        qkv="query_key_value",
        qkv_order="heads",
        o="dense",
        up="mlp.dense_h_to_4h",
        gate=None,
        down="mlp.dense_4h_to_h",
        norm="layernorm",
        parallel_if="use_parallel_residual",
        parallel_shares_norm=False,
    ),
    "mistral": BlockLayout(window="config"),
    "ministral": BlockLayout(window="module"),  # Llama with a window on the layers its layer_types make sliding
    "smollm3": BlockLayout(window="module", rotary_if="use_rope"),  # Llama with NoPE layers (no RoPE)
    "helium": BlockLayout(rotary_interleaved=True),  # Llama with RoPE on adjacent pairs
    "ernie4_5": BlockLayout(rotary_interleaved=True),
    "glm": _GLM,
    "glm4": dataclasses.replace(  # GLM's block with a norm after each sublayer beside the pre-norms
        _GLM, attn_out_norm="post_self_attn_layernorm", mlp_out_norm="post_mlp_layernorm"
    ),
    "seed_oss": BlockLayout(),  # Llama with q/k/v biases (and optional o and MLP biases)
    "olmo": BlockLayout(  # Llama's names with parameter-free LayerNorms
        norm="layernorm",
        norm_eps=1e-5,
        unsupported=(("clip_qkv", "a clamp of the queries, keys and values, which attnsens does not bound"),),
    ),
    # Llama's block with each sublayer's output scaled by residual_multiplier; its attention_multiplier is the
    # module's scaling and its embedding_multiplier comes before the blocks, both read as every layout's.
    "granite": BlockLayout(residual_multiplier="residual_multiplier"),
    "arcee": BlockLayout(gate=None),  # Llama with a plain MLP (relu²)
    "apertus": BlockLayout(  # Llama's attention with per-head QK-norm, a plain MLP (xIELU, trained per layer)
        gate=None, attn_norm="attention_layernorm", mlp_norm="feedforward_layernorm", qk_norm=True
    ),
    "nemotron": BlockLayout(  # Llama's names, LayerNorms that multiply by (1 + w), a plain MLP (relu²), partial RoPE
        gate=None, norm="layernorm", gamma_offset=1.0
    ),
    "persimmon": BlockLayout(  # GPT-NeoX's fused per-head qkv under Llama's block names, a plain MLP (relu²)
        qkv="query_key_value",
        qkv_order="heads",
        o="dense",
        up="mlp.dense_h_to_4h",
        gate=None,
        down="mlp.dense_4h_to_h",
        norm="layernorm",
        qk_layernorm_if="qk_layernorm",
    ),
    "internlm3": BlockLayout(),  # Llama's modules under InternLM3's config
    "qwen2": BlockLayout(window="module"),
    "qwen3": BlockLayout(window="module", qk_norm=True),
    # Mixtures of experts: the dense block of their family with a router and experts in the MLP's place.
    "mixtral": BlockLayout(window="config", moe=MoELayout()),  # Mistral's block
    "qwen3_moe": BlockLayout(window="module", qk_norm=True, moe=MoELayout(renormalized_if="norm_topk_prob")),
    "qwen2_moe": BlockLayout(
        window="module",
        moe=MoELayout(
            renormalized_if="norm_topk_prob", shared="mlp.shared_expert", shared_gate="mlp.shared_expert_gate"
        ),
    ),
    "olmoe": BlockLayout(  # QK-norm over all heads (OLMo 2's) in a pre-LN block
        window="config",
        qk_norm=True,
        moe=MoELayout(renormalized_if="norm_topk_prob"),
        unsupported=(("clip_qkv", "a clamp of the queries, keys and values, which attnsens does not bound"),),
    ),
    "granitemoe": BlockLayout(  # Granite's block (residual multiplier); no dense MLP: up and down name the experts
        mlp="block_sparse_moe",
        up="block_sparse_moe.experts",
        gate=None,
        down="block_sparse_moe.experts",
        residual_multiplier="residual_multiplier",
        moe=MoELayout(router="block_sparse_moe.router", experts="block_sparse_moe.experts"),
    ),
    "gemma": BlockLayout(gamma_offset=1.0),
    "gemma2": BlockLayout(
        gamma_offset=1.0,
        activation="hidden_activation",
        window="module",
        softcap="attn_logit_softcapping",
        **_SANDWICH,
    ),
    "gemma3_text": BlockLayout(
        gamma_offset=1.0,
        activation="hidden_activation",
        window="module",
        qk_norm=True,
        # Gemma 3's attention never hands its config's attn_logit_softcapping to the attention function: the
        # model runs uncapped whatever the config says (a version that applied it would fail the gate).
        **_SANDWICH,
    ),
    "vaultgemma": BlockLayout(  # Gemma 2's attention (softcap, windows) with pre-norms only
        gamma_offset=1.0,
        activation="hidden_activation",
        window="module",
        softcap="attn_logit_softcapping",
        mlp_norm="pre_feedforward_layernorm",
    ),
    "phi3": BlockLayout(qkv="qkv_proj", gate_up="mlp.gate_up_proj", window="config"),
    "phi": BlockLayout(
        o="dense",
        up="mlp.fc1",
        gate=None,
        down="mlp.fc2",
        mlp_norm="input_layernorm",
        norm="layernorm",
        parallel_residual=True,
        qk_layernorm_if="qk_layernorm",
    ),
    "stablelm": BlockLayout(
        norm="layernorm", parallel_if="use_parallel_residual", unsupported=(("qk_layernorm", _LAYERNORM_QK),)
    ),
    "starcoder2": BlockLayout(up="mlp.c_fc", gate=None, down="mlp.c_proj", norm="layernorm", window="config"),
    "cohere": _COHERE,
    "cohere2": dataclasses.replace(  # Cohere's block with windows; RoPE on the sliding layers alone
        _COHERE, window="module", rotary_if="sliding_window", unsupported=()
    ),
    "bloom": BlockLayout(
        blocks="h",
        attention="self_attention",
        qkv="query_key_value",
        qkv_order="heads",
        o="dense",
        attention_output="self_attention.dense",
        mlp="mlp.dense_4h_to_h",
        up="mlp.dense_h_to_4h",
        gate=None,
        down="mlp.dense_4h_to_h",
        norm="layernorm",
        fixed_activation="gelu_tanh",
        rotary="none",
        alibi="bloom",
        unsupported=(
            (
                "apply_residual_connection_post_layernorm",
                "each sublayer's residual is its normed input instead of the block input, a block attnsens does not "
                "bound",
            ),
        ),
    ),
    "mpt": BlockLayout(
        blocks="blocks",
        attention="attn",
        qkv="Wqkv",
        o="out_proj",
        mlp="ffn.down_proj",
        up="ffn.up_proj",
        gate=None,
        down="ffn.down_proj",
        attn_norm="norm_1",
        mlp_norm="norm_2",
        norm="layernorm",
        fixed_activation="gelu",
        rotary="none",
        alibi="mpt",
        scaling="softmax_scale",
        positions="max_seq_len",
    ),
    "hunyuan_v1_dense": BlockLayout(  # Llama's block with a per-head QK-norm after RoPE, HunYuan's NTK alpha RoPE
        qk_norm=True,
        qk_norm_names=("query_layernorm", "key_layernorm"),
        qk_norm_after_rotary=True,
        rotary_alpha=True,
    ),
    "olmo2": _OLMO2,
    "olmo3": dataclasses.replace(_OLMO2, window="module"),  # with a window on the layers layer_types make sliding
    # OLMo 2's block with per-head QK-norm; windows and RoPE on the layers whose attention is_sliding alone
    "exaone4": dataclasses.replace(_OLMO2, window="module", sliding_if="is_sliding"),
    "opt": _OPT,
    "biogpt": dataclasses.replace(  # OPT's module names, pre-LN, learned positions, the scaling in the call
        _OPT, blocks="layers", activation="hidden_act", query_scaled_in_projection=False
    ),
    "codegen": dataclasses.replace(_GPTJ, qkv="qkv_proj", qkv_order="shards"),  # a fused qkv in model-parallel shards
    "gptj": _GPTJ,
    **{family: _BERT for family in ("bert", "roberta", "xlm-roberta", "camembert", "electra")},
    "vit": BlockLayout(
        attention="attention",
        up="mlp.fc1",
        gate=None,
        down="mlp.fc2",
        attn_norm="layernorm_before",
        mlp_norm="layernorm_after",
        norm="layernorm",
        rotary="none",
        causal=False,
    ),
    "dinov2": BlockLayout(  # ViT's block with a LayerScale on each sublayer's output, folded into its projection
        blocks="encoder.layer",
        attention="attention",
        attention_output="layer_scale1",
        mlp="layer_scale2",
        up="mlp.fc1",
        gate=None,
        down="mlp.fc2",
        attn_norm="norm1",
        mlp_norm="norm2",
        norm="layernorm",
        rotary="none",
        causal=False,
        layer_scale=("layer_scale1.lambda1", "layer_scale2.lambda1"),
        swiglu_if="use_swiglu_ffn",
    ),
    # Hybrids: the blocks holding attention are Llama's block under other names; their other blocks are not read.
    "bamba": dataclasses.replace(_HYBRID, hybrid="Mamba-2 mixers"),
    # Jamba: attention without positions; a mixture of experts replaces the MLP in some blocks (the softmax over
    # all experts, its top-k weights not renormalized)
    "jamba": dataclasses.replace(
        _HYBRID,
        rotary="none",
        moe=MoELayout(router="feed_forward.router", experts="feed_forward.experts", renormalized=False),
        hybrid="Mamba mixers",
    ),
    "lfm2": BlockLayout(  # per-head QK-norm, a SwiGLU MLP of w1 (gate), w3 (up) and w2 (down)
        o="out_proj",
        mlp="feed_forward",
        up="feed_forward.w3",
        gate="feed_forward.w1",
        down="feed_forward.w2",
        attn_norm="operator_norm",
        mlp_norm="ffn_norm",
        qk_norm=True,
        qk_norm_names=("q_layernorm", "k_layernorm"),
        fixed_activation="silu",
        hybrid="gated short convolutions",
    ),
    "granitemoehybrid": BlockLayout(  # Granite 4: Granite's block, a fused [gate; up] MLP beside optional experts
        mlp="shared_mlp",
        gate_up="shared_mlp.input_linear",
        up="shared_mlp.input_linear",
        gate=None,
        down="shared_mlp.output_linear",
        residual_multiplier="residual_multiplier",
        rope_if=("position_embedding_type", "rope"),
        experts="block_sparse_moe",
        hybrid="Mamba-2 mixers",
    ),
    "clip_text_model": _CLIP,
    "clip_vision_model": dataclasses.replace(_CLIP, causal=False),
    "modernbert": BlockLayout(  # a pre-LN encoder: fused [q; k; v] Wqkv, a GeGLU MLP, one RoPE θ per layer type
        attention="attn",
        qkv="Wqkv",
        o="Wo",
        mlp="mlp",
        gate_up="mlp.Wi",  # halves [input; gate], act(input) ⊙ gate: its input half is attnsens' (activated) gate
        down="mlp.Wo",
        attn_norm="attn_norm",  # an nn.Identity in layer 0 (its embeddings end with a LayerNorm): read as no norm
        mlp_norm="mlp_norm",
        norm="layernorm",
        activation="hidden_activation",
        window="module",  # bidirectional: local_attention // 2 + 1, |i − j| < window (weights.AttentionWeights)
        causal=False,
    ),
    "distilbert": BlockLayout(
        blocks="transformer.layer",
        attention="attention",
        q="q_lin",
        k="k_lin",
        v="v_lin",
        o="out_lin",
        mlp="ffn",
        up="ffn.lin1",
        gate=None,
        down="ffn.lin2",
        attn_norm="sa_layer_norm",
        mlp_norm="output_layer_norm",
        norm="layernorm",
        activation="activation",
        rotary="none",
        post_norm=True,
        causal=False,
    ),
}
"""transformers ``model_type`` → layout: the one table of bounded families. ``loading.FAMILIES`` derives from it
(each family read by :class:`LayoutAdapter`, or by the adapter ``loading.OWN_ADAPTERS`` names), and so do
docs/models.md (tools/models_reference.py) and the tests' list of bounded families
(tests/unit/models/tiny_models.py)."""


NO_POSITION_LIMIT = 1 << 20
"""The context of families without learned or rotary positions (ALiBi): no limit of their own, only memory's."""
PAD_OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "camembert"})
"""Families whose learned position ids start after ``pad_token_id`` (RoBERTa's ``create_position_ids_from_input_ids``):
their context is ``max_position_embeddings − pad_token_id − 1`` tokens (512 of 514)."""


def _get(root: Any, path: str) -> Any:
    for name in path.split("."):
        root = getattr(root, name, None)
    return root


class LayoutAdapter(HFAdapter):
    """Any family of :data:`LAYOUTS`; ``family`` is the transformers ``model_type``."""

    def __init__(self, module: HFModule, *, name: str, tokenizer: Any = None) -> None:
        self.layout = self.layout_for(module.base_model.config)
        super().__init__(module, name=name, tokenizer=tokenizer)
        if is_vision(self.base.config):
            self.spec = dataclasses.replace(self.spec, max_positions=self.vision_tokens())
        if self.layout.hybrid is not None:  # a hybrid's layers are its attention blocks
            if not self.blocks():
                raise UnsupportedModelError(
                    f"{self.family}: none of its {len(self._all_blocks())} blocks holds attention (they hold "
                    f"{self.layout.hybrid}), so attnsens has no attention layer to audit or bound"
                )
            self.spec = dataclasses.replace(self.spec, n_layer=len(self.blocks()))

    @classmethod
    def layout_for(cls, config: Any) -> BlockLayout:
        """The family's layout, parallel when its ``parallel_if`` flag is set, its fused qkv per head when its
        ``qkv_in_blocks_if`` flag is not (a family whose blocks vary more with its config overrides this)."""
        layout = layout_of(config.model_type)
        if layout.qkv_in_blocks_if is not None and not getattr(config, layout.qkv_in_blocks_if, False):
            layout = dataclasses.replace(layout, qkv_order="heads")
        if layout.swiglu_if is not None and getattr(config, layout.swiglu_if, False):
            layout = dataclasses.replace(
                layout, up="mlp.up_proj", gate="mlp.gate_proj", down="mlp.down_proj", fixed_activation="silu"
            )
        if layout.rope_if is not None and getattr(config, layout.rope_if[0], None) != layout.rope_if[1]:
            layout = dataclasses.replace(layout, rotary="none")
        if layout.parallel_if is not None and getattr(config, layout.parallel_if, False):
            mlp_norm = layout.attn_norm if layout.parallel_shares_norm else layout.mlp_norm
            return dataclasses.replace(layout, parallel_residual=True, mlp_norm=mlp_norm)
        return layout

    @classmethod
    def kv_heads_of(cls, config: Any) -> int:
        flag = layout_of(config.model_type).qkv_in_blocks_if
        if flag is not None:  # GPT-BigCode's attention reads its flag, not num_key_value_heads
            return 1 if getattr(config, flag, False) else int(config.num_attention_heads)
        return getattr(config, "num_key_value_heads", None) or config.num_attention_heads

    @classmethod
    def spec_of(cls, config: Any) -> ModelSpec:
        layout = cls.layout_for(config)
        d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        placement: Placement = (
            "none" if layout.attn_norm is None
            else "post" if layout.post_norm or not getattr(config, "do_layer_norm_before", True)
            else "pre"
        )  # fmt: skip
        positions = getattr(config, layout.positions, None) or NO_POSITION_LIMIT
        vocab = getattr(config, "vocab_size", None) or 1
        if config.model_type in PAD_OFFSET_POSITIONS and isinstance(getattr(config, "pad_token_id", None), int):
            positions -= config.pad_token_id + 1  # position ids run from pad_token_id + 1
        if is_vision(config):
            positions = vision_positions(config)  # LayoutAdapter reads the length the model runs
        return ModelSpec(
            n_layer=config.num_hidden_layers,
            n_head=config.num_attention_heads,
            n_kv_head=cls.kv_heads_of(config),
            d_model=config.hidden_size,
            d_head=d_head,
            max_positions=positions,
            vocab_size=vocab,
            placement=placement,
            norm=layout.norm,
            causal=(layout.causal or bool(layout.causal_if and getattr(config, layout.causal_if, False)))
            and not getattr(config, "use_bidirectional_attention", False),
            rotary=_rotary(layout, config, d_head, refuse=False),
        )

    def blocks(self) -> list[torch.nn.Module]:
        """The blocks attnsens reads: every block, or a hybrid's blocks that hold attention."""
        every = self._all_blocks()
        return every if self.layout.hybrid is None else [every[i] for i in self.block_indices()]

    def _all_blocks(self) -> list[torch.nn.Module]:
        return list(_get(self.base, self.layout.blocks))

    def block_indices(self) -> list[int]:
        """The model's index of each of :meth:`blocks` (layer i of attnsens is block ``block_indices()[i]``)."""
        every = self._all_blocks()
        if self.layout.hybrid is None:
            return list(range(len(every)))
        return [i for i, block in enumerate(every) if _get(block, self.layout.attention) is not None]

    @property
    def not_bounded(self) -> str | None:
        """For a hybrid, which of the model's blocks no bound covers and why, and for a family with a branch beside
        its attention, what its bounds leave out (one line); None otherwise (``ModelAdapter.not_bounded``)."""
        if self.layout.beside_attention is not None:
            return (
                f"{self.family} runs {self.layout.beside_attention} beside the attention in every block, which "
                "attnsens neither audits nor bounds: the bounds cover each block's attention and MLP on their own, "
                "with no block bound and no product across the stack"
            )
        if self.layout.hybrid is None:
            return None
        indices = self.block_indices()
        others = len(self._all_blocks()) - len(indices)
        mapping = ", ".join(f"{layer} = block {block}" for layer, block in enumerate(indices))
        layers = "its attention block" if len(indices) == 1 else f"its {len(indices)} attention blocks"
        blocks = "block holds" if others == 1 else f"{others} blocks hold"
        return (
            f"{self.family} is a hybrid: attnsens' layers are {layers} ({mapping}); its other {blocks} "
            f"{self.layout.hybrid}, which attnsens neither audits nor bounds, so no bound here covers the whole stack"
        )

    def attention_modules(self) -> list[torch.nn.Module]:
        return [_get(block, self.layout.tapped or self.layout.attention) for block in self.blocks()]

    def tokenwise_modules(self) -> list[torch.nn.Module]:
        """Each block's MLP where the layout's projections all lie inside it; none where the MLP is not one module
        (BERT's intermediate and output, OPT's fc1 and fc2 in the block, BLOOM's MLP that adds the residual) or
        where a TransformerLens bridge runs the blocks through its own components."""
        lay = self.layout
        parts = [path for path in (lay.up, lay.gate, lay.down, lay.gate_up) if path is not None]
        if not all(path.startswith(lay.mlp + ".") for path in parts) or exposes_scores(self.attention_modules()):
            return []  # a split MLP, or a TransformerLens bridge whose components run the blocks
        modules = [_get(block, lay.mlp) for block in self.blocks()]
        return modules if all(isinstance(module, torch.nn.Module) for module in modules) else []

    def query_sliceable_layers(self) -> list[torch.nn.Module]:
        """The decoder blocks of a causal text model whose attention calls sdpa through the attention interface
        and the Hugging Face tap (not a TransformerLens bridge, nor a family with a tap of its own). Eager
        attention always gets a mask, and other kernels may apply a sliding window the call does not show."""
        modules = self.attention_modules()
        own_tap = type(self).query_key_tap is HFAdapter.query_key_tap
        sdpa = self.base.config._attn_implementation == "sdpa"
        if not self.spec.causal or is_vision(self.base.config) or exposes_scores(modules) or not own_tap or not sdpa:
            return []
        if any(getattr(module, "reorder_and_upcast_attn", False) for module in modules):
            return []  # GPT-2's reordered attention, which skips the interface
        if not all(getattr(module, "is_causal", True) for module in modules):
            return []  # CLIP's text tower: causal through the mask it passes, not through is_causal
        return self.blocks()

    def attention_window(self, layer: int) -> int | None:
        if self.layout.window == "config":
            return getattr(self.base.config, "sliding_window", None)
        if self.layout.window == "module":
            module = self.attention_modules()[layer]
            if self.layout.sliding_if is not None and not getattr(module, self.layout.sliding_if):
                return None
            return getattr(module, "sliding_window", None)
        return None

    def hook_points(self, layer: int) -> list[HookPoint]:
        block, lay = self.blocks()[layer], self.layout
        parts = [path for path in (lay.up, lay.gate, lay.gate_up) if path is not None]
        # The MLP's input where every projection reading it lies in one module (the gate's identification pass
        # replaces it there, so gate and up both read the replacement), else its one input projection (BERT, OPT).
        inside = all(path.startswith(lay.mlp + ".") for path in parts)
        first_mlp = _get(block, lay.mlp if inside and len(parts) > 1 else lay.gate_up or lay.up)
        if lay.attn_norm is None or lay.mlp_norm is None:  # placement "none"
            return [
                (block, "input", "block_input"),
                (_get(block, lay.attention), "input", "attention_input"),
                (first_mlp, "input", "mlp_input"),
            ]
        if self.spec.placement == "pre":
            return [
                (block, "input", "block_input"),
                (_get(block, lay.attn_norm), "output", "attention_input"),
                (_get(block, lay.mlp_norm), "output", "mlp_input"),
            ]
        return [
            (block, "input", "block_input"),
            (_get(block, lay.attention), "input", "attention_input"),
            (_get(block, lay.attn_norm), "input", "attention_residual_sum"),
            (first_mlp, "input", "mlp_input"),
            (_get(block, lay.mlp_norm), "input", "mlp_residual_sum"),
        ]

    def output_modules(self, layer: int) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
        block = self.blocks()[layer]
        attention = _get(block, self.layout.attention_output or self.layout.attention)
        return attention, _get(block, self.layout.mlp), block

    def output_hook_points(self, layer: int) -> list[HookPoint]:
        """The outputs of every layout, plus the norms after the sublayers where the layout has them."""
        block, lay = self.blocks()[layer], self.layout
        normed: list[HookPoint] = [
            (getattr(block, name), "output", field)
            for name, field in zip((lay.attn_out_norm, lay.mlp_out_norm), NORMED_OUTPUT_FIELDS, strict=True)
            if name is not None
        ]
        return [*super().output_hook_points(layer), *normed]

    def residual_multiplier(self) -> float:
        """The factor r of each sublayer's output in the residual sum (1 for every layout but Granite's)."""
        name = self.layout.residual_multiplier
        return 1.0 if name is None else float(getattr(self.base.config, name))

    def layer_output_taps(self, record: Callable[[int, str, Tensor], None]) -> contextlib.AbstractContextManager[None]:
        """The outputs of every layout; with a residual multiplier r, each sublayer's output times r (what it adds
        to the residual stream, the output of the normalized weights with r folded in)."""
        residual = self.residual_multiplier()
        if residual == 1.0:
            return super().layer_output_taps(record)

        def scaled(layer: int, field: str, tensor: Tensor) -> None:
            record(layer, field, tensor * residual if field in ("attention_output", "mlp_output") else tensor)

        return super().layer_output_taps(scaled)

    def read_layers(self) -> Sequence[LayerWeights]:
        for attribute, why in self.layout.unsupported:
            if getattr(self.base.config, attribute, None):
                raise UnsupportedModelError(
                    f"{self.family} sets {attribute}: {why}; attnsens audits its attention rows but refuses to bound it"
                )
        blocks = self.blocks()
        for index, block in zip(self.block_indices(), blocks, strict=True):
            if self._moe_block(block):
                continue
            mlp = _get(block, self.layout.mlp)
            experts = self.layout.experts is not None and _get(block, self.layout.experts) is not None
            if experts or (_get(block, self.layout.gate_up or self.layout.up) is None and mlp is not None):
                kind = "a mixture of experts" if experts or hasattr(mlp, "experts") else f"a {type(mlp).__name__}"
                raise UnsupportedModelError(
                    f"{self.family}: block {index}'s feed-forward is {kind}, not the dense MLP its layout reads; "
                    "attnsens audits its attention rows but refuses to bound it"
                )
        if is_offloaded(self.module):  # read each block's weights when that layer is asked for (models/offload.py)
            return LayerSequence(blocks, lambda index: self._layer(index, blocks[index]))
        return [self._layer(i, block) for i, block in enumerate(blocks)]

    def _layer(self, index: int, block: HFModule) -> LayerWeights:
        s, lay, config = self.spec, self.layout, self.base.config
        attn = _get(block, lay.attention)
        b_q: Tensor | None
        b_k: Tensor | None
        w_q, w_k, w_v, b_q, b_k, b_v = self._projections(attn)
        scaling = float(_get(attn, lay.scaling) or s.d_head**-0.5)
        tau = 1.0 / scaling
        if lay.query_scaled_in_projection:
            w_q, b_q, tau = w_q * scaling, None if b_q is None else b_q * scaling, 1.0
        block_index = self.block_indices()[index]
        layer_type = (getattr(config, "layer_types", None) or [None] * (block_index + 1))[block_index]
        rotary = _rotary(lay, config, s.d_head, refuse=True, layer_type=layer_type)
        if lay.rotary_if is not None and not getattr(attn, lay.rotary_if):
            rotary = None  # a layer without position encoding in a family with RoPE
        if lay.sliding_if is not None and attn.sliding_window is not None and not getattr(attn, lay.sliding_if):
            rotary = None  # EXAONE 4's full layers beside sliding ones: no position encoding
        if rotary is not None:
            rotary_module = getattr(self.base, "rotary_emb", None)
            rotary = _rotating_as_the_model(rotary, rotary_module, s.d_head, layer_type)
            scaled_tau = rotary_temperature(1.0 / tau, rotary, rotary_module, s.d_head, layer_type)
            if lay.qk_norm_after_rotary and scaled_tau != tau:
                raise UnsupportedModelError(
                    f"{self.family}: RoPE {rotary.rope_type!r} scales cos/sin by an attention factor, which its "
                    "QK-norm after RoPE divides out (up to ε) rather than a change of temperature; not supported"
                )
            tau = scaled_tau
        q_norm = self._norm(_get(attn, lay.qk_norm_names[0])) if lay.qk_norm else None
        k_norm = self._norm(_get(attn, lay.qk_norm_names[1])) if lay.qk_norm else None
        if lay.qk_layernorm_if is not None and getattr(config, lay.qk_layernorm_if, False):
            (w_q, b_q, q_norm), (w_k, b_k, k_norm) = (
                _layernorm_qk(w, b, _get(attn, name), heads, s.d_head)
                for w, b, name, heads in ((w_q, b_q, "q_layernorm", s.n_head), (w_k, b_k, "k_layernorm", s.n_kv_head))
            )
        out = _get(attn, lay.o)
        scale = self.output_scales(block)[0]
        attention = AttentionWeights(
            w_q=split_heads(w_q, s.n_head),
            w_k=split_heads(w_k, s.n_kv_head),
            w_v=split_heads(w_v, s.n_kv_head),
            w_o=_rows_scaled(self._matrix(out), scale),
            b_q=split_bias(b_q, s.n_head),
            b_k=split_bias(b_k, s.n_kv_head),
            b_v=split_bias(b_v, s.n_kv_head),
            b_o=None if out.bias is None else _rows_scaled(out.bias.detach(), scale),
            tau=tau,
            causal=s.causal,
            rotary=rotary,
            sliding_window=self.attention_window(index),
            q_norm=q_norm,
            k_norm=k_norm,
            qk_norm_after_rotary=lay.qk_norm_after_rotary and rotary is not None,
            softcap=None if lay.softcap is None else getattr(config, lay.softcap, None),
            alibi_slopes=None if lay.alibi == "none" else ALIBI_SLOPES[lay.alibi](s.n_head),
        )
        return LayerWeights(
            index=index,
            placement=s.placement,
            attention=attention,
            mlp=self._moe(block) if self._moe_block(block) else self._mlp(block),
            attn_norm=self.read_norm(block, lay.attn_norm),
            mlp_norm=self.read_norm(block, lay.mlp_norm),
            parallel_residual=lay.parallel_residual,
            attn_out_norm=self.read_norm(block, lay.attn_out_norm),
            mlp_out_norm=self.read_norm(block, lay.mlp_out_norm),
            beside_attention=lay.beside_attention,
        )

    def _projections(self, attn: HFModule) -> tuple[Tensor, ...]:
        """w_q, w_k, w_v [out, d_model] and their biases (None when absent), split from a fused qkv if need be."""
        s = self.spec
        if self.layout.qkv is None:
            linears = [_get(attn, name) for name in (self.layout.q, self.layout.k, self.layout.v)]
            weights = [self._matrix(linear).clone() for linear in linears]
            return (*weights, *(copied(linear.bias) for linear in linears))
        fused = _get(attn, self.layout.qkv)
        matrix = self._matrix(fused)
        expected = (s.n_head + 2 * s.n_kv_head) * s.d_head
        if matrix.shape[0] != expected:
            raise UnsupportedModelError(
                f"{self.family}: its fused qkv projection has {matrix.shape[0]} rows where the config's "
                f"{s.n_head} query and {s.n_kv_head} key heads of size {s.d_head} give {expected}; attnsens does not "
                "bound a model whose config does not describe its attention"
            )
        if self.layout.qkv_order == "shards":  # CodeGen: rows [shard, (q, v, k), d_model/shards], heads in order

            def shards(t: Tensor) -> list[Tensor]:
                rows = t.detach().reshape(attn.mp_num, 3, -1, *t.shape[1:])
                return [rows[:, part].reshape(-1, *t.shape[1:]).clone() for part in (0, 2, 1)]

            biases = [None] * 3 if fused.bias is None else shards(fused.bias)
            return (*shards(matrix), *biases)
        if self.layout.qkv_order != "blocks":  # rows [head, (q, k, v), d_head] or [kv_head, (q × group, k, v), d_head]
            group = 1 if self.layout.qkv_order == "heads" else s.n_head // s.n_kv_head
            parts = (slice(0, group), slice(group, group + 1), slice(group + 1, group + 2))

            def split(t: Tensor) -> list[Tensor]:
                rows = t.detach().reshape(s.n_kv_head, group + 2, s.d_head, *t.shape[1:])
                return [rows[:, part].reshape(-1, *t.shape[1:]).clone() for part in parts]

            weights = split(matrix)
            biases = [None] * 3 if fused.bias is None else split(fused.bias)
            return (*weights, *biases)
        sizes = [s.n_head * s.d_head, s.n_kv_head * s.d_head, s.n_kv_head * s.d_head]
        weights = [w.clone() for w in matrix.split(sizes, dim=0)]
        biases = [None] * 3 if fused.bias is None else [b.clone() for b in fused.bias.detach().split(sizes)]
        return (*weights, *biases)

    def _mlp(self, block: HFModule) -> MLPWeights:
        lay = self.layout
        activation = lay.fixed_activation or activation_of(getattr(self.base.config, lay.activation))
        down, scale = _get(block, lay.down), self.output_scales(block)[1]
        w_gate: Tensor | None
        if lay.gate_up is not None:
            fused = _get(block, lay.gate_up)
            w_gate, w_in = (w.clone() for w in self._matrix(fused).chunk(2, dim=0))
            b_gate, b_in = (None, None) if fused.bias is None else (b.clone() for b in fused.bias.detach().chunk(2))
        else:
            up = _get(block, lay.up)
            w_in, b_in = self._matrix(up).clone(), copied(up.bias)
            gate = None if lay.gate is None else _get(block, lay.gate)
            w_gate = None if gate is None else self._matrix(gate).clone()
            b_gate = None if gate is None else copied(gate.bias)
        return MLPWeights(
            kind="mlp" if w_gate is None else "gated",
            activation=activation,
            xielu=xielu_parameters(_get(block, lay.activation_module)) if activation == "xielu" else None,
            w_in=w_in,
            b_in=b_in,
            w_gate=w_gate,
            b_gate=b_gate,
            w_out=_rows_scaled(self._matrix(down), scale),
            b_out=None if down.bias is None else _rows_scaled(down.bias.detach(), scale),
        )

    def _moe_block(self, block: HFModule) -> bool:
        """Whether ``block``'s MLP is the layout's mixture of experts."""
        return self.layout.moe is not None and _get(block, self.layout.moe.experts) is not None

    def _moe(self, block: HFModule) -> MoEWeights:
        """The block's mixture of experts: the router's rows, each expert's [gate; up] and down matrices (the MLP's
        output scale folded into each expert's output, as into a dense MLP's), top-k and the gate weights' mode."""
        lay, scale = self.layout.moe, self.output_scales(block)[1]
        assert lay is not None  # _moe_block
        router, experts = _get(block, lay.router), _get(block, lay.experts)
        if any(getattr(experts, name, None) is not None for name in ("gate_up_proj_bias", "down_proj_bias")):
            raise UnsupportedModelError(f"{self.family}: experts with biases are not read; refused for bounds")
        activation = activation_of(getattr(self.base.config, self.layout.activation))
        gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
        d_ff = gate_up.shape[1] // 2
        weights = tuple(
            MLPWeights(
                kind="gated",
                activation=activation,
                w_gate=gate_up[e, :d_ff].clone(),
                w_in=gate_up[e, d_ff:].clone(),
                w_out=_rows_scaled(down[e].clone(), scale),
            )
            for e in range(gate_up.shape[0])
        )
        renormalized = lay.renormalized if lay.renormalized_if is None else bool(getattr(router, lay.renormalized_if))
        shared = None if lay.shared is None else _get(block, lay.shared)
        shared_gate = None if lay.shared_gate is None else _get(block, lay.shared_gate)
        return MoEWeights(
            router=router.weight.detach().clone(),
            experts=weights,
            top_k=int(router.top_k),
            gate_mode="topk_softmax" if renormalized else "softmax",
            shared=None if shared is None else MLPWeights(
                kind="gated",
                activation=activation,
                w_gate=self._matrix(shared.gate_proj).clone(),
                w_in=self._matrix(shared.up_proj).clone(),
                w_out=_rows_scaled(self._matrix(shared.down_proj).clone(), scale),
            ),
            shared_gate=None if shared_gate is None else self._matrix(shared_gate)[0].clone(),
        )  # fmt: skip

    def moe_modules(self, layer: int) -> MoEModules | None:
        block, lay = self.blocks()[layer], self.layout.moe
        if lay is None or not self._moe_block(block):
            return None
        return MoEModules(
            router=_get(block, lay.router),
            experts=_get(block, lay.experts),
            shared=None if lay.shared is None else _get(block, lay.shared),
            shared_gate=None if lay.shared_gate is None else _get(block, lay.shared_gate),
            output_scale=self.residual_multiplier(),
        )

    def output_scales(self, block: HFModule) -> tuple[float | Tensor, float | Tensor]:
        """The factors of the attention and MLP outputs in the residual sum, folded into their output projections:
        the residual multiplier r (Granite; 1 elsewhere), or the layout's per-channel layer scales ``[d_model]``
        (DINOv2) times r where it has them."""
        residual = self.residual_multiplier()
        if self.layout.layer_scale is None:
            return residual, residual
        first, second = (_get(block, name).detach() * residual for name in self.layout.layer_scale)
        return first, second

    def read_norm(self, block: HFModule, name: str | None) -> NormWeights | None:
        """The NormWeights of the norm ``name`` of ``block``, with the layout's kind and γ offset; None for None and
        for an ``nn.Identity`` in the norm's place (ModernBERT's first layer: no norm there, and the gate checks
        that the sublayer reads the residual stream itself)."""
        if name is None:
            return None
        module = _get(block, name)
        return None if isinstance(module, torch.nn.Identity) else self._norm(module)

    def _matrix(self, linear: HFModule) -> Tensor:
        """A linear map's weight as [out, in] (GPT-2's Conv1D stores [in, out])."""
        weight = linear.weight.detach()
        return weight.T if self.layout.conv1d else weight

    def _norm(self, module: HFModule) -> NormWeights:
        if self.layout.norm == "layernorm":
            norm = layer_norm(module, eps=self.layout.norm_eps)
            if self.layout.norm_eps is not None:
                check_norm_eps(module, norm)
            if self.layout.gamma_offset:  # Nemotron's LayerNorm1P multiplies by (1 + weight)
                norm = dataclasses.replace(norm, gamma=norm.gamma + self.layout.gamma_offset)
            return norm
        return rms_norm(module, gamma_offset=self.layout.gamma_offset)


def _layernorm_qk(
    weight: Tensor, bias: Tensor | None, module: HFModule, n_head: int, d_head: int
) -> tuple[Tensor, Tensor | None, NormWeights]:
    """A LayerNorm QK-norm over each head's d_head coordinates as the weights' RMSNorm plus β: LayerNorm(a) =
    γ ⊙ P a / (mean((P a)²) + ε)^{1/2} + β = RMSNorm(P a) + β with P = I − 11ᵀ/d_head, and P a = (P W) x + P b,
    so the centring is folded into each head's rows of the projection ``[n_head·d_head, d_model]`` and its bias
    (in float64, rounded once to the weights' dtype). Returns (P W, P b, the RMSNorm with β)."""
    norm = layer_norm(module)
    if norm.gamma.shape != (d_head,):
        raise UnsupportedModelError(
            f"{type(module).__name__} normalizes {tuple(norm.gamma.shape)} coordinates, not one head's {d_head}: "
            "attnsens bounds a LayerNorm QK-norm shared by the heads only"
        )

    def centred(t: Tensor) -> Tensor:
        heads = t.to(torch.float64).reshape(n_head, d_head, -1)
        return (heads - heads.mean(dim=1, keepdim=True)).reshape(t.shape).to(t.dtype)

    folded_bias = None if bias is None else centred(bias)
    return centred(weight), folded_bias, dataclasses.replace(norm, kind="rmsnorm")


def _rows_scaled(weight: Tensor, scale: float | Tensor) -> Tensor:
    """``weight`` ``[out, ...]`` with row j times scale_j (a tensor ``[out]``) or every row times one float."""
    if isinstance(scale, float):
        return weight * scale
    return weight * scale.to(weight.dtype).reshape(-1, *[1] * (weight.ndim - 1))


def _rotary(
    layout: BlockLayout, config: Any, d_head: int, *, refuse: bool, layer_type: str | None = None
) -> RotaryConfig | None:
    """The layout's rotary: from ``rope_parameters`` (refusing unknown types when ``refuse``), GPT-J's fixed
    interleaved RoPE on the first ``rotary_dim`` dimensions, or None."""
    if layout.rotary == "gptj":
        return RotaryConfig(base=10000.0, rotary_dim=config.rotary_dim or d_head, interleaved=True)
    if layout.rotary == "rope_parameters":
        if layout.rotary_alpha and _rope_alpha(config) is not None:
            return _ntk_alpha_rotary(config, d_head)
        rotary = rotary_of(config, d_head, layer_type) if refuse else spec_rotary(config, d_head)
        if rotary is not None and layout.rotary_interleaved:
            rotary = dataclasses.replace(rotary, interleaved=True)
        return rotary
    return None


def _rope_alpha(config: Any) -> float | None:
    """HunYuan's NTK α: ``rope_parameters["alpha"]`` of a "dynamic" RoPE, or None (no α, or another type)."""
    rope = config.rope_parameters or {}
    alpha = rope.get("alpha")
    return float(alpha) if rope.get("rope_type") == "dynamic" and alpha else None


def _ntk_alpha_rotary(config: Any, d_head: int) -> RotaryConfig:
    """HunYuan's "dynamic" RoPE with an α (its rotary module's ``ntk_alpha``): default RoPE over the whole head
    with the base stretched once to base·α^(d/(d−2)), d = d_head, independent of the sequence length.

    Raises:
        UnsupportedModelError: d_head ≤ 2, where the stretch's exponent has no value.
    """
    alpha = _rope_alpha(config)
    if alpha is None or d_head <= 2:
        raise UnsupportedModelError(f"{config.model_type}: no NTK alpha RoPE over a head of {d_head} dimensions")
    base = float(config.rope_parameters["rope_theta"]) * alpha ** (d_head / (d_head - 2))
    return RotaryConfig(base=base, rotary_dim=d_head)


def _rotating_as_the_model(
    rotary: RotaryConfig, rotary_module: HFModule | None, d_head: int, layer_type: str | None
) -> RotaryConfig:
    """``rotary`` rotating every dimension of the head where the model's own frequency table (``inv_freq``, or
    ``{layer_type}_inv_freq``) has a frequency for every pair of them. A ``partial_rotary_factor`` in
    ``rope_parameters`` is honoured by the RoPE functions of some families only (Phi, StableLM, GPT-NeoX and the
    scaled types); Llama's default RoPE, among others, ignores it and rotates every dimension, so the config alone
    would name the wrong ones. Other counts keep the config's reading, and the gate checks either."""
    table = None if layer_type is None else getattr(rotary_module, f"{layer_type}_inv_freq", None)
    table = getattr(rotary_module, "inv_freq", None) if table is None else table
    if not isinstance(table, Tensor) or 2 * table.numel() != d_head or rotary.rotary_dim == d_head:
        return rotary
    return dataclasses.replace(rotary, rotary_dim=d_head)


def alibi_slopes(n_head: int) -> Tensor:
    """ALiBi's slopes (Press et al.): m_h = b^(h+1) with b = 2^(−8/H') for the H' = 2^⌊log2 H⌋ first heads, then
    the odd powers of 2^(−4/H') for the rest: BLOOM's formula, evaluated in float32 as the model does (torch.pow
    of a float32 base), so the slopes are the model's to the bit."""
    closest = 2 ** math.floor(math.log2(n_head))
    base = torch.tensor(2.0 ** (-8.0 / closest), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, closest + 1, dtype=torch.int32))
    if closest != n_head:
        extra_base = torch.tensor(2.0 ** (-4.0 / closest), dtype=torch.float32)
        odd = torch.arange(1, 1 + 2 * min(closest, n_head - closest), 2, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra_base, odd)])
    return slopes


def mpt_alibi_slopes(n_head: int) -> Tensor:
    """MPT's ALiBi slopes: 2^(−8(h+1)/H') for H' = 2^⌈log2 H⌉, interleaved (odd then even) when H' > H."""
    padded = 2 ** math.ceil(math.log2(n_head))
    slopes = [2.0 ** (-(h + 1) * 8.0 / padded) for h in range(padded)]
    if padded != n_head:
        slopes = (slopes[1::2] + slopes[::2])[:n_head]
    return torch.tensor(slopes, dtype=torch.float32)


ALIBI_SLOPES = {"bloom": alibi_slopes, "mpt": mpt_alibi_slopes}


def layout_of(model_type: str) -> BlockLayout:
    if model_type not in LAYOUTS:
        raise UnsupportedModelError(f"no block layout for {model_type!r}; known: {', '.join(LAYOUTS)}")
    return LAYOUTS[model_type]


def rms_norm(module: HFModule, *, gamma_offset: float = 0.0) -> NormWeights:
    """NormWeights of an HF RMSNorm: γ = offset + ``weight``, eps from ``variance_epsilon`` or ``eps``."""
    eps = getattr(module, "variance_epsilon", None)
    eps = module.eps if eps is None else eps
    gamma = module.weight.detach().clone()
    if gamma_offset:
        gamma = gamma + gamma_offset
    return NormWeights(kind="rmsnorm", gamma=gamma, beta=None, eps=float(eps))
