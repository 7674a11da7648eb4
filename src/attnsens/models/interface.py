"""Audit-only adapter of any transformers model whose attention goes through the attention-function interface.

Families without a block layout (models/layouts.py) — Mixtral and the other mixtures of experts, the hybrids with
Mamba or convolution layers, ModernBERT and others (``NO_BOUNDS`` says why for each it names) — still hand their
queries and keys to ``ALL_ATTENTION_FUNCTIONS`` with the mask, scaling, softcap and sinks they use, so their attention
rows can be recomputed exactly (models/hf_tap.py). The modules that do so are found by reading their classes'
``forward``: a module whose forward looks the interface up is an attention layer, in the order the model holds them.
Families whose eager attention computes its softmax itself (GPT-Neo, Falcon, BLOOM, MPT, ...) have no such module and
are refused by name. Normalized weights, and so bounds and the weights-fidelity gate, need a layout and are refused.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from typing import Any

import torch
from torch import Tensor

from attnsens.errors import UnsupportedModelError
from attnsens.models.adapter import ModelSpec
from attnsens.models.attention import AttentionCall
from attnsens.models.hf import HFAdapter, HFModule, is_vision, vision_positions
from attnsens.models.hf_tap import is_bridge_attention
from attnsens.weights import LayerWeights

_MOE = (
    "a mixture-of-experts MLP, whose router picks its experts discontinuously in the input, so that no Jacobian "
    "bound of a fixed choice holds across the inputs around it"
)
_NOT_ATTENTION = "whose Jacobian attnsens does not bound, so no bound covers the whole block stack"
NO_BOUNDS: dict[str, str] = {
    **{family: _MOE for family in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe")},
    "deepseek_v3": f"{_MOE}; and multi-head latent attention (low-rank queries and keys with a decoupled RoPE)",
    "jamba": f"Mamba layers beside its attention layers (and mixture-of-experts MLPs), {_NOT_ATTENTION}",
    "bamba": f"Mamba-2 layers beside its attention layers, {_NOT_ATTENTION}",
    "falcon_h1": f"a Mamba-2 mixer beside the attention in every block, {_NOT_ATTENTION}",
    "granitemoehybrid": f"Mamba-2 layers and mixture-of-experts MLPs beside its attention layers, {_NOT_ATTENTION}",
    "lfm2": f"gated short-convolution layers beside its attention layers, {_NOT_ATTENTION}",
    "qwen3_next": f"gated DeltaNet linear-attention layers and mixture-of-experts MLPs, {_NOT_ATTENTION}",
    "hunyuan_v1_dense": "a QK-norm applied after RoPE, where attnsens' attention applies it before",
    "apertus": "the xIELU activation, with trained parameters, whose slope attnsens does not bound",
    "modernbert": (
        "bidirectional local windows around each query and no norm before its first attention, which attnsens' "
        "attention does not compute"
    ),
}
"""Families audited through the interface whose bounds are refused, and why (one line each)."""


def calls_attention_interface(module_class: type) -> bool:
    """Whether ``module_class.forward`` looks up transformers' attention-function interface."""
    forward = getattr(module_class, "forward", None)
    return forward is not None and _source_names_interface(forward)


@cache
def _source_names_interface(function: Callable[..., Any]) -> bool:
    """Whether the source of ``function`` names the interface; read once per function (classes share inherited
    forwards)."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source


def interface_attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model`` that call the attention interface, in the model's order (one per layer); inside a
    TransformerLens bridge, the bridge's attention components that took their place (hf_tap.scores_tap)."""
    bridged = [m for m in model.modules() if is_bridge_attention(m)]
    if bridged:
        return bridged
    return [m for m in model.modules() if calls_attention_interface(type(m))]


def _calls_causal(call: AttentionCall) -> bool:
    """Whether an attention call on two tokens hides the second key from the first query."""
    if call.scores is not None:  # a TransformerLens bridge's own scores: masked keys sit at the float minimum
        return bool(call.scores[0, 0, 0, -1] <= torch.finfo(call.scores.dtype).min / 2)
    if call.mask is None:
        return call.causal
    allowed, _, _ = call.allowed(torch.zeros(1, 1, dtype=torch.long), call.mask.shape[-1])
    return allowed is not None and not bool(allowed[0, 0, 1])


