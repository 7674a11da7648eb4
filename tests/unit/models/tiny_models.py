"""Tiny random-init transformers models of every supported family, built in code (distinct prime-ish sizes)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    BertConfig,
    BertModel,
    BioGptConfig,
    BioGptForCausalLM,
    BloomConfig,
    BloomForCausalLM,
    CamembertConfig,
    CamembertModel,
    Cohere2Config,
    Cohere2ForCausalLM,
    DistilBertConfig,
    DistilBertModel,
    ElectraConfig,
    ElectraModel,
    Ernie4_5Config,
    Ernie4_5ForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    GemmaConfig,
    GemmaForCausalLM,
    Glm4Config,
    Glm4ForCausalLM,
    GlmConfig,
    GlmForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTBigCodeConfig,
    GPTBigCodeForCausalLM,
    GPTJConfig,
    GPTJForCausalLM,
    GPTNeoXConfig,
    GPTNeoXModel,
    GraniteConfig,
    GraniteForCausalLM,
    HeliumConfig,
    HeliumForCausalLM,
    InternLM3Config,
    LlamaConfig,
    LlamaForCausalLM,
    MinistralConfig,
    MinistralForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MptConfig,
    MptForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Olmo3Config,
    Olmo3ForCausalLM,
    OlmoConfig,
    OlmoForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    RobertaConfig,
    RobertaModel,
    SeedOssConfig,
    SeedOssForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
    VaultGemmaConfig,
    VaultGemmaForCausalLM,
    XLMRobertaConfig,
    XLMRobertaModel,
)

VOCAB = 53
FAMILIES = ("gpt2", "gpt_neox", "llama", "bert")
DECODER_FAMILIES = (
    "mistral", "ministral", "seed_oss", "internlm3", "smollm3", "helium", "ernie4_5", "glm", "glm4", "vaultgemma",
    "granite", "olmo", "qwen2", "qwen3",
    "gemma", "gemma2", "gemma3_text", "olmo2", "olmo3", "phi3", "opt", "opt_post", "gptj", "gpt_bigcode", "bloom",
    "mpt", "phi", "stablelm", "starcoder2", "cohere", "cohere2", "biogpt",
)  # fmt: skip
"""Families bounded through the declarative decoder table (models/layouts.py); sliding windows of 5 keys; gemma2
with sandwich norms and an attention logit softcap of 3 (eager attention), gemma3_text with per-head QK-norm and
one RoPE per layer type, olmo2 with norms after each sublayer and a QK-norm over all heads, bloom with ALiBi and
its fused per-head qkv, mpt with its own ALiBi slopes (both audited through their own score computation), smollm3
with a NoPE layer, helium and ernie4_5 with RoPE on adjacent pairs, vaultgemma with a softcap of 3 and pre-norms
only, glm and glm4 with a partial RoPE on adjacent pairs (glm4 with a norm after each sublayer),
cohere2 with RoPE on its sliding layer alone, biogpt with learned positions, granite with a residual multiplier of
0.22, an attention multiplier of 0.1 in place of 1/√d_head and its embeddings times 12, olmo with parameter-free
LayerNorms."""
OUT_NORM_FAMILIES = ("gemma2", "gemma3_text", "olmo2", "olmo3", "glm4")
"""Families whose blocks apply a norm to each sublayer's output; their norm gains are spread too."""
SPREAD_GAIN_FAMILIES = (*OUT_NORM_FAMILIES, "modernbert")
"""Families whose norm gains are spread: those above, and ModernBERT, whose layer 0 reads its embeddings' norm
with no norm of its own (with unit gains a norm invented there would change little)."""
ENCODER_FAMILIES = ("roberta", "electra", "distilbert")
"""Encoders read by the BERT adapter (RoBERTa, ELECTRA) and by the layout table (DistilBERT)."""


_GQA = {"num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "hidden_size": 6 * 6,
        "intermediate_size": 37, "max_position_embeddings": 41}  # fmt: skip
