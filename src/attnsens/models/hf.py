"""Shared base of the Hugging Face transformers adapters (GPT-2, GPT-NeoX, BERT and the layout table).

A family subclass names its blocks, its attention modules (the ones that call the attention function) and the
submodules whose inputs/outputs are the layer inputs and outputs; it converts parameters in ``read_layers``.
Forward passes, tokenization, the query/key tap (models/hf_tap.py) and the reading of ``rope_parameters``
(:func:`rotary_of`) are common.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Literal, overload

import torch
from einops import rearrange
from torch import Tensor

from attnsens.errors import InputError, ShapeError, UnsupportedModelError
from attnsens.models.adapter import OUTPUT_FIELDS, ModelAdapter, ModelSpec, QueryKeyCallback, StopForward
from attnsens.models.hf_tap import exposes_scores, hf_query_key_tap, scores_tap
from attnsens.weights import ROPE_TYPES, Activation, MLPWeights, NormWeights, RotaryConfig, XIELUParameters

HFModule = Any
"""A transformers model or one of its submodules, read by the attribute names of its family (``block.attn.c_attn``,
``base.layers``). torch's stubs type every such attribute as ``Tensor | Module``, so family code reads them untyped;
each family module documents the structure it reads, and the weights-fidelity gate (models/fidelity.py) checks that
what it read reproduces the model."""

HookPoint = tuple[torch.nn.Module, Literal["input", "output"], str]
"""(submodule, whether its input or its output is the tensor, LayerInputs field name)."""


class HFAdapter(ModelAdapter):
    """An adapter around a transformers ``PreTrainedModel`` (any head; the base model is what runs)."""

    def __init__(self, module: HFModule, *, name: str, tokenizer: Any = None) -> None:
        self.base: HFModule = module.base_model
        self.family = self.base.config.model_type  # one adapter may serve several model types (loading.FAMILIES)
        super().__init__(module, name=name, spec=self.spec_of(self.base.config))
        self.tokenizer = tokenizer

    @classmethod
    def spec_of(cls, config: Any) -> ModelSpec:
        """The ModelSpec of a transformers config of this family."""
        raise NotImplementedError

    def blocks(self) -> list[torch.nn.Module]:
        """The transformer blocks, in order."""
        raise NotImplementedError

    def attention_modules(self) -> list[torch.nn.Module]:
        """Per layer, the module that calls the attention function with (module, query, key, value, ...)."""
        raise NotImplementedError

    def hook_points(self, layer: int) -> list[HookPoint]:
        """Where the LayerInputs fields of ``layer`` can be read."""
        raise NotImplementedError

    def output_modules(self, layer: int) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
        """The modules whose outputs are the attention sublayer's output (after W_O), the MLP's and the block's."""
        raise NotImplementedError

    def output_hook_points(self, layer: int) -> list[HookPoint]:
        """Where the attention, MLP and block outputs of ``layer`` can be read (adapter.OUTPUT_FIELDS)."""
        modules = self.output_modules(layer)
        return [(module, "output", field) for module, field in zip(modules, OUTPUT_FIELDS, strict=True)]

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> None:
        if is_vision(self.base.config):
            self.base(pixel_values=input_ids)
        else:
            self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)

    def blank_image(self) -> Tensor:
        """One black image [1, channel, H, W] in the model's dtype, the input a vision encoder is probed with."""
        config = self.base.config
        dtype = next(self.module.parameters()).dtype
        side = config.image_size
        return torch.zeros(1, config.num_channels, side, side, device=self.device, dtype=dtype)

    def vision_tokens(self) -> int:
        """The sequence length a vision encoder runs, read from its first attention call on a blank image: the
        patches and whatever tokens the family adds ([CLS]; DeiT's distillation token; none for SigLIP)."""
        seen: list[int] = []

        def record(_layer: int, query: Tensor, _key: Tensor, _call: Any) -> None:
            seen.append(int(query.shape[2]))
            raise StopForward

        with torch.no_grad(), self.query_key_tap(record):
            self.forward_until_stopped(self.blank_image())
        if not seen:
            raise UnsupportedModelError(f"{self.family}: no attention layer ran on an image, so attnsens cannot tap it")
        return seen[0]

    def check_input_ids(self, input_ids: Tensor) -> Tensor:
        """Token ids as for every adapter; a vision model's input is ``pixel_values`` [batch, channel, H, W]."""
        if not is_vision(self.base.config):
            return super().check_input_ids(input_ids)
        config = self.base.config
        side = config.image_size
        expected = (config.num_channels, side, side)
        if not isinstance(input_ids, Tensor) or input_ids.ndim != 4 or tuple(input_ids.shape[1:]) != expected:
            shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ShapeError(f"{self.family} takes pixel_values [batch, {', '.join(map(str, expected))}], got {shape}")
        return input_ids.to(self.device, next(self.module.parameters()).dtype)

    def sequence_shape(self, input_ids: Tensor) -> tuple[int, int]:
        if not is_vision(self.base.config):
            return super().sequence_shape(input_ids)
        return int(input_ids.shape[0]), self.spec.max_positions

    def query_key_tap(self, on_query_key: QueryKeyCallback) -> contextlib.AbstractContextManager[None]:
        modules = self.attention_modules()
        if exposes_scores(modules):  # inside a TransformerLens bridge
            return scores_tap(modules, on_query_key)
        implementation = self.base.config._attn_implementation or "eager"
        return hf_query_key_tap(modules, implementation, on_query_key)

    def layer_input_taps(
        self, record: Callable[[int, str, Tensor], Tensor | None]
    ) -> contextlib.AbstractContextManager[None]:
        return self._taps(self.hook_points, record)

    def layer_output_taps(self, record: Callable[[int, str, Tensor], None]) -> contextlib.AbstractContextManager[None]:
        return self._taps(self.output_hook_points, record)

    @contextlib.contextmanager
    def _taps(
        self, points: Callable[[int], list[HookPoint]], record: Callable[[int, str, Tensor], Tensor | None]
    ) -> Iterator[None]:
        # Some families (OPT) run their MLP on [batch·n, d_model]; every field is reported as [batch, n, d_model],
        # and a replacement returned by ``record`` goes back in the module's own shape.
        shapes: dict[int, torch.Size] = {}

        def as_block_shape(layer: int, field: str, tensor: Tensor) -> Tensor | None:
            shape = tensor.shape
            if tensor.ndim == 2:
                tensor = tensor.reshape(*shapes[layer][:-1], tensor.shape[-1])
            replacement = record(layer, field, tensor)
            return None if replacement is None else replacement.reshape(shape)

        handles = []
        for layer, block in enumerate(self.blocks()):
            handles.append(_register(block, "input", layer, "", lambda i, _f, t: shapes.__setitem__(i, t.shape)))
            for module, where, field in points(layer):
                handles.append(_register(module, where, layer, field, as_block_shape))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def encode(self, text: str, *, max_length: int | None = None, special_tokens: bool = True) -> Tensor:
        if self.tokenizer is None:
            raise InputError(
                f"model {self.name!r} was loaded without a tokenizer (none beside its weights); save one there "
                "(tokenizer.save_pretrained) or pass token ids instead of text (--ids FILE on the command line, "
                "A.study.audit(model, ids) in Python)"
            )
        ids = self.tokenizer(
            text, truncation=max_length is not None, max_length=max_length, add_special_tokens=special_tokens,
            return_tensors="pt",
        )  # fmt: skip
        return ids["input_ids"].to(torch.long)

    def special_tokens(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if self.tokenizer is None:
            return (), ()
        # The specials around one input, read off a probe: with = prefix + core + suffix.
        core = self.encode("a", special_tokens=False)[0].tolist()
        with_specials = self.encode("a")[0].tolist()
        for start in range(len(with_specials) - len(core) + 1):
            if with_specials[start : start + len(core)] == core:
                return tuple(with_specials[:start]), tuple(with_specials[start + len(core) :])
        return (), ()

    @property
    def pad_token_id(self) -> int:  # type: ignore[override]
        tokenizer = self.tokenizer
        pad = None if tokenizer is None else tokenizer.pad_token_id
        pad = getattr(tokenizer, "eos_token_id", None) if pad is None else pad
        return 0 if pad is None else int(pad)

    @property
    def padding_side(self) -> str:  # type: ignore[override]
        return getattr(self.tokenizer, "padding_side", "right") or "right"


def _register(
    module: torch.nn.Module, where: str, layer: int, field: str, record: Callable[[int, str, Tensor], Tensor | None]
) -> Any:
    """A hook reporting ``module``'s first input or output to ``record``; where ``record`` returns a tensor, the
    module runs on it (input) or passes it on (output) in place of its own."""
    if where == "input":

        def pre_hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            replacement = record(layer, field, args[0] if args else kwargs["hidden_states"])
            if replacement is None:
                return None
            if args:
                return (replacement, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": replacement}

        return module.register_forward_pre_hook(pre_hook, with_kwargs=True)

    def post_hook(_module: torch.nn.Module, _args: Any, output: Any) -> Any:
        # a copy: some blocks add to a sublayer's output in place afterwards (Falcon's mlp_output += attention_output)
        replacement = record(layer, field, (output[0] if isinstance(output, tuple) else output).clone())
        if replacement is None:
            return None
        return (replacement, *output[1:]) if isinstance(output, tuple) else replacement

    return module.register_forward_hook(post_hook)


@overload
def copied(tensor: Tensor) -> Tensor: ...


@overload
def copied(tensor: None) -> None: ...


@overload
def copied(tensor: Tensor | None) -> Tensor | None: ...


def copied(tensor: Tensor | None) -> Tensor | None:
    """A detached copy of a parameter (None stays None), so normalized weights never alias the module's."""
    return None if tensor is None else tensor.detach().clone()


def linear_mlp(up: HFModule, down: HFModule, activation: Activation) -> MLPWeights:
    """MLPWeights of ``down(act(up(x)))`` built from two ``torch.nn.Linear`` layers."""
    return MLPWeights(
        kind="mlp",
        activation=activation,
        w_in=copied(up.weight),
        b_in=copied(up.bias),
        w_out=copied(down.weight),
        b_out=copied(down.bias),
    )


def split_heads(weight: Tensor, n_head: int) -> Tensor:
    """An ``[n_head * d_head, d_model]`` projection as ``[head, d_head, d_model]``."""
    return rearrange(weight, "(head d_head) d_model -> head d_head d_model", head=n_head)


@overload
def split_bias(bias: Tensor, n_head: int) -> Tensor: ...


@overload
def split_bias(bias: Tensor | None, n_head: int) -> Tensor | None: ...


def split_bias(bias: Tensor | None, n_head: int) -> Tensor | None:
    """An ``[n_head * d_head]`` bias as ``[head, d_head]`` (None stays None)."""
    return None if bias is None else rearrange(bias, "(head d_head) -> head d_head", head=n_head)


def is_vision(config: Any) -> bool:
    """Whether a transformers config is a patch-based vision encoder (ViT, CLIP vision): its input is pixel_values,
    its sequence the patches and one [CLS] token."""
    return getattr(config, "image_size", None) is not None and getattr(config, "patch_size", None) is not None


def vision_positions(config: Any) -> int:
    """The sequence length of a vision encoder: one token per patch and [CLS]."""
    return (config.image_size // config.patch_size) ** 2 + 1


def rotary_of(config: Any, d_head: int, layer_type: str | None = None) -> RotaryConfig:
    """The RotaryConfig of a transformers config's ``rope_parameters`` (every RoPE type of ``ROPE_TYPES``); for
    models with one RoPE per layer type (Gemma 3: ``{"sliding_attention": …, "full_attention": …}``), the entry
    of ``layer_type`` (``config.layer_types[i]`` of layer i).

    Raises:
        UnsupportedModelError naming a RoPE type attnsens does not reproduce, or RoPE per layer type without a
        known ``layer_type``.
    """
    rope = dict(config.rope_parameters)
    if "rope_theta" not in rope:
        if layer_type is None or not isinstance(rope.get(layer_type), dict):
            raise UnsupportedModelError(
                f"{config.model_type} uses a different RoPE per layer type ({', '.join(rope)}); the layer's type "
                f"{layer_type!r} names none of them"
            )
        rope = dict(rope[layer_type])
    kind = rope.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"RoPE type {kind!r} of {config.model_type} is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    context = rope.get("original_max_position_embeddings")
    if kind == "dynamic":
        context = config.max_position_embeddings  # transformers' dynamic NTK scales from the config's context
    factor = rope.get("factor")
    if factor is None:
        factor = config.max_position_embeddings / context if kind in ("yarn", "longrope") else 1.0
    optional = {
        key: rope[name]
        for key, name in (
            ("low_freq_factor", "low_freq_factor"),
            ("high_freq_factor", "high_freq_factor"),
            ("short_factor", "short_factor"),
            ("long_factor", "long_factor"),
        )
        if rope.get(name) is not None
    }
    return RotaryConfig(
        base=float(rope["rope_theta"]),
        rotary_dim=int(d_head * rope.get("partial_rotary_factor", 1.0)),
        rope_type=kind,
        factor=float(factor),
        original_max_positions=None if context is None else int(context),
        beta_fast=float(rope.get("beta_fast") or 32.0),
        beta_slow=float(rope.get("beta_slow") or 1.0),
        truncate=bool(rope.get("truncate", True)),
        **optional,
    )


def spec_rotary(config: Any, d_head: int) -> RotaryConfig | None:
    """The ModelSpec's rotary: :func:`rotary_of`, or default RoPE where that refuses the type, or None where RoPE
    differs by layer type (Gemma 3).

    Attention rows of any RoPE type can be audited (they come from the model itself); only the normalized
    weights (``read_layers``, which calls :func:`rotary_of`) refuse a type attnsens cannot reproduce.
    """
    try:
        return rotary_of(config, d_head)
    except UnsupportedModelError:
        rope = config.rope_parameters
        if "rope_theta" not in rope:
            return None
        dim = int(d_head * rope.get("partial_rotary_factor", 1.0))
        return RotaryConfig(base=float(rope["rope_theta"]), rotary_dim=dim)


def rotary_temperature(
    scaling: float, rotary: RotaryConfig, rotary_module: HFModule | None, d_head: int, layer_type: str | None = None
) -> float:
    """τ of a rotary attention whose cos/sin carry the factor m = ``rotary_module.attention_scaling`` (yarn,
    longrope; ``{layer_type}_attention_scaling`` with one RoPE per layer type): q and k both scale by m on the
    rotating dimensions, so on a fully rotating head τ = 1/(scaling m²).

    Raises:
        UnsupportedModelError when m ≠ 1 on a partially rotating head (not a temperature change).
    """
    per_type = None if layer_type is None else getattr(rotary_module, f"{layer_type}_attention_scaling", None)
    m = float(getattr(rotary_module, "attention_scaling", 1.0) if per_type is None else per_type)
    if m != 1.0 and rotary.rotary_dim != d_head:
        raise UnsupportedModelError(
            f"RoPE {rotary.rope_type!r} with attention factor {m:.4g} on {rotary.rotary_dim} of {d_head} head "
            f"dimensions is not supported (it is a temperature change only when every dimension rotates)"
        )
    return 1.0 / (scaling * m * m)


def activation_of(name: str) -> Activation:
    """The MLPWeights activation for a transformers ``hidden_act`` / ``activation_function`` string."""
    known: dict[str, Activation] = {
        "gelu": "gelu",
        "gelu_python": "gelu",  # the same erf form, in Python
        "gelu_new": "gelu_tanh",
        "gelu_accurate": "gelu_tanh",  # the same tanh form, its constant precomputed
        "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_fast": "gelu_tanh",
        "relu": "relu",
        "relu2": "relu2",
        "quick_gelu": "quick_gelu",
        "silu": "silu",
        "swish": "silu",
        "xielu": "xielu",  # with its parameters, read by xielu_parameters
    }
    if name not in known:
        raise UnsupportedModelError(f"activation {name!r} is not supported; supported: {', '.join(known)}")
    return known[name]


def xielu_parameters(module: HFModule) -> XIELUParameters:
    """The parameters of transformers' ``XIELUActivation`` as its forward applies them: α_p = softplus(alpha_p) and
    α_n = beta + softplus(alpha_n) evaluated as the module evaluates them (in its parameters' own type), and its
    buffers beta and eps, each held exactly as a float64.

    Raises:
        UnsupportedModelError: the module lacks one of them, or holds more than one value of one.
    """
    names = ("alpha_p", "alpha_n", "beta", "eps")
    values = [getattr(module, name, None) for name in names]
    tensors = [value.detach() for value in values if isinstance(value, Tensor) and value.numel() == 1]
    if len(tensors) != len(names):
        raise UnsupportedModelError(
            f"{type(module).__name__} is not transformers' xIELU: attnsens reads one value each of "
            f"{', '.join(names)}; a module without them is not bounded"
        )
    raw_p, raw_n, beta, eps = tensors
    softplus = torch.nn.functional.softplus
    return XIELUParameters(
        alpha_p=float(softplus(raw_p)), alpha_n=float(beta + softplus(raw_n)), beta=float(beta), eps=float(eps)
    )


def layer_norm(module: HFModule, *, eps: float | None = None) -> NormWeights:
    """NormWeights of a ``torch.nn.LayerNorm`` (bias may be absent; without an elementwise affine map γ = 1, as
    OPT's ``layer_norm_elementwise_affine=False``), of a LayerNorm module that keeps its ε as ``variance_epsilon``
    (Cohere), or, with ``eps``, of one that keeps none (OLMo's parameter-free LayerNorm passes a literal to
    ``F.layer_norm``; ``check_norm_eps`` then checks it on the module)."""
    bias = getattr(module, "bias", None)
    kept = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    kept = eps if kept is None else kept
    if kept is None:
        raise UnsupportedModelError(
            f"{type(module).__name__} keeps no ε (no eps or variance_epsilon attribute), and its family's layout "
            "names none; attnsens does not bound a norm whose ε it cannot read"
        )
    weight = getattr(module, "weight", None)
    gamma = torch.ones(module.normalized_shape) if weight is None else weight.detach().clone()
    return NormWeights(kind="layernorm", gamma=gamma, beta=copied(bias), eps=float(kept))


def check_norm_eps(module: HFModule, norm: NormWeights) -> None:
    """UnsupportedModelError unless ``module`` computes with ``norm``'s ε: on a probe whose variance is ε itself
    the output scales by 1/√(var + ε), so a wrong ε shows as a factor (√(11/2) ≈ 2.3 for 10⁻⁶ read as 10⁻⁵), where
    the weights-fidelity gate, on activations of variance about 1, would see a relative change of ε alone."""
    from attnsens.geometry.layers import norm_forward

    width = int(norm.gamma.numel())
    signs = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat((width + 1) // 2)[:width]
    centred = signs - signs.mean()
    probe = (centred * (norm.eps**0.5 / centred.square().mean().sqrt())).to(norm.gamma.dtype)
    with torch.no_grad():
        seen = module(probe[None]).double()[0]
    expected = norm_forward(probe.double(), norm)
    if not torch.allclose(seen, expected, rtol=1e-3, atol=1e-6):
        raise UnsupportedModelError(
            f"{type(module).__name__} does not compute with ε = {norm.eps:g}, the value its family's layout names "
            "(checked on a probe of variance ε); attnsens does not bound a norm whose ε it cannot read"
        )
