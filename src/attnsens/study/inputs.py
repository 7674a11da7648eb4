"""What an audit reads: text or token ids as model inputs, the same in ``attnsens.study.audit`` and ``attnsens audit``.

``model_inputs`` tokenizes text, cuts text and token streams into windows of a model's context (each window a
well-formed model input with the tokenizer's special tokens), checks padding masks, and, without a window length,
chooses the longest one that the model's own forward pass can hold in memory (``window_length``).
``leading_tokens`` is the one sequence ``bound_model`` is evaluated on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from attnsens.capture import RowSelection
from attnsens.errors import InputError
from attnsens.models import ModelAdapter

Note = Callable[[str], None]
"""``note(message)``: told of a choice made for the caller (a window shortened to fit in memory)."""


def print_note(message: str) -> None:
    """``note: message`` on stderr: the default ``Note``."""
    print(f"note: {message}", file=sys.stderr)


def model_inputs(
    adapter: ModelAdapter,
    tokens: Tensor | str | Sequence[str],
    *,
    attention_mask: Tensor | None = None,
    seq_len: int | None = None,
    n_sequences: int | None = None,
    name: str | None = None,
    note: Note = print_note,
) -> tuple[Tensor, Tensor | None]:
    """The [batch, n] int64 token ids and padding mask (None: no padding) ``audit`` reads (see its arguments): text
    and ids without a mask as ``token_windows`` cuts them; for a float [batch, channel, H, W] or [channel, H, W]
    tensor, a vision model's images, checked by the adapter."""
    if isinstance(tokens, Tensor) and tokens.is_floating_point() and tokens.ndim in (3, 4):
        if attention_mask is not None or seq_len is not None:
            raise InputError("images are audited whole: drop attention_mask and seq_len")
        pixels = adapter.check_input_ids(tokens if tokens.ndim == 4 else tokens.unsqueeze(0))
        return pixels[:n_sequences], None
    if isinstance(tokens, list | tuple) and any(isinstance(item, str) for item in tokens):
        if attention_mask is not None or seq_len is not None:
            raise InputError("a list of texts is padded to its longest text; drop attention_mask and seq_len")
        if not all(isinstance(item, str) and item.strip() for item in tokens):
            raise InputError("every item of a list of texts to audit must be a non-empty string")
        texts = list(tokens)[:n_sequences] if n_sequences is not None else list(tokens)
        ids, mask = adapter.encode_batch(texts, max_length=adapter.spec.max_positions)
        return split_sequences(adapter, ids), _checked_mask(mask, ids)
    if attention_mask is None:
        windows = token_windows(adapter, tokens, seq_len=seq_len, n_sequences=n_sequences, name=name, note=note)
        return windows, None
    if seq_len is not None:
        raise InputError("seq_len cuts a token stream into windows; with an attention_mask give [batch, n] as is")
    ids = split_sequences(adapter, tokens, n_sequences=n_sequences)
    return ids, _checked_mask(attention_mask, ids)


def token_windows(
    adapter: ModelAdapter,
    tokens: Tensor | str | Sequence[Any],
    *,
    seq_len: int | None = None,
    n_sequences: int | None = None,
    name: str | None = None,
    note: Note = print_note,
) -> Tensor:
    """The [batch, n] int64 token ids of unpadded text or ids: text and a 1-D stream cut into consecutive windows of
    ``seq_len`` tokens (``split_sequences``), each row of a [batch, n] tensor cut to its first ``seq_len``; the first
    ``n_sequences`` of them, and an InputError naming the input ``name`` (default "the text" or "the token ids")
    when there are fewer.

    Without ``seq_len``: the text (``text_seq_len``) or the ids' length, at most the context and at most
    ``window_length``'s limit."""
    ids = None if isinstance(tokens, str) else token_ids(adapter, tokens)
    if ids is not None:
        available = min(ids.shape[-1], adapter.spec.max_positions)
    else:
        available = seq_len if seq_len is not None else text_seq_len(adapter, str(tokens))
    seq_len = window_length(adapter, seq_len, available, note=note)
    if ids is not None and ids.ndim == 2:  # sequences of their own: each cut to seq_len, never joined
        seq_len = min(seq_len, ids.shape[1])
        windows = split_sequences(adapter, ids[:, :seq_len], n_sequences=n_sequences)
    else:
        windows = split_sequences(adapter, tokens if ids is None else ids, seq_len=seq_len, n_sequences=n_sequences)
    if n_sequences is not None and len(windows) < n_sequences:
        what = name or ("the text" if ids is None else "the token ids")
        raise InputError(
            f"{what} gives {len(windows)} sequence(s) of {seq_len} tokens, fewer than --batch {n_sequences}; "
            f"use --batch {len(windows)}, a shorter --seq-len or more {'text' if ids is None else 'ids'}"
        )
    return windows