CONFIGS = {
    "gpt2": (GPT2Config, GPT2LMHeadModel, {"n_layer": 2, "n_head": 3, "n_embd": 21, "n_positions": 41,
                                           "bos_token_id": 0, "eos_token_id": 0}),
    "gpt_neox": (GPTNeoXConfig, GPTNeoXModel, {"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 30,
                                               "intermediate_size": 37, "max_position_embeddings": 41,
                                               "rotary_pct": 0.4, "bos_token_id": 0, "eos_token_id": 0}),
    "llama": (LlamaConfig, LlamaForCausalLM, {"num_hidden_layers": 2, "num_attention_heads": 6,
                                              "num_key_value_heads": 2, "hidden_size": 6 * 6,
                                              "intermediate_size": 37, "max_position_embeddings": 41,
                                              "rope_theta": 500.0}),
    "bert": (BertConfig, BertModel, {"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 21,
                                     "intermediate_size": 37, "max_position_embeddings": 41}),
    "roberta": (RobertaConfig, RobertaModel, {"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 21,
                                              "intermediate_size": 37, "max_position_embeddings": 43,
                                              "pad_token_id": 1}),
    "xlm-roberta": (XLMRobertaConfig, XLMRobertaModel, {"num_hidden_layers": 2, "num_attention_heads": 3,
                                                        "hidden_size": 21, "intermediate_size": 37,
                                                        "max_position_embeddings": 43, "pad_token_id": 1}),
    "camembert": (CamembertConfig, CamembertModel, {"num_hidden_layers": 2, "num_attention_heads": 3,
                                                    "hidden_size": 21, "intermediate_size": 37,
                                                    "max_position_embeddings": 43, "pad_token_id": 1}),
    "electra": (ElectraConfig, ElectraModel, {"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 21,
                                              "embedding_size": 13, "intermediate_size": 37,
                                              "max_position_embeddings": 41}),
    "gpt_bigcode": (GPTBigCodeConfig, GPTBigCodeForCausalLM, {"n_layer": 2, "n_head": 3, "n_embd": 21, "n_inner": 37,
                                                              "n_positions": 41, "bos_token_id": 0,
                                                              "eos_token_id": 0}),
    "gptj": (GPTJConfig, GPTJForCausalLM, {"n_layer": 2, "n_head": 3, "n_embd": 24, "n_inner": 37, "rotary_dim": 4,
                                           "n_positions": 41, "bos_token_id": 0, "eos_token_id": 0}),
    "distilbert": (DistilBertConfig, DistilBertModel, {"n_layers": 2, "n_heads": 3, "dim": 21, "hidden_dim": 37,
                                                       "max_position_embeddings": 41}),
    "mistral": (MistralConfig, MistralForCausalLM, {**_GQA, "sliding_window": 5}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {**_GQA, "use_sliding_window": True, "sliding_window": 5,
                                              "max_window_layers": 1}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {**_GQA, "head_dim": 6}),
    "gemma": (GemmaConfig, GemmaForCausalLM, {**_GQA, "head_dim": 8}),
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, {**_GQA, "head_dim": 8, "sliding_window": 5,
                                                 "attn_logit_softcapping": 3.0}),
    "phi3": (Phi3Config, Phi3ForCausalLM, {**_GQA, "sliding_window": 5, "pad_token_id": 0, "bos_token_id": 0,
                                           "eos_token_id": 0}),
    "olmo2": (Olmo2Config, Olmo2ForCausalLM, {**_GQA, "pad_token_id": 0}),
    "olmo3": (Olmo3Config, Olmo3ForCausalLM, {**_GQA, "pad_token_id": 0, "sliding_window": 5,
                                              "layer_types": ["sliding_attention", "full_attention"]}),
    "ministral": (MinistralConfig, MinistralForCausalLM, {**_GQA, "head_dim": 6, "sliding_window": 5,
                                                          "layer_types": ["sliding_attention", "full_attention"]}),
    "seed_oss": (SeedOssConfig, SeedOssForCausalLM, {**_GQA, "head_dim": 6, "attention_bias": True,
                                                     "attention_out_bias": True, "mlp_bias": True}),
    "smollm3": (SmolLM3Config, SmolLM3ForCausalLM, {**_GQA, "pad_token_id": 0,
                                                    "no_rope_layers": [1, 0], "use_sliding_window": True,
                                                    "sliding_window": 5,
                                                    "layer_types": ["sliding_attention", "full_attention"]}),
    "helium": (HeliumConfig, HeliumForCausalLM, {**_GQA, "head_dim": 6, "pad_token_id": 0, "bos_token_id": 0,
                                                 "eos_token_id": 0}),
    "ernie4_5": (Ernie4_5Config, Ernie4_5ForCausalLM, {**_GQA, "head_dim": 6, "use_bias": True, "pad_token_id": 0,
                                                       "bos_token_id": 0, "eos_token_id": 0}),
    "glm": (GlmConfig, GlmForCausalLM, {**_GQA, "hidden_size": 48, "head_dim": 8, "attention_bias": True,
                                        "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}),
    "glm4": (Glm4Config, Glm4ForCausalLM, {**_GQA, "hidden_size": 48, "head_dim": 8, "attention_bias": True,
                                           "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}),
    "cohere2": (Cohere2Config, Cohere2ForCausalLM, {**_GQA, "sliding_window": 5, "logit_scale": 0.5,
                                                    "layer_types": ["sliding_attention", "full_attention"]}),
    "biogpt": (BioGptConfig, BioGptForCausalLM, {"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 21,
                                                 "intermediate_size": 37, "max_position_embeddings": 41,
                                                 "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}),
    "vaultgemma": (VaultGemmaConfig, VaultGemmaForCausalLM, {**_GQA, "head_dim": 6, "sliding_window": 5,
                                                             "layer_types": ["sliding_attention", "full_attention"],
                                                             "attn_logit_softcapping": 3.0}),
    "granite": (GraniteConfig, GraniteForCausalLM, {**_GQA, "residual_multiplier": 0.22, "attention_multiplier": 0.1,
                                                    "embedding_multiplier": 12.0, "logits_scaling": 8.0,
                                                    "attention_bias": True, "pad_token_id": 0}),
    "olmo": (OlmoConfig, OlmoForCausalLM, {**_GQA, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}),
    "internlm3": (InternLM3Config, LlamaForCausalLM, {**_GQA, "head_dim": 6, "qkv_bias": True, "bias": True}),
    "bloom": (BloomConfig, BloomForCausalLM, {"n_layer": 2, "n_head": 3, "hidden_size": 21}),
    "mpt": (MptConfig, MptForCausalLM, {"n_layers": 2, "n_heads": 3, "d_model": 21, "max_seq_len": 41}),
    "opt": (OPTConfig, OPTForCausalLM, {"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 21,
                                        "ffn_dim": 37, "max_position_embeddings": 41, "word_embed_proj_dim": 21,
                                        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 0}),
    "opt_post": (OPTConfig, OPTForCausalLM, {"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 21,
                                             "ffn_dim": 37, "max_position_embeddings": 41,
                                             "word_embed_proj_dim": 21, "do_layer_norm_before": False,
                                             "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 0}),
}  # fmt: skip
"""family → (config class, model class, config keywords): 2 layers, d_head 5, 6 or 7, GQA 6:2 for Llama."""


def tiny_model(family: str, *, attn_implementation: str = "sdpa", seed: int = 0, **config: object) -> torch.nn.Module:
    """A random-init model of ``family`` in eval mode with realistic weight scales; ``config`` overrides keywords."""
    if family not in CONFIGS:
        raise ValueError(family)
    torch.manual_seed(seed)
    config_class, model_class, keywords = CONFIGS[family]
    settings = stock_config(config_class, attn_implementation=attn_implementation, **{**keywords, **config})
    extra = {"add_pooling_layer": False} if family in ("bert", "roberta", "xlm-roberta", "camembert") else {}
    model = model_class(settings, **extra)
    spread_weights(model)
    spread_xielu_parameters(model)
    if family in SPREAD_GAIN_FAMILIES:
        spread_norm_gains(model)
    return model.eval()


def stock_config(
    config_class: type,
    *,
    attn_implementation: str = "sdpa",
    checkpoint_fields: dict[str, object] | None = None,
    **fields: object,
) -> Any:
    """``config_class`` from its own defaults with ``fields`` changed, and ``vocab_size`` = VOCAB where the class
    has one. Every field must be one the stock config has: transformers keeps an unknown keyword as an attribute,
    so a helper adding, say, ``vocab_size`` to every config would hide a crash on the real checkpoints of a family
    whose config has none (ViT). ``checkpoint_fields`` are the exceptions a family's published config.json files
    carry beyond the class's own fields (t5-small's ``decoder_start_token_id``), named as such at each use."""
    defaults = config_class()
    sizes = {"vocab_size": VOCAB} if hasattr(defaults, "vocab_size") else {}
    config = config_class(**{**sizes, **fields, **(checkpoint_fields or {})}, attn_implementation=attn_implementation)
    # A field the class converts (a legacy rotary_pct into rope_parameters) is consumed; an unknown one stays.
    stray = sorted(name for name in fields if not hasattr(defaults, name) and name in vars(config))
    if stray:
        raise ValueError(f"{config_class.__name__} has no field {', '.join(stray)}; a real checkpoint has none either")
    return config


def spread_weights(model: torch.nn.Module) -> None:
    # Default init (std 0.02) gives almost uniform attention; larger weights give rows with structure
    # (dominant atoms, sinks) so that comparisons exercise more than the uniform case.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 2 and "embed" not in name and "wte" not in name and "wpe" not in name:
                parameter.normal_(0.0, 0.35)
            elif name.endswith(("q_layernorm.bias", "k_layernorm.bias")):
                parameter.normal_(0.0, 1.0)  # a LayerNorm QK-norm's β shifts every query or key: not negligible
            elif name.endswith(("q_layernorm.weight", "k_layernorm.weight")):
                parameter.uniform_(0.5, 2.5)
            elif parameter.ndim == 1 and "bias" in name:
                parameter.normal_(0.0, 0.1)
            elif name.endswith(("q_norm.weight", "k_norm.weight", "query_layernorm.weight", "key_layernorm.weight")):
                parameter.uniform_(0.5, 2.5)  # trained QK-norm scales are far from 1; ones would hide a dropped norm


def spread_xielu_parameters(model: torch.nn.Module) -> None:
    """Draw every xIELU activation's raw α_p, α_n and its β afresh, layer by layer (Apertus): at the defaults every
    layer's activation is the same, and α_p, α_n, β read from the wrong layer, swapped or unset would pass."""
    ranges = {"act_fn.alpha_p": (-0.5, 1.5), "act_fn.alpha_n": (-1.5, 0.5), "act_fn.beta": (0.3, 0.7)}
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            for suffix, (low, high) in ranges.items():
                if name.endswith(suffix):
                    tensor.uniform_(low, high)


def spread_norm_gains(model: torch.nn.Module, std: float = 0.2) -> None:
    """Add N(0, std²) to every norm weight: at the default init all gains are equal (1, or Gemma's 1 + 0), so a
    dropped or swapped norm would change nothing a test can see."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 1 and "norm" in name:
                parameter.add_(torch.randn_like(parameter) * std)


def eager_attentions(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask=None) -> tuple[torch.Tensor, ...]:
    """The model's own attention probabilities per layer [batch, head, query, key] via eager output_attentions."""
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True)
    finally:
        model.set_attn_implementation(implementation)
    return out.attentions


INTERFACE_FAMILIES = ("mixtral", "modernbert", "clip_text")
"""Families whose rows the interface tests audit (models/interface.py); all three are also bounded, through the
layout table."""
AUDIT_ONLY_FAMILIES = ("gpt_oss", "deepseek_v3")
"""Families audited through the attention-function interface alone: gpt_oss has no block layout, deepseek_v3 is
refused for bounds with its reason (``interface.NO_BOUNDS``: multi-head latent attention)."""
VISION_FAMILIES = {"vit": 10, "clip_vision": 10, "dinov2": 10, "deit": 11, "siglip_vision": 9}
"""Vision encoders on pixel_values [batch, 3, 12, 12] → their sequence length: 9 patches, plus [CLS] (ViT, CLIP),
[CLS] and a distillation token (DeiT), or nothing (SigLIP); ViT and CLIP's are bounded through the layout table."""
BYPASS_FAMILIES = ("gpt_neo",)
"""Families whose eager attention computes its own softmax: refused by name."""


def _interface_configs() -> dict[str, tuple[type, type, dict[str, object]]]:
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPVisionConfig,
        CLIPVisionModel,
        CohereConfig,
        CohereForCausalLM,
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        DeiTConfig,
        DeiTModel,
        FalconConfig,
        FalconModel,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GPTNeoConfig,
        GPTNeoModel,
        GptOssConfig,
        GptOssForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
        ModernBertConfig,
        ModernBertModel,
        PhiConfig,
        PhiForCausalLM,
        SiglipVisionConfig,
        SiglipVisionModel,
        StableLmConfig,
        StableLmForCausalLM,
        Starcoder2Config,
        Starcoder2ForCausalLM,
        ViTConfig,
        ViTModel,
    )

    small = {
        "num_hidden_layers": 2,
        "num_attention_heads": 3,
        "hidden_size": 21,
        "intermediate_size": 37,
        "max_position_embeddings": 41,
    }
    vision = {name: size for name, size in small.items() if name != "max_position_embeddings"}
    return {
        "mixtral": (MixtralConfig, MixtralForCausalLM, {**_GQA, "intermediate_size": 40, "sliding_window": 5,
                                                        "num_local_experts": 3,
                                                        "num_experts_per_tok": 2}),
        "phi": (PhiConfig, PhiForCausalLM, {**small, "partial_rotary_factor": 0.4}),
        "stablelm": (StableLmConfig, StableLmForCausalLM, {**_GQA, "hidden_size": 48,
                                                           "partial_rotary_factor": 0.5, "use_qkv_bias": True}),
        "starcoder2": (Starcoder2Config, Starcoder2ForCausalLM, {**_GQA, "sliding_window": 5}),
        "cohere": (CohereConfig, CohereForCausalLM, {**_GQA, "logit_scale": 0.5}),
        "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM, {**_GQA, "head_dim": 8, "sliding_window": 5,
                                                             "layer_types": ["sliding_attention", "full_attention"]}),
        "modernbert": (ModernBertConfig, ModernBertModel, {**small, "hidden_size": 24, "local_attention": 6,
                                                           "layer_types": ["full_attention", "sliding_attention"],
                                                           "pad_token_id": 0,
                                                           "bos_token_id": 0, "eos_token_id": 0, "cls_token_id": 0,
                                                           "sep_token_id": 0}),
        "clip_text": (CLIPTextConfig, CLIPTextModel, {**small, "bos_token_id": 0, "eos_token_id": 1,
                                                      "pad_token_id": 1}),
        "vit": (ViTConfig, ViTModel, {**vision, "image_size": 12, "patch_size": 4}),
        "clip_vision": (CLIPVisionConfig, CLIPVisionModel, {**vision, "image_size": 12, "patch_size": 4}),
        "deit": (DeiTConfig, DeiTModel, {**vision, "image_size": 12, "patch_size": 4}),
        "siglip_vision": (SiglipVisionConfig, SiglipVisionModel, {**vision, "image_size": 12, "patch_size": 4}),
        "gpt_oss": (GptOssConfig, GptOssForCausalLM, {**_GQA, "intermediate_size": 40, "head_dim": 6,
                                                      "num_local_experts": 3, "num_experts_per_tok": 2,
                                                      "sliding_window": 5,
                                                      "layer_types": ["sliding_attention", "full_attention"]}),
        "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM, {**_GQA, "hidden_size": 48, "num_key_value_heads": 6,
                                                                  "intermediate_size": 40, "q_lora_rank": None,
                                                                  "kv_lora_rank": 16, "qk_rope_head_dim": 8,
                                                                  "qk_nope_head_dim": 8, "v_head_dim": 8,
                                                                  "n_routed_experts": 4, "num_experts_per_tok": 2,
                                                                  "moe_intermediate_size": 40, "n_group": 1,
                                                                  "topk_group": 1, "first_k_dense_replace": 1}),
        "gpt_neo": (GPTNeoConfig, GPTNeoModel, {"num_layers": 2, "num_heads": 3, "hidden_size": 21,
                                                "attention_types": [[["global", "local"], 1]], "window_size": 5,
                                                "max_position_embeddings": 41}),
        "falcon": (FalconConfig, FalconModel, {"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 24,
                                               "alibi": True}),
    }  # fmt: skip


MOE_FAMILIES = ("mixtral", "qwen3_moe", "olmoe", "qwen2_moe", "granitemoe")
"""Mixtures of experts bounded through the layout table (mixtral's config is among the interface families'): 4
experts, 2 per token (mixtral and granitemoe 3), each of width 40 (their grouped matrix products need strides of
multiples of 16 bytes); qwen3_moe, olmoe and qwen2_moe keep the softmax over all experts (norm_topk_prob False),
mixtral and granitemoe renormalize over the selected ones, and qwen2_moe has its sigmoid-gated shared expert."""
_EXPERTS = {"num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 40, "moe_intermediate_size": 40}
RELU2_FAMILIES = ("arcee", "nemotron", "persimmon")
"""Decoders with a plain relu² MLP; persimmon with its default LayerNorm QK-norm (γ over [0.5, 2.5], β ~ N(0, 1))."""
MORE_LAYOUT_FAMILIES = (
    *RELU2_FAMILIES, "apertus", "exaone4", "hunyuan_v1_dense", "codegen", "clip_text", "dinov2", "clip_vision",
    "modernbert",
)  # fmt: skip
"""Families added to the layout table from their configs' defaults and sizes: exaone4 with norms after the
sublayers, per-head QK-norm and RoPE on its three sliding layers alone (its full fourth layer has none); apertus
with per-head QK-norm, llama3 RoPE and a plain xIELU MLP (its parameters drawn per layer by
``spread_xielu_parameters``); hunyuan_v1_dense with its per-head QK-norm after RoPE (gains spread over [0.5, 2.5],
so that they differ within every rotating pair and the norm before RoPE is another function) and GQA 6:2; clip_text
causal and clip_vision bidirectional (quick_gelu); dinov2 with a LayerScale on each sublayer; codegen with its fused
qkv in 4 shards of 2 heads and RoPE on adjacent pairs of 4 of its 8 dimensions; modernbert (in the interface
configs) with a full layer 0 without a norm before its attention, then a sliding layer whose keys lie within 3 of
the query (local_attention 6: 7 keys of the 13 or 17 the tests run)."""


def _layout_configs() -> dict[str, tuple[type, type, dict[str, object]]]:
    """Families bounded through the layout table, from their configs' defaults and sizes alone."""
    from transformers import (
        ApertusConfig,
        ApertusForCausalLM,
        ArceeConfig,
        ArceeForCausalLM,
        CodeGenConfig,
        CodeGenForCausalLM,
        Dinov2Config,
        Dinov2Model,
        Exaone4Config,
        Exaone4ForCausalLM,
        GraniteMoeConfig,
        GraniteMoeForCausalLM,
        HunYuanDenseV1Config,
        HunYuanDenseV1ForCausalLM,
        NemotronConfig,
        NemotronForCausalLM,
        OlmoeConfig,
        OlmoeForCausalLM,
        PersimmonConfig,
        PersimmonForCausalLM,
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    return {
        "arcee": (ArceeConfig, ArceeForCausalLM, _GQA),
        "apertus": (ApertusConfig, ApertusForCausalLM, _GQA),
        "nemotron": (NemotronConfig, NemotronForCausalLM, {**_GQA, "hidden_size": 48}),  # half of d_head 8 rotates
        "persimmon": (PersimmonConfig, PersimmonForCausalLM, {"num_hidden_layers": 2, "num_attention_heads": 6,
                                                             "hidden_size": 48, "intermediate_size": 37,
                                                             "max_position_embeddings": 41}),
        "exaone4": (Exaone4Config, Exaone4ForCausalLM, {**_GQA, "num_hidden_layers": 4}),  # 3 sliding, 1 full
        "hunyuan_v1_dense": (HunYuanDenseV1Config, HunYuanDenseV1ForCausalLM, {**_GQA, "head_dim": 6}),
        "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, {**_GQA, **_EXPERTS}),
        "olmoe": (OlmoeConfig, OlmoeForCausalLM, {**_GQA, "num_experts": 4, "num_experts_per_tok": 2,
                                                  "intermediate_size": 40}),
        "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM, {**_GQA, **_EXPERTS,
                                                           "shared_expert_intermediate_size": 40}),
        "granitemoe": (GraniteMoeConfig, GraniteMoeForCausalLM, {**_GQA, "intermediate_size": 40,
                                                                 "num_local_experts": 3, "num_experts_per_tok": 2,
                                                                 "residual_multiplier": 0.5}),
        "codegen": (CodeGenConfig, CodeGenForCausalLM, {"n_layer": 2, "n_head": 8, "n_embd": 64, "n_inner": 37,
                                                        "rotary_dim": 4, "n_positions": 41}),
        "dinov2": (Dinov2Config, Dinov2Model, {"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 21,
                                               "image_size": 12, "patch_size": 4}),
    }  # fmt: skip


_MAMBA2 = {"mamba_n_heads": 4, "mamba_d_head": 24, "mamba_n_groups": 1, "mamba_d_state": 8, "mamba_chunk_size": 8}
"""The Mamba-2 mixers of the hybrids' tests: 4 heads of 24 channels (2 × d_model = 96), one group, 8 states."""
_HYBRID = {**_GQA, "num_hidden_layers": 4, "hidden_size": 48, "intermediate_size": 40}
"""The hybrids' tests: 4 blocks of d_model 48 (d_head 8: Bamba's RoPE rotates half of it) and attention blocks among
Mamba or convolution blocks; an MLP width of 40 (MoE experts run through grouped matrix products whose strides must
be multiples of 16 bytes)."""
FALCON_H1_MULTIPLIERS = {"attention_in_multiplier": 0.7, "key_multiplier": 1.3, "attention_out_multiplier": 0.8,
                         "mlp_multipliers": [1.2, 0.9], "ssm_out_multiplier": 0.6}  # fmt: skip
"""Falcon-H1's μP multipliers, all 1 in its config's defaults and not in its checkpoints: set apart from 1 so that
a multiplier read wrong, or not at all, changes the function the gate compares."""
HYBRID_FAMILIES = ("bamba", "jamba", "lfm2", "granitemoehybrid")
"""Hybrids whose attention blocks are bounded (models/layouts.py, ``BlockLayout.hybrid``): blocks 1 and 3 of 4
attend, the others hold Mamba mixers or short convolutions; Jamba's expert MLPs sit in its Mamba blocks (offset
0, period 2), and Granite 4 is its dense variant (no experts, as in granite-4.0-h-micro) with RoPE."""


def _hybrid_configs() -> dict[str, tuple[type, type, dict[str, object]]]:
    from transformers import (
        BambaConfig,
        BambaForCausalLM,
        FalconH1Config,
        FalconH1ForCausalLM,
        GraniteMoeHybridConfig,
        GraniteMoeHybridForCausalLM,
        JambaConfig,
        JambaForCausalLM,
        Lfm2Config,
        Lfm2ForCausalLM,
    )

    mamba_granite = ["mamba", "attention", "mamba", "attention"]
    return {
        "bamba": (BambaConfig, BambaForCausalLM, {**_HYBRID, **_MAMBA2, "attn_layer_indices": [1, 3]}),
        "jamba": (JambaConfig, JambaForCausalLM, {**_HYBRID, "attn_layer_period": 2, "attn_layer_offset": 1,
                                                  "expert_layer_period": 2, "expert_layer_offset": 0,
                                                  "num_experts": 2, "num_experts_per_tok": 1, "mamba_d_state": 8}),
        "lfm2": (Lfm2Config, Lfm2ForCausalLM, {**_HYBRID,
                                               "layer_types": ["conv", "full_attention", "conv", "full_attention"]}),
        "granitemoehybrid": (GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM, {
            **_HYBRID, **_MAMBA2, "layer_types": mamba_granite, "num_local_experts": 0, "shared_intermediate_size": 40,
            "position_embedding_type": "rope"}),
        "falcon_h1": (FalconH1Config, FalconH1ForCausalLM, {
            **_HYBRID, **_MAMBA2, "mamba_d_ssm": 96, **FALCON_H1_MULTIPLIERS}),
    }  # fmt: skip


CONFIGS.update(_interface_configs())
CONFIGS.update(_layout_configs())
CONFIGS.update(_hybrid_configs())


def model_type(family: str) -> str:
    """The transformers ``model_type`` of the tests' ``family`` (``clip_text`` → ``clip_text_model``)."""
    return CONFIGS[family][0].model_type


def _bounded_families() -> tuple[str, ...]:
    from attnsens.models.loading import FAMILIES as REGISTRY

    return tuple(family for family in CONFIGS if model_type(family) in REGISTRY)


BOUNDED_FAMILIES = _bounded_families()
"""Every test family of the one table (``attnsens.models.layouts.LAYOUTS``, through ``loading.FAMILIES``): the
bound tests run over all of them, so a family added to the table is tested as soon as it has a test model, and
tests/unit/models/test_registry.py fails until it has one."""
