"""Taps on Hugging Face transformers attention: queries and keys as the model's attention function receives them.

Every supported HF family calls its attention through ``ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager)``
with queries and keys already projected, split into heads and rotated (RoPE). While a tap is active we place a
thin wrapper under the model's implementation name (``"sdpa"``, ``"eager"``, ...) that reports the tensors of
tapped modules and then calls the original function, so any implementation works — sdpa included. A callback
may instead return the layer's output (softmax(rows)·V, from the rows it computed anyway; ``AttentionCall.value``):
the wrapper then returns that and skips the original call. Untapped modules (other models in the process) pass
straight through.

Besides the tensors, the wrapper reads what the call asks for (:func:`attention_call`): the scaling, the mask the
model built for this layer (causal, padding, sliding window, additive biases), a logit softcap and sink logits;
an argument of unknown effect is refused by name. GPT-2's eager path with ``reorder_and_upcast_attn`` skips the
interface, so its reordered method is wrapped instead while a tap is active. A model inside a TransformerLens
``TransformerBridge`` has its attention modules replaced by the bridge's components, which compute the rows
themselves; their score hooks are tapped instead (:func:`scores_tap`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, cast

import torch
from torch import Tensor

from attnsens.errors import UnsupportedModelError
from attnsens.models import query_slices
from attnsens.models.adapter import QueryKeyCallback
from attnsens.models.attention import AttentionCall

# Keyword arguments of the attention interface that do not change the probabilities (or are read below).
_NEUTRAL = {"dropout", "scaling", "is_causal", "sliding_window", "softcap", "s_aux", "output_attentions",
            "position_bias", "position_ids", "cache_position", "use_cache", "layer_idx", "cu_seq_lens_q",
            "cu_seq_lens_k", "max_length_q", "max_length_k", "target_dtype", "attention_type",
            "deterministic"}  # fmt: skip
_MASKED_BY_ITSELF = ("eager", "sdpa")  # implementations that apply no window beyond the mask they are given

# id(attention module) -> (layer, callback) for every tapped module in the process.
_TAPPED: dict[int, tuple[int, QueryKeyCallback]] = {}
# (id of an attention-function registry, implementation name) -> (number of active taps, the registry's local
# mapping entry it replaced or None)
_INSTALLED: dict[tuple[int, str], tuple[int, Any]] = {}


@contextlib.contextmanager
def hf_query_key_tap(
    attention_modules: Sequence[torch.nn.Module], implementation: str, on_query_key: QueryKeyCallback
) -> Iterator[None]:
    """Report ``(layer, query, key, call)`` of ``attention_modules[layer]`` while the model runs.

    ``query`` is [batch, head, n, d_head], ``key`` [batch, kv_head, n, d_head] (before any grouped-query
    repetition), ``call`` the AttentionCall read from the arguments the model passes to its attention function
    (τ = 1 / ``scaling``, its mask, softcap and sinks).
    """
    ids = [id(m) for m in attention_modules]
    for layer, module in enumerate(attention_modules):
        _TAPPED[id(module)] = (layer, on_query_key)
        if hasattr(module, _GPT2_REORDERED):
            setattr(module, _GPT2_REORDERED, _reported_reordered(module, layer, on_query_key))
    registries = _registries(attention_modules)
    for registry in registries:
        count, replaced = _INSTALLED.get((id(registry), implementation), (0, None))
        if count == 0:
            replaced = registry._local_mapping.get(implementation)
            registry[implementation] = _make_wrapper(implementation, replaced)
        _INSTALLED[id(registry), implementation] = (count + 1, replaced)
    try:
        yield
    finally:
        for key in ids:
            _TAPPED.pop(key, None)
        for module in attention_modules:
            if _GPT2_REORDERED in vars(module):
                delattr(module, _GPT2_REORDERED)
        for registry in registries:
            count, replaced = _INSTALLED.pop((id(registry), implementation))
            if count > 1:
                _INSTALLED[id(registry), implementation] = (count - 1, replaced)
            elif replaced is None:
                del registry._local_mapping[implementation]
            else:
                registry[implementation] = replaced


def _registries(attention_modules: Sequence[torch.nn.Module]) -> list[Any]:
    """The attention-function registries the modules look their function up in: transformers' own, and any of a
    family's module that keeps a registry of its own (Doge's ``ALL_ATTENTION_FUNCTIONS`` adds its flex attention
    to a fresh ``AttentionInterface``, whose local entries the global one does not see)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    found = {id(ALL_ATTENTION_FUNCTIONS): ALL_ATTENTION_FUNCTIONS}
    for module in attention_modules:
        own = getattr(sys.modules.get(type(module).__module__), "ALL_ATTENTION_FUNCTIONS", None)
        if isinstance(own, type(ALL_ATTENTION_FUNCTIONS)):
            found.setdefault(id(own), own)
    return list(found.values())


