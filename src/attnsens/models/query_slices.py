"""Decoder layers run a slice of queries at a time, so that a long input never holds one layer's widest activations.

Everything in a causal decoder layer except the attention itself maps each token on its own (norms, projections,
rotary embedding, the output projection, residual adds, the MLP), and the attention of the queries in [start,
stop) reads only the keys and values of the tokens before stop. So a layer can run on consecutive slices of its
tokens, in order, if the keys and values of the slices before are kept: the audit's attention tap keeps them
(``SliceBuffers``) and computes each slice's rows and output from them, the layer's own code does the rest on
the slice. At 8,192 tokens SmolLM2's layer otherwise holds about a dozen [8192, 576] float32 tensors at once (the
residual stream, the norms' temporaries, the queries and their rotary temporaries, the layer's output).

Only layers called the way a causal decoder's model calls them are sliced: one hidden-state tensor [batch, n, d]
(by position or as ``hidden_states``; further positional arguments None), no attention mask (the attention's own
causal pattern, as sdpa gets it without padding), no cache, and per-token keyword tensors the module knows how to
slice (``position_embeddings``, ``position_ids``, ``cache_position``). Any other call runs as the layer's own
single call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnsens.models.tokenwise import forwards_replaced

QUERY_SLICE = 1024
"""Queries per slice of a layer: at 8,192 tokens SmolLM2's layer then holds its temporaries for 1,024 tokens."""

_PER_TOKEN = {"position_ids": 1, "cache_position": 0}
"""Keyword tensors of a decoder layer's call that hold one entry per token, and the dimension of the tokens."""
_EMPTY_WHEN_SLICED = ("attention_mask", "cache", "past_key_values", "past_key_value", "layer_past", "use_cache")
"""Keywords a sliced call must leave empty (None or False): a mask or cache would change what a slice attends."""


@dataclass(frozen=True)
class QuerySlice:
    """The queries [start, stop) of a layer called on n tokens, run now."""

    start: int
    stop: int
    n: int


_current: QuerySlice | None = None
_buffers: SliceBuffers | None = None
_answered = 0  # slices whose attention the tap has computed, in the slice running now


def current() -> QuerySlice | None:
    """The slice a sliced layer is running now (None outside one)."""
    return _current


def answered() -> None:
    """Called by the tap once it has computed the attention of the slice running now."""
    global _answered
    _answered += 1


class SliceBuffers:
    """Keys and values of every token of the layer running in slices, filled slice by slice (a slice's rows need
    its own queries only).

    One set of zero-initialised buffers per shape serves every layer in turn: a slice's rows read the keys and
    values below its stop only, and entries above it hold zeros or an earlier layer's finite numbers, never
    garbage that a masked key (probability exactly 0) could turn into NaN."""

    def __init__(self) -> None:
        self._held: dict[tuple[Any, ...], Tensor] = {}

    def fill(self, name: str, part: Tensor, piece: QuerySlice) -> Tensor:
        """The buffer ``name`` [batch, head, n, d] with ``part`` [batch, head, stop − start, d] written at the
        slice's tokens."""
        shape = (*part.shape[:2], piece.n, *part.shape[3:])
        key = (name, shape, part.dtype, part.device)
        buffer = self._held.get(key)
        if buffer is None:
            buffer = self._held[key] = part.new_zeros(shape)
        buffer[:, :, piece.start : piece.stop] = part
        return buffer


def buffers() -> SliceBuffers:
    """The buffers of the layers running in slices (inside :func:`in_query_slices` only)."""
    if _buffers is None:
        raise RuntimeError("query slice buffers are used outside in_query_slices")
    return _buffers


@contextlib.contextmanager
def in_query_slices(
    layers: Sequence[torch.nn.Module], tokens: int | None = None, *, overwrite: bool = False
) -> Iterator[None]:
    """While active, each of ``layers`` called on more than ``tokens`` tokens the way a causal decoder's model
    calls it (module docstring) runs on consecutive slices of ``tokens`` queries, in order, each slice's output
    written into one [batch, n, d] tensor. The attention inside must be tapped by a callback that computes each
    slice's output from :func:`buffers` (the audit's tap does). ``tokens`` defaults to ``QUERY_SLICE``.

    With ``overwrite``, that tensor is the layer's input wherever the input has storage of its own
    (``_overwritable``): once a slice has run, nothing in the layer reads its input rows again (later slices read
    their own rows, and the keys and values from :func:`buffers`), so a stack of layers then holds one
    [batch, n, d] residual stream instead of an input and an output beside the embeddings. Only for a caller that
    reads no layer's input after the layer: a causal decoder's model, which passes each layer's output to the next
    and keeps nothing else of it (nor of the embeddings, for the next layers) while the layers run."""
    global _buffers
    width = QUERY_SLICE if tokens is None else tokens
    outer = _buffers
    _buffers = outer or SliceBuffers()
    try:
        with forwards_replaced(layers, lambda forward: _in_slices(forward, width, overwrite)):
            yield
    finally:
        _buffers = outer