def window_length(adapter: ModelAdapter, seq_len: int | None, available: int, *, note: Note = print_note) -> int:
    """``seq_len``, or without it ``available`` tokens, checked against what the model's own forward pass holds for
    one layer's attention scores (``ModelAdapter.forward_score_bytes``): a ``seq_len`` beyond half of this machine's
    memory is refused, the default shortened to fit (and ``note`` told so)."""
    from attnsens._memory import longest_in_memory, memory_budget

    limit = longest_in_memory(lambda n: adapter.forward_score_bytes(1, n), adapter.spec.max_positions)
    if seq_len is None:
        if limit is not None and available > limit:
            note(
                f"auditing windows of {limit:,} tokens: {adapter.name}'s forward pass holds each layer's attention "
                f"scores at once, and longer ones would not fit in half of this machine's memory (its context is "
                f"{adapter.spec.max_positions:,}); --seq-len chooses another length"
            )
            return limit
        return available
    if limit is not None and seq_len > limit:
        needed = adapter.forward_score_bytes(1, seq_len)
        raise InputError(
            f"--seq-len {seq_len} needs about {needed / 2**30:.1f} GiB for the attention scores that "
            f"{adapter.name}'s forward pass holds for one layer ({adapter.spec.n_head} heads × n²), more than half "
            f"of this machine's memory ({2 * memory_budget() / 2**30:.0f} GiB); use --seq-len {limit} or less"
        )
    return seq_len


def leading_tokens(
    adapter: ModelAdapter, tokens: Tensor | str, *, seq_len: int, name: str | None = None, note: Note = print_note
) -> Tensor:
    """[1, n] int64 ids of the first n ≤ ``seq_len`` tokens of a text (encoded with its special tokens) or of a
    [n] or [batch, n] tensor's first sequence: the sequence ``bound_model`` is evaluated on. At least 2 tokens
    (InputError naming the input ``name``, default "the text" or "the token ids"); ``note`` is told when there are
    fewer than ``seq_len``."""
    if isinstance(tokens, str):
        ids = adapter.encode(tokens, max_length=seq_len)
        given, more = name or "the text", "--text with more text"
    else:
        ids = split_sequences(adapter, (tokens if tokens.ndim == 1 else tokens[0])[:seq_len])
        given, more = name or "the token ids", "more ids"
    if ids.shape[1] < 2:
        raise InputError(f"{given} gives {ids.shape[1]} token(s); give {more}, at least 2 tokens")
    if ids.shape[1] < seq_len:
        note(
            f"{given} gives {ids.shape[1]} tokens, fewer than --seq-len {seq_len}; bounding those (give {more} for a "
            "longer sequence)"
        )
    return ids


def split_sequences(
    adapter: ModelAdapter,
    tokens: Tensor | str | Sequence[Any],
    *,
    seq_len: int | None = None,
    n_sequences: int | None = None,
) -> Tensor:
    """The [batch, n] int64 token ids of unpadded ``tokens``, as given: the whole text (with its special tokens) or
    a [batch, n] tensor as one sequence a row, or, with ``seq_len``, the text or all the ids as one stream cut into
    consecutive windows of ``seq_len`` tokens (text windows get the tokenizer's special tokens in every window);
    the first ``n_sequences``."""
    if isinstance(tokens, str):
        if not tokens.strip():
            raise InputError("the text to audit is empty; give a file or corpus with some text")
        if seq_len is None:
            tokens = adapter.encode(tokens)[0]
        else:
            _check_seq_len(adapter, seq_len)
            return _text_windows(adapter, tokens, seq_len=seq_len, n_sequences=n_sequences)
    ids = token_ids(adapter, tokens)
    if seq_len is not None:
        _check_seq_len(adapter, seq_len)
        stream = ids.reshape(-1)
        count = stream.numel() // seq_len
        if count == 0:
            raise InputError(
                f"the input has {stream.numel()} tokens, fewer than seq_len {seq_len}; "
                "give more text or a shorter seq_len"
            )
        ids = stream[: count * seq_len].reshape(count, seq_len)
    elif ids.ndim == 1:
        ids = ids.unsqueeze(0)
    if n_sequences is not None:
        if n_sequences < 1:
            raise InputError(f"n_sequences must be >= 1, got {n_sequences}")
        ids = ids[:n_sequences]
    return ids.to(torch.long)


