"""Taps on Hugging Face transformers attention: queries and keys as the model's attention function receives them.

Every supported HF family calls its attention through ``ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager)``
with queries and keys already projected, split into heads and rotated (RoPE). While a tap is active we place a
thin wrapper under the model's implementation name (``"sdpa"``, ``"eager"``, ...) that reports the tensors of
tapped modules and then calls the original function, so the model's output is unchanged and any implementation
works — sdpa included. Untapped modules (other models in the process) pass straight through.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from attnsens.errors import UnsupportedModelError
from attnsens.models.adapter import QueryKeyCallback

# id(attention module) -> (layer, callback) for every tapped module in the process.
_TAPPED: dict[int, tuple[int, QueryKeyCallback]] = {}
# implementation name -> (number of active taps, the local mapping entry it replaced or None)
_INSTALLED: dict[str, tuple[int, Any]] = {}


@contextlib.contextmanager
def hf_query_key_tap(
    attention_modules: Sequence[torch.nn.Module], implementation: str, on_query_key: QueryKeyCallback
) -> Iterator[None]:
    """Report ``(layer, query, key, tau)`` of ``attention_modules[layer]`` while the model runs.

    ``query`` is [batch, head, n, d_head], ``key`` [batch, kv_head, n, d_head] (before any grouped-query
    repetition), ``tau`` = 1 / the scaling factor the model passes to its attention function.
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ids = [id(m) for m in attention_modules]
    for layer, module in enumerate(attention_modules):
        _TAPPED[id(module)] = (layer, on_query_key)
    count, replaced = _INSTALLED.get(implementation, (0, None))
    if count == 0:
        replaced = ALL_ATTENTION_FUNCTIONS._local_mapping.get(implementation)
        ALL_ATTENTION_FUNCTIONS[implementation] = _make_wrapper(implementation, replaced)
    _INSTALLED[implementation] = (count + 1, replaced)
    try:
        yield
    finally:
        for key in ids:
            _TAPPED.pop(key, None)
        count, replaced = _INSTALLED.pop(implementation)
        if count > 1:
            _INSTALLED[implementation] = (count - 1, replaced)
        elif replaced is None:
            del ALL_ATTENTION_FUNCTIONS._local_mapping[implementation]
        else:
            ALL_ATTENTION_FUNCTIONS[implementation] = replaced


def _make_wrapper(implementation: str, replaced: Any) -> Callable[..., Any]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def original_for(module: torch.nn.Module) -> Callable[..., Any]:
        if replaced is not None:
            return replaced
        if implementation == "eager":
            # "eager" is each family's own module-level function, not a registry entry.
            return sys.modules[type(module).__module__].eager_attention_forward
        return ALL_ATTENTION_FUNCTIONS._global_mapping[implementation]

    def tapped_attention(module: torch.nn.Module, query: Tensor, key: Tensor, *args: Any, **kwargs: Any) -> Any:
        entry = _TAPPED.get(id(module))
        if entry is not None:
            layer, callback = entry
            if kwargs.get("softcap") is not None:
                # Rows are recomputed as softmax(q·k/τ); a softcapped model's are softmax(c·tanh(q·k/(τc))).
                raise UnsupportedModelError(
                    f"{type(module).__name__} caps its attention logits (softcap={kwargs['softcap']}); attnsens "
                    f"cannot recompute its rows yet; load the model with attn_logit_softcapping=None to audit it "
                    f"without the cap"
                )
            scaling = kwargs.get("scaling")
            if scaling is None:
                scaling = query.shape[-1] ** -0.5
            callback(layer, query, key, 1.0 / float(scaling))
        return original_for(module)(module, query, key, *args, **kwargs)

    return tapped_attention