_GPT2_REORDERED = "_upcast_and_reordered_attn"
"""GPT-2's eager path with ``reorder_and_upcast_attn`` calls this method instead of the interface."""


def _reported_reordered(module: torch.nn.Module, layer: int, on_query_key: QueryKeyCallback) -> Callable[..., Any]:
    original = getattr(module, _GPT2_REORDERED)

    def reordered(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None = None) -> Any:
        # The same softmax(q·k·scaling + mask) as the interface, computed in float32 with the scale on the product.
        # Its output comes from the method itself: the call offers no values to compute it from.
        call = attention_call(module, "eager", query, key, (None, attention_mask), {"scaling": module.scaling})
        on_query_key(layer, query, key, call)
        return original(query, key, value, attention_mask)

    return reordered


def attention_call(
    module: torch.nn.Module,
    implementation: str,
    query: Tensor,
    key: Tensor,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> AttentionCall:
    """The AttentionCall of one call ``interface(module, query, key, value, attention_mask, ...)``.

    A per-head additive ``position_bias`` [batch | 1, head, query, key] (T5's relative positions) is not one mask
    shared by the heads: the call then carries its scores, q·kᵀ·scaling + bias + mask, as the family's eager
    attention computes them, and the model's own attention function computes the output.

    Raises:
        UnsupportedModelError naming an argument that would change the probabilities in a way attnsens does not
        reproduce (a per-head position bias, a head mask, a block mask of flex attention, ...).
    """
    mask = args[1] if len(args) > 1 else kwargs.get("attention_mask")
    unknown = sorted(k for k, v in kwargs.items() if v is not None and k not in _NEUTRAL | {"attention_mask"})
    if len(args) > 2 or unknown or (mask is not None and not isinstance(mask, Tensor)):
        if len(args) > 2:
            what = "extra positional arguments"
        else:
            what = ", ".join(unknown) or f"a {type(mask).__name__} attention mask"
        raise UnsupportedModelError(
            f"{type(module).__name__} passes {what} to its attention function; attnsens does not know how that "
            f"changes the attention rows, so it refuses to recompute them (use attn_implementation='eager' or 'sdpa')"
        )
    scaling = kwargs.get("scaling")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    # The values, where the callback may compute the output instead: no dropout, no weights asked back.
    value = args[0] if args and isinstance(args[0], Tensor) else None
    if kwargs.get("dropout") or kwargs.get("output_attentions"):
        value = None
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = mask is None and implementation != "eager" and bool(is_causal) and query.shape[2] > 1
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:
        if softcap is not None or sinks is not None:
            raise UnsupportedModelError(
                f"{type(module).__name__} passes a position bias beside a softcap or sinks to its attention "
                "function; attnsens does not know their order, so it refuses to recompute the rows"
            )
        scores = biased_scores(query, key, float(scaling), position_bias, mask, causal=causal)
        return AttentionCall(tau=1.0 / float(scaling), scores=scores)
    return AttentionCall(
        tau=1.0 / float(scaling),
        mask=mask,
        causal=causal,
        window=None if implementation in _MASKED_BY_ITSELF else kwargs.get("sliding_window"),
        softcap=None if softcap is None else float(softcap),
        sinks=None if sinks is None else sinks.detach(),
        value=value,
    )


def biased_scores(
    query: Tensor, key: Tensor, scaling: float, bias: Tensor, mask: Tensor | None, *, causal: bool
) -> Tensor:
    """Pre-softmax scores q·kᵀ·scaling + bias + mask [batch, head, query, key] in float32, keys a bool mask (or,
    without a mask, the ``causal`` pattern) hides at the float minimum; key heads are repeated for grouped
    queries."""
    query, key = query.detach().float(), key.detach().float()
    if key.shape[1] != query.shape[1]:
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling + bias.detach().float()
    lowest = torch.finfo(scores.dtype).min
    if causal:
        n_query, n_key = scores.shape[-2:]
        later = torch.ones(n_query, n_key, dtype=torch.bool, device=scores.device).triu(n_key - n_query + 1)
        return scores.masked_fill(later, lowest)
    if mask is not None and mask.dtype == torch.bool:
        return scores.masked_fill(~mask, lowest)
    if mask is not None:
        scores = scores + mask.float()
    return scores.clamp(min=lowest)


@contextlib.contextmanager
def input_taps(
    attention_modules: Sequence[torch.nn.Module], reporter: Callable[[int, Any], Callable[..., None]]
) -> Iterator[None]:
    """A forward pre-hook ``reporter(layer, module)`` (called with the module's args and kwargs) on every attention
    module while the context is open: the tap of families whose attention bypasses the interface (BLOOM, Falcon,
    MPT), which recompute what the module computes from what it receives."""
    handles = [
        module.register_forward_pre_hook(reporter(layer, module), with_kwargs=True)
        for layer, module in enumerate(attention_modules)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


SCORES_HOOK = "hook_attn_scores"
"""The hook point of a TransformerLens bridge attention component whose output is that layer's pre-softmax scores."""


def is_bridge_attention(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a TransformerLens bridge's attention component (it has a ``hook_attn_scores``)."""
    return isinstance(getattr(module, SCORES_HOOK, None), torch.nn.Module)


def exposes_scores(attention_modules: Sequence[torch.nn.Module]) -> bool:
    """Whether every attention module is a TransformerLens bridge component (``TransformerBridge`` replaces the
    model's attention modules in place and computes the rows itself, bypassing the attention interface)."""
    return bool(attention_modules) and all(is_bridge_attention(m) for m in attention_modules)


@contextlib.contextmanager
def scores_tap(attention_modules: Sequence[torch.nn.Module], on_query_key: QueryKeyCallback) -> Iterator[None]:
    """Report each layer's own scores (``AttentionCall.scores``) from the bridge components' score hooks.

    ``query`` and ``key`` passed to the callback are the scores themselves ([batch, head, n, n]); only their shape
    is read. The rows are exactly the bridge's ``hook_pattern`` (softmax of these scores).
    """

    def report(layer: int) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _args: Any, scores: Tensor) -> None:
            on_query_key(layer, scores, scores, AttentionCall(tau=1.0, scores=scores.detach()))

        return hook

    handles = [getattr(m, SCORES_HOOK).register_forward_hook(report(i)) for i, m in enumerate(attention_modules)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _make_wrapper(implementation: str, replaced: Any) -> Callable[..., Any]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def original_for(module: torch.nn.Module) -> Callable[..., Any]:
        if replaced is not None:
            return replaced
        if implementation == "eager":
            # "eager" is each family's own module-level function, not a registry entry.
            return sys.modules[type(module).__module__].eager_attention_forward
        # An unannotated dict of functions, which mypy types as builtins.function.
        return cast(Callable[..., Any], ALL_ATTENTION_FUNCTIONS._global_mapping[implementation])

    def tapped_attention(module: torch.nn.Module, query: Tensor, key: Tensor, *args: Any, **kwargs: Any) -> Any:
        entry = _TAPPED.get(id(module))
        if entry is not None:
            layer, callback = entry
            call = attention_call(module, implementation, query, key, args, kwargs)
            piece = query_slices.current()
            if piece is not None:
                return _sliced_call(module, implementation, layer, callback, query, key, call, piece), None
            output = callback(layer, query, key, call)
            if isinstance(output, Tensor):  # the callback computed the layer's output from the rows it reduced
                return output, None
        return original_for(module)(module, query, key, *args, **kwargs)

    return tapped_attention


def _sliced_call(
    module: torch.nn.Module,
    implementation: str,
    layer: int,
    callback: QueryKeyCallback,
    query: Tensor,
    key: Tensor,
    call: AttentionCall,
    piece: query_slices.QuerySlice,
) -> Tensor:
    """The output of the queries of one slice of a layer run in query slices: the slice's keys and values join those
    of the slices before it (``query_slices.buffers``), and the callback computes the slice's rows and output from
    them and the slice's own queries, under the causal pattern the model asked for (no mask of its own,
    ``is_causal``)."""
    causal = call.mask is None and implementation != "eager" and bool(getattr(module, "is_causal", True))
    if not causal or call.value is None or call.scores is not None or call.window is not None:
        raise RuntimeError(f"layer {layer} runs in query slices but its attention call is not plain causal attention")
    held = query_slices.buffers()
    full = replace(
        call,
        causal=True,
        value=held.fill("value", call.value, piece),
        queries=(piece.start, piece.stop),
    )
    output = callback(layer, query, held.fill("key", key, piece), full)
    if not isinstance(output, Tensor):
        raise RuntimeError(f"layer {layer} runs in query slices but its rows gave no output")
    query_slices.answered()
    return output
