"""Audit-only adapter of any transformers model whose attention goes through the attention-function interface.

Families without a block layout (models/layouts.py) — DeepSeek-V3 with its latent attention, Qwen3-Next with its
gated attention, and others (``NO_BOUNDS`` says why for each it names) — still hand their
queries and keys to ``ALL_ATTENTION_FUNCTIONS`` with the mask, scaling, softcap and sinks they use, so their attention
rows can be recomputed exactly (models/hf_tap.py). The modules that do so are found by reading their classes'
``forward``: a module whose forward looks the interface up is an attention layer, in the order the model holds them.
Families whose eager attention computes its softmax itself (GPT-Neo, Falcon, BLOOM, MPT, ...) have no such module and
are refused by name. Normalized weights, and so bounds and the weights-fidelity gate, need a layout and are refused.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

import torch
from torch import Tensor

from attnsens.errors import UnsupportedModelError
from attnsens.models.adapter import ModelSpec, QueryKeyCallback
from attnsens.models.attention import AttentionCall
from attnsens.models.hf import HFAdapter, HFModule, is_vision, vision_positions
from attnsens.models.hf_tap import exposes_scores, is_bridge_attention
from attnsens.models.layouts import NO_POSITION_LIMIT
from attnsens.weights import LayerWeights

NO_BOUNDS: dict[str, str] = {
    "deepseek_v3": (
        "multi-head latent attention (low-rank queries and keys with a decoupled RoPE), beside a mixture of experts "
        "whose router picks its experts within groups by sigmoid scores plus a learned bias"
    ),
    "qwen3_next": (
        "gated DeltaNet linear-attention layers, and attention blocks whose output is gated by the input and whose "
        "MLP is a mixture of experts"
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


def is_encoder_decoder(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds an encoder stack and a decoder stack (BART, T5, Whisper), as opposed to one stack of
    such a model passed alone."""
    return all(isinstance(getattr(model, part, None), torch.nn.Module) for part in ("encoder", "decoder"))