def token_ids(adapter: ModelAdapter, tokens: Tensor | Sequence[Any]) -> Tensor:
    """``tokens`` as a [n] or [batch, n] integer tensor of ids in the model's vocabulary (InputError otherwise)."""
    try:
        ids = torch.as_tensor(tokens)
    except (TypeError, ValueError, RuntimeError) as err:
        raise InputError(f"tokens must be text or integer token ids, got {type(tokens).__name__} ({err})") from err
    if ids.ndim not in (1, 2) or ids.numel() == 0:
        raise InputError(f"tokens must be a non-empty [n] stream or [batch, n] tensor, got shape {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise InputError(f"tokens must be integer token ids, got dtype {ids.dtype}; pass a torch.long tensor")
    low, high, vocab = int(ids.min()), int(ids.max()), adapter.spec.vocab_size
    if low < 0 or high >= vocab:
        raise InputError(
            f"token ids must lie in [0, {vocab}) for {adapter.name!r} (its vocabulary), got ids in [{low}, {high}]; "
            "encode with the model's own tokenizer"
        )
    return ids


def text_seq_len(adapter: ModelAdapter, text: str) -> int:
    """Tokens of ``text`` with the tokenizer's special tokens, at most the model's context: the ``seq_len`` that
    audits one window of all of a short text, or as much of a long one as the context holds. A long text is
    tokenized only that far (the 5 MB Shakespeare corpus whole took 6.6 s for SmolLM2's tokenizer)."""
    if not text.strip():
        raise InputError("the text to audit is empty; give a file or corpus with some text")
    prefix, suffix = adapter.special_tokens()
    context = adapter.spec.max_positions
    tokens = _encode_prefix(adapter, text, max(context - len(prefix) - len(suffix), 1)).numel()
    return min(context, tokens + len(prefix) + len(suffix))


def _check_seq_len(adapter: ModelAdapter, seq_len: int) -> None:
    if seq_len < 1:
        raise InputError(f"seq_len must be >= 1, got {seq_len}")
    if seq_len > adapter.spec.max_positions:
        raise InputError(
            f"seq_len {seq_len} exceeds the context of {adapter.name!r} ({adapter.spec.max_positions} positions); "
            f"use --seq-len {adapter.spec.max_positions} or less"
        )


def _text_windows(adapter: ModelAdapter, text: str, *, seq_len: int, n_sequences: int | None) -> Tensor:
    """``text`` as windows of ``seq_len`` tokens: prefix specials + consecutive tokens of the text + suffix."""
    prefix, suffix = adapter.special_tokens()
    content = seq_len - len(prefix) - len(suffix)
    if content < 1:
        raise InputError(
            f"seq_len {seq_len} leaves no room for text beside the {len(prefix) + len(suffix)} special tokens "
            f"of {adapter.name!r}'s tokenizer; use a longer seq_len"
        )
    needed = None if n_sequences is None else content * n_sequences
    stream = _encode_prefix(adapter, text, needed)
    if stream.numel() < content:
        count = stream.numel()
        raise InputError(
            f"the text has {count} token{'s' if count != 1 else ''}, fewer than the {content} of one window: "
            f"seq_len {seq_len} less the {len(prefix) + len(suffix)} special tokens of the tokenizer of "
            f"{adapter.name!r}; give more text or a shorter seq_len"
        )
    windows = split_sequences(adapter, stream, seq_len=content, n_sequences=n_sequences)
    around = [torch.tensor(ids, dtype=torch.long).expand(windows.shape[0], -1) for ids in (prefix, suffix)]
    return split_sequences(adapter, torch.cat([around[0], windows, around[1]], dim=1), seq_len=None)


def _encode_prefix(adapter: ModelAdapter, text: str, needed: int | None) -> Tensor:
    """Token stream of ``text`` without special tokens, or of a prefix of it long enough for ``needed`` tokens
    (large corpora)."""
    if needed is None:
        return adapter.encode(text, special_tokens=False)[0]
    chars = 8 * needed
    while True:
        tokens = adapter.encode(text[:chars], special_tokens=False)[0]
        if tokens.numel() > needed or chars >= len(text):
            return tokens
        chars *= 4


def _checked_mask(attention_mask: Any, ids: Tensor) -> Tensor | None:
    """The padding mask as int64 [batch, n] (None when nothing is padded), each row's tokens contiguous."""
    mask = torch.as_tensor(attention_mask)
    if mask.ndim == 1:
        mask = mask.unsqueeze(0)
    mask = mask[: ids.shape[0]]
    if mask.shape != ids.shape:
        raise InputError(f"attention_mask shape {tuple(mask.shape)} must equal the tokens' shape {tuple(ids.shape)}")
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise InputError("attention_mask must hold 1 for tokens and 0 for padding only")
    mask = mask.to(torch.long)
    counts = mask.sum(dim=1)
    if bool((counts == 0).any()):
        raise InputError(f"sequences {(counts == 0).nonzero().flatten().tolist()} are all padding; drop them")
    if bool(((mask[:, 1:] != mask[:, :-1]).sum(dim=1) > 1).any()):  # one 0/1 edge at most: left or right padding
        raise InputError("each sequence's tokens must be contiguous (left or right padding) in attention_mask")
    return None if bool((counts == mask.shape[1]).all()) else mask


def real_positions(selection: RowSelection, mask: Tensor | None, index: int) -> RowSelection:
    """``selection`` narrowed to sequence ``index``'s real (unpadded) query positions."""
    if mask is None:
        return selection
    real = mask[index].nonzero().flatten()
    first, stop = int(real[0]), int(real[-1]) + 1
    start = max(selection.query_start, first)
    stop = stop if selection.query_stop is None else min(selection.query_stop, stop)
    if stop <= start:
        raise InputError(
            f"sequence {index} has no real token in the selected query positions [{selection.query_start}, "
            f"{selection.query_stop}); its tokens are at [{first}, {int(real[-1]) + 1})"
        )
    return replace(selection, query_start=start, query_stop=stop)