def _sliceable(hidden: Any, args: tuple[Any, ...], kwargs: dict[str, Any], tokens: int) -> bool:
    if any(arg is not None for arg in args):  # GPT-2's blocks take their empty cache and mask by position
        return False
    if not isinstance(hidden, Tensor) or hidden.ndim != 3 or hidden.shape[1] <= tokens:
        return False
    n = hidden.shape[1]
    for name, value in kwargs.items():
        if name in _EMPTY_WHEN_SLICED:
            if value is not None and value is not False:
                return False
        elif name == "position_embeddings":
            if not (isinstance(value, tuple | list) and all(isinstance(v, Tensor) and v.shape[1] == n for v in value)):
                return False
        elif name in _PER_TOKEN:
            if not isinstance(value, Tensor) or value.shape[_PER_TOKEN[name]] != n:
                return False
        elif isinstance(value, Tensor):
            return False  # a tensor whose tokens (if any) this module does not know
    return True


def _sliced_kwargs(kwargs: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    out = dict(kwargs)
    for name, value in kwargs.items():
        if name == "position_embeddings":
            out[name] = tuple(v[:, start:stop] for v in value)
        elif name in _PER_TOKEN:
            out[name] = value.narrow(_PER_TOKEN[name], start, stop - start)
    return out


def _in_slices(forward: Callable[..., Any], tokens: int, overwrite: bool) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        global _current, _answered
        by_name = not args  # the hidden states passed as ``hidden_states=``
        hidden = kwargs.pop("hidden_states", None) if by_name else args[0]
        rest = args[1:]
        if _current is not None or not _sliceable(hidden, rest, kwargs, tokens):
            return forward(hidden_states=hidden, **kwargs) if by_name else forward(hidden, *rest, **kwargs)
        n = hidden.shape[1]
        out = None
        for start in range(0, n, tokens):
            stop = min(n, start + tokens)
            part_kwargs = _sliced_kwargs(kwargs, start, stop)
            _current = QuerySlice(start, stop, n)
            _answered = 0
            try:
                if by_name:
                    part = forward(hidden_states=hidden[:, start:stop], **part_kwargs)
                else:
                    part = forward(hidden[:, start:stop], *rest, **part_kwargs)
            finally:
                _current = None
            if _answered != 1:  # its attention ran past the tap, on this slice's keys alone
                raise RuntimeError(f"a layer run in query slices computed {_answered} attention calls through the "
                                   "tap in one slice, not one")  # fmt: skip
            states, extra = _hidden_states_of(part, hidden.shape[0], stop - start)
            if out is None:
                in_place = overwrite and _overwritable(hidden, states)
                out = hidden if in_place else states.new_empty(hidden.shape[0], n, states.shape[2])
            out[:, start:stop] = states
            del part, states
        # transformers 4's decoder layers return a tuple: (hidden states,) and Nones for the weights and cache.
        return out if extra is None else (out, *extra)

    return run


def _overwritable(hidden: Tensor, states: Tensor) -> bool:
    """Whether a sliced layer's output ``states`` may be written over its input ``hidden``: a tensor with storage
    of its own (not a view, which may be of a parameter or of some other tensor), of the output's width and dtype,
    outside autograd."""
    return (
        hidden._base is None
        and hidden.is_contiguous()
        and not hidden.requires_grad
        and not isinstance(hidden, torch.nn.Parameter)
        and hidden.dtype == states.dtype
        and hidden.shape[2] == states.shape[2]
    )


def _hidden_states_of(part: Any, batch: int, width: int) -> tuple[Tensor, tuple[None, ...] | None]:
    """(hidden states, the Nones after them in a tuple or None for a plain tensor) of one slice's output."""
    states, extra = (part[0], tuple(part[1:])) if isinstance(part, tuple | list) and part else (part, None)
    if (
        not isinstance(states, Tensor)
        or tuple(states.shape[:2]) != (batch, width)
        or any(item is not None for item in extra or ())
    ):
        raise RuntimeError(f"{type(part).__name__} from a sliced layer: expected its [batch, slice, d] hidden states")
    return states, extra