class InterfaceAdapter(HFAdapter):
    """Attention rows of any model whose attention layers call the interface; no normalized weights."""

    def __init__(self, module: HFModule, *, name: str, tokenizer: Any = None) -> None:
        config = module.base_model.config
        if getattr(config, "is_encoder_decoder", False):
            raise UnsupportedModelError(
                f"{config.model_type} is an encoder-decoder; attnsens audits self-attention of one stack only "
                "(load its encoder or decoder alone)"
            )
        self._attention = interface_attention_modules(module.base_model)
        if not self._attention:
            classes = sorted({type(m).__name__ for m in module.modules() if "Attention" in type(m).__name__})
            raise UnsupportedModelError(
                f"{config.model_type}: its attention ({', '.join(classes) or 'no attention module found'}) computes "
                "its softmax itself instead of calling transformers' attention-function interface, so attnsens "
                "cannot tap its queries and keys; this family is not supported"
            )
        super().__init__(module, name=name, tokenizer=tokenizer)
        self.spec = replace(self.spec, n_layer=len(self._attention))
        if not is_vision(self.base.config):
            self._attention, self.spec = self._probe()

    def _probe(self) -> tuple[list[torch.nn.Module], ModelSpec]:
        """The attention modules a text input calls, and the spec with the heads and causality of those calls,
        read from a forward pass on two tokens: a config need not describe the stack that runs (a BART decoder
        alone has ``decoder_attention_heads``, which ``num_attention_heads`` does not name, and a cross-attention
        module beside each self-attention, which runs only on an encoder's states).

        Causal: the first layer's ``is_causal`` attribute, or else its first call. The layer's attribute is not
        the whole story: the CLIP text tower keeps ``is_causal = False`` on its layers and passes a causal mask
        (and ``is_causal=True``) at call time. So the call is read: causal when it has no mask and asks for the
        causal pattern, or when its mask (inside a TransformerLens bridge: its scores) hides the second key from
        the first query.

        Raises:
            UnsupportedModelError when the layers' head counts differ, or no module calls the interface.
        """
        calls: dict[int, tuple[Tensor, Tensor, AttentionCall]] = {}

        def record(layer: int, query: Tensor, key: Tensor, call: AttentionCall) -> None:
            calls.setdefault(layer, (query, key, call))

        probe = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        with torch.no_grad(), self.query_key_tap(record):
            self.forward(probe)
        if not calls:
            raise UnsupportedModelError(
                f"{self.family}: none of its attention modules called the attention function on a text input, so "
                "attnsens cannot tap its queries and keys"
            )
        called = [module for layer, module in enumerate(self._attention) if layer in calls]
        calls = dict(enumerate(calls[layer] for layer in sorted(calls)))
        causal = bool(getattr(called[0], "is_causal", False)) or _calls_causal(calls[0][2])
        spec = replace(self.spec, n_layer=len(calls), causal=causal)
        if calls[0][2].scores is not None:  # a bridge's scores: query heads only, no keys or head size to read
            return called, spec
        shapes = {(int(q.shape[1]), int(k.shape[1]), int(q.shape[-1])) for q, k, _ in calls.values()}
        if len(shapes) > 1:
            raise UnsupportedModelError(
                f"{self.family}: its layers differ in their query heads, key heads or head size "
                f"({sorted(shapes)}); attnsens audits models whose layers share one"
            )
        n_head, n_kv_head, d_head = shapes.pop()
        return called, replace(spec, n_head=n_head, n_kv_head=n_kv_head, d_head=d_head)

    @classmethod
    def spec_of(cls, config: Any) -> ModelSpec:
        # A text model's heads are read from its calls (``_probe``); its config need not name them.
        n_head = getattr(config, "num_attention_heads", None) or 1
        d_head = getattr(config, "head_dim", None) or config.hidden_size // n_head
        if is_vision(config):
            positions, vocab = vision_positions(config), 1
        else:
            positions, vocab = config.max_position_embeddings, config.vocab_size
        return ModelSpec(
            n_layer=config.num_hidden_layers,
            n_head=n_head,
            n_kv_head=getattr(config, "num_key_value_heads", None) or n_head,
            d_model=config.hidden_size,
            d_head=d_head,
            max_positions=positions,
            vocab_size=vocab,
            placement="none",
            norm=None,
            causal=True,
        )

    def blocks(self) -> list[torch.nn.Module]:
        return self._attention

    def attention_modules(self) -> list[torch.nn.Module]:
        return self._attention

    def read_layers(self) -> list[LayerWeights]:
        raise self._no_layout("normalized weights")

    def layer_input_taps(
        self, record: Callable[[int, str, Tensor], Tensor | None]
    ) -> contextlib.AbstractContextManager[None]:
        raise self._no_layout("layer inputs")

    def layer_output_taps(self, record: Callable[[int, str, Tensor], None]) -> contextlib.AbstractContextManager[None]:
        raise self._no_layout("layer outputs")

    def _no_layout(self, what: str) -> UnsupportedModelError:
        why = f" ({NO_BOUNDS[self.family]})" if self.family in NO_BOUNDS else ""
        return UnsupportedModelError(
            f"{self.family}: attnsens audits its attention rows but has no block layout for it{why}, so its {what} "
            "(and the bounds and weights-fidelity gate built on them) are not available"
        )