def takes_token_ids(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward takes ``input_ids``, or passes its positional arguments on (BART's decoder
    wrapper); Whisper's encoder, whose first argument is its audio features, does not."""
    parameters = list(inspect.signature(model.forward).parameters.values())
    return any(p.name == "input_ids" for p in parameters) or (
        bool(parameters) and parameters[0].kind is inspect.Parameter.VAR_POSITIONAL
    )


def _first_argument(model: torch.nn.Module) -> str:
    return next(iter(inspect.signature(model.forward).parameters), "no argument")


def decoder_inputs(input_ids: Tensor, attention_mask: Tensor | None, start: int | None) -> Tensor:
    """The decoder's input of an encoder-decoder audited on ``input_ids`` [batch, n]: the same text, teacher-forced
    (each sequence's tokens shifted one place right behind ``start``, the decoder's start token), so that decoder
    position t holds the token the decoder reads to predict encoder token t, and padding stays where the encoder's
    is (the decoder takes ``attention_mask`` too; a left-padded sequence starts after its padding). ``start`` None:
    each sequence starts with its own last real token, as mBART's decoder does (its language id ends the text)."""
    shifted = input_ids.roll(1, dims=1)
    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    first = real.int().argmax(dim=1, keepdim=True)  # the first real position of each sequence
    if start is not None:
        return shifted.scatter(1, first, start)
    last = real.shape[1] - 1 - real.flip(1).int().argmax(dim=1, keepdim=True)  # the last real position
    return shifted.scatter(1, first, input_ids.gather(1, last))


def starts_with_last_token(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward builds its decoder's input from ``input_ids`` behind their last real token, with
    no start token of its config (mBART, PLBart: ``shift_tokens_right(input_ids, self.config.pad_token_id)``)."""
    try:
        source = inspect.getsource(type(model).forward)
    except (OSError, TypeError):
        return False
    return "shift_tokens_right(input_ids,self.config.pad_token_id)" in "".join(source.split())


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
    """Attention rows of any model whose attention layers call the interface; no normalized weights.

    A layer is one call of the attention function in a forward pass. A module called more than once per pass
    (ALBERT's one shared layer, run ``num_hidden_layers`` times) gives one audited layer per call, in call order.
    """

    def __init__(self, module: HFModule, *, name: str, tokenizer: Any = None) -> None:
        config, base = module.base_model.config, module.base_model
        self._two_stacks = is_encoder_decoder(base)
        if self._two_stacks and not takes_token_ids(base.encoder):
            raise UnsupportedModelError(
                f"{config.model_type} is an encoder-decoder whose encoder takes "
                f"{_first_argument(base.encoder)}, not token ids; attnsens audits its decoder alone "
                "(A.models.load(model.get_decoder()))"
            )
        self._start = getattr(config, "decoder_start_token_id", None)
        if self._two_stacks and self._start is None and not starts_with_last_token(base):
            raise UnsupportedModelError(
                f"{config.model_type}: its config names no decoder_start_token_id, so attnsens cannot build the "
                "decoder's input; pass its encoder or decoder alone (A.models.load(model.get_encoder()))"
            )
        if not is_vision(config) and not takes_token_ids(base):
            raise UnsupportedModelError(
                f"{config.model_type}: {type(base).__name__} takes {_first_argument(base)}, not token ids; attnsens "
                "audits models of token ids (text) or of pixel_values (images)"
            )
        self._attention = interface_attention_modules(module.base_model)
        if not self._attention:
            classes = sorted({type(m).__name__ for m in module.modules() if "Attention" in type(m).__name__})
            if not classes:
                raise UnsupportedModelError(
                    f"{config.model_type}: attnsens finds no attention layer in it (no module calls transformers' "
                    "attention-function interface, and none is an attention class: a state-space or linear-attention "
                    "model, or one whose attention layers its config leaves out), so it has no rows to audit"
                )
            raise UnsupportedModelError(
                f"{config.model_type}: its attention ({', '.join(classes)}) computes "
                "its softmax itself instead of calling transformers' attention-function interface, so attnsens "
                "cannot tap its queries and keys; this family is not supported"
            )
        self._call_layers: list[list[int]] | None = None  # per tapped module, its layers when one is called twice
        super().__init__(module, name=name, tokenizer=tokenizer)
        self._attention, self.spec = self._probe()

    def _probe(self) -> tuple[list[torch.nn.Module], ModelSpec]:
        """The attention modules an input calls, in call order, and the spec with the heads, causality and (for a
        vision encoder) sequence length of those calls, read from a forward pass on two tokens or one blank
        image: a config need not describe the stack that runs (a BART decoder alone has
        ``decoder_attention_heads``, which ``num_attention_heads`` does not name, and a cross-attention module
        beside each self-attention, which runs only on an encoder's states; DeiT adds a distillation token to
        [CLS], SigLIP has neither).

        Causal: the first layer's ``is_causal`` attribute, or else its first call. The layer's attribute is not
        the whole story: the CLIP text tower keeps ``is_causal = False`` on its layers and passes a causal mask
        (and ``is_causal=True``) at call time. So the call is read: causal when it has no mask and asks for the
        causal pattern, or when its mask (inside a TransformerLens bridge: its scores) hides the second key from
        the first query.

        Raises:
            UnsupportedModelError when the layers' head counts differ, or no module calls the interface.
        """
        calls: list[tuple[int, Tensor, Tensor, AttentionCall]] = []

        def record(index: int, query: Tensor, key: Tensor, call: AttentionCall) -> None:
            calls.append((index, query, key, call))

        vision = is_vision(self.base.config)
        with torch.no_grad(), self.query_key_tap(record):
            if self._two_stacks:  # encoder and decoder lengths differ, so that cross-attention shows in the shapes
                encoder_ids = torch.zeros(1, 3, dtype=torch.long, device=self.device)
                self.base(input_ids=encoder_ids, decoder_input_ids=encoder_ids[:, :2], use_cache=False)
            else:
                self.forward(self.blank_image() if vision else torch.zeros(1, 2, dtype=torch.long, device=self.device))
        if not calls:
            raise UnsupportedModelError(
                f"{self.family}: none of its attention modules called the attention function on "
                f"{'an image' if vision else 'a text input'}, so attnsens cannot tap its queries and keys"
            )
        order = list(dict.fromkeys(index for index, *_ in calls))  # modules in the order of their first call
        called = [self._attention[index] for index in order]
        if len(order) < len(calls):  # a module called more than once: each call is a layer of its own
            self._call_layers = [[layer for layer, c in enumerate(calls) if c[0] == index] for index in order]
        first_query, _, first_call = calls[0][1:]
        causal = bool(getattr(called[0], "is_causal", False)) or _calls_causal(first_call)
        spec = replace(self.spec, n_layer=len(calls), causal=causal)
        if self._two_stacks:
            spec = replace(spec, attention=self._attention_kinds(calls))
        if vision:
            spec = replace(spec, max_positions=int(first_query.shape[2]))
        if exposes_scores(called):
            return called, spec  # a bridge's scores: query heads only, no keys or head size to read
        shapes = {(int(q.shape[1]), int(k.shape[1]), int(q.shape[-1])) for _, q, k, _ in calls}
        if len(shapes) > 1:
            raise UnsupportedModelError(
                f"{self.family}: its layers differ in their query heads, key heads or head size "
                f"({sorted(shapes)}); attnsens audits models whose layers share one"
                + ("; audit each stack alone (A.models.load(model.get_encoder()), model.get_decoder())"
                   if self._two_stacks else "")
            )  # fmt: skip
        n_head, n_kv_head, d_head = shapes.pop()
        return called, replace(spec, n_head=n_head, n_kv_head=n_kv_head, d_head=d_head)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> None:
        """One pass of the model; an encoder-decoder's decoder reads the same text teacher-forced
        (:func:`decoder_inputs`) under the same padding mask."""
        if not self._two_stacks:
            return super().forward(input_ids, attention_mask)
        start = None if self._start is None else int(self._start)
        self.base(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
            decoder_input_ids=decoder_inputs(input_ids, attention_mask, start), decoder_attention_mask=attention_mask,
        )  # fmt: skip
        return None

    def _attention_kinds(self, calls: list[tuple[int, Tensor, Tensor, AttentionCall]]) -> tuple[str, ...]:
        """Per call of an encoder-decoder's probe (encoder 3 tokens, decoder 2): ``"encoder"`` or ``"decoder"``
        self-attention by the stack holding the module, ``"cross"`` where 2 queries read 3 keys."""
        encoder = {id(module) for module in self.base.encoder.modules()}
        kinds = []
        for index, query, key, _ in calls:
            if id(self._attention[index]) in encoder:
                kinds.append("encoder")
            else:
                kinds.append("cross" if query.shape[2] != key.shape[2] else "decoder")
        return tuple(kinds)

    def query_key_tap(self, on_query_key: QueryKeyCallback) -> contextlib.AbstractContextManager[None]:
        if self._call_layers is None:
            return super().query_key_tap(on_query_key)
        return self._per_call_tap(self._call_layers, on_query_key)

    @contextlib.contextmanager
    def _per_call_tap(self, call_layers: list[list[int]], on_query_key: QueryKeyCallback) -> Iterator[None]:
        """The tap of modules called more than once per forward pass: the j-th call of module i is layer
        ``call_layers[i][j]``; the count starts again with every pass of the model."""
        seen = [0] * len(call_layers)

        def restart(*_: Any) -> None:
            seen[:] = [0] * len(call_layers)

        def per_call(index: int, query: Tensor, key: Tensor, call: AttentionCall) -> Tensor | None:
            layers = call_layers[index]
            layer = layers[min(seen[index], len(layers) - 1)]
            seen[index] += 1
            return on_query_key(layer, query, key, call)

        handle = self.base.register_forward_pre_hook(restart)
        try:
            with super().query_key_tap(per_call):
                yield
        finally:
            handle.remove()

    @classmethod
    def spec_of(cls, config: Any) -> ModelSpec:
        # A text model's heads are read from its calls (``_probe``); its config need not name them.
        n_head = getattr(config, "num_attention_heads", None) or 1
        d_head = getattr(config, "head_dim", None) or config.hidden_size // n_head
        if is_vision(config):
            positions, vocab = vision_positions(config), 1  # the probe reads the length the model runs
        else:  # relative positions (T5) have no limit of their own
            positions = getattr(config, "max_position_embeddings", None) or NO_POSITION_LIMIT
            vocab = config.vocab_size
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

    def read_layers(self) -> Sequence[LayerWeights]:
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
