"""Shared base of the Hugging Face transformers adapters (GPT-2, GPT-NeoX, Llama, BERT).

A family subclass names its blocks, its attention modules (the ones that call the attention function) and the
submodules whose inputs/outputs are the layer inputs; it converts parameters in ``read_layers``. Forward passes,
tokenization and the query/key tap (models/hf_tap.py) are common.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from einops import rearrange
from torch import Tensor

from attnsens.errors import InputError, UnsupportedModelError
from attnsens.models.adapter import OUTPUT_FIELDS, ModelAdapter, ModelSpec, QueryKeyCallback
from attnsens.models.hf_tap import hf_query_key_tap
from attnsens.models.weights import Activation, MLPWeights

HookPoint = tuple[torch.nn.Module, Literal["input", "output"], str]
"""(submodule, whether its input or its output is the tensor, LayerInputs field name)."""


class HFAdapter(ModelAdapter):
    """An adapter around a transformers ``PreTrainedModel`` (any head; the base model is what runs)."""

    def __init__(self, module: torch.nn.Module, *, name: str, tokenizer: Any = None) -> None:
        self.base = module.base_model
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
        self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)

    def query_key_tap(self, on_query_key: QueryKeyCallback) -> contextlib.AbstractContextManager[None]:
        implementation = self.base.config._attn_implementation or "eager"
        return hf_query_key_tap(self.attention_modules(), implementation, on_query_key)

    def layer_input_taps(self, record: Callable[[int, str, Tensor], None]) -> contextlib.AbstractContextManager[None]:
        return self._taps(self.hook_points, record)

    def layer_output_taps(self, record: Callable[[int, str, Tensor], None]) -> contextlib.AbstractContextManager[None]:
        return self._taps(self.output_hook_points, record)

    @contextlib.contextmanager
    def _taps(
        self, points: Callable[[int], list[HookPoint]], record: Callable[[int, str, Tensor], None]
    ) -> Iterator[None]:
        handles = []
        for layer in range(self.spec.n_layer):
            for module, where, field in points(layer):
                handles.append(_register(module, where, layer, field, record))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def encode(self, text: str, *, max_length: int | None = None) -> Tensor:
        if self.tokenizer is None:
            raise InputError(f"model {self.name!r} was loaded without a tokenizer; pass token ids instead of text")
        ids = self.tokenizer(text, truncation=max_length is not None, max_length=max_length, return_tensors="pt")
        return ids["input_ids"].to(torch.long)


def _register(
    module: torch.nn.Module, where: str, layer: int, field: str, record: Callable[[int, str, Tensor], None]
) -> Any:
    if where == "input":

        def pre_hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            record(layer, field, args[0] if args else kwargs["hidden_states"])

        return module.register_forward_pre_hook(pre_hook, with_kwargs=True)

    def post_hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
        record(layer, field, output[0] if isinstance(output, tuple) else output)

    return module.register_forward_hook(post_hook)


def copied(tensor: Tensor | None) -> Tensor | None:
    """A detached copy of a parameter (None stays None), so normalized weights never alias the module's."""
    return None if tensor is None else tensor.detach().clone()


def linear_mlp(up: torch.nn.Linear, down: torch.nn.Linear, activation: Activation) -> MLPWeights:
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


def split_bias(bias: Tensor | None, n_head: int) -> Tensor | None:
    """An ``[n_head * d_head]`` bias as ``[head, d_head]`` (None stays None)."""
    return None if bias is None else rearrange(bias, "(head d_head) -> head d_head", head=n_head)


def activation_of(name: str) -> Activation:
    """The MLPWeights activation for a transformers ``hidden_act`` / ``activation_function`` string."""
    known: dict[str, Activation] = {
        "gelu": "gelu",
        "gelu_new": "gelu_tanh",
        "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_fast": "gelu_tanh",
        "relu": "relu",
        "silu": "silu",
        "swish": "silu",
    }
    if name not in known:
        raise UnsupportedModelError(f"activation {name!r} is not supported; supported: {', '.join(known)}")
    return known[name]
