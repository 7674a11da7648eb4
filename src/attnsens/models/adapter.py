"""The model adapter: one object per loaded model exposing normalized weights, layer inputs and attention rows.

Family modules (layouts with its BLOOM, Falcon and MPT taps, interface, own_gpt) subclass :class:`ModelAdapter`
and supply: the normalized :class:`~attnsens.weights.LayerWeights`, a forward pass, a *query/key tap* — a context
manager that calls ``on_query_key(layer, query, key, call)`` with every layer's queries and keys (after any rotary
embedding) while the model runs — and taps on each layer's inputs and outputs, which the weights-fidelity gate
(models/fidelity.py) compares with the reference forward. Everything else (streaming rows, layer inputs) is
written once here.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnsens.errors import ConfigError, InputError, ShapeError, UnsupportedModelError, WeightsChangedError
from attnsens.models.attention import AttentionCall, chunked_rows, key_padding_mask_of
from attnsens.weights import LayerWeights, NormKind, Placement, RotaryConfig

OUTPUT_FIELDS = ("attention_output", "mlp_output", "block_output")
"""What ``layer_output_taps`` reports for every layer."""
NORMED_OUTPUT_FIELDS = ("normed_attention_output", "normed_mlp_output")
"""What ``layer_output_taps`` also reports for a layer with norms after its sublayers (``LayerWeights.attn_out_norm``,
``mlp_out_norm``): the output of each such norm, i.e. what the sublayer adds to the residual stream."""

QueryKeyCallback = Callable[[int, Tensor, Tensor, AttentionCall], Tensor | None]
"""``on_query_key(layer, query [batch, head, query, d_head], key [batch, kv_head, key, d_head], call)``: the
call's τ, mask, softcap and sinks are those the layer used (models/attention.AttentionCall). A callback returns
None, or, where the call carries the layer's ``value``, the layer's attention output to use in place of its own.
A callback that has every layer it needs may raise :class:`StopForward`: ``ModelAdapter.forward_until_stopped``
then ends the pass there."""


class StopForward(Exception):
    """Raised by a query/key callback once it has every layer it needs, so that the layers after it never run:
    ``ModelAdapter.forward_until_stopped`` ends the forward pass there (an audit of the first two layers of a
    30-layer model runs two layers, not thirty)."""


def _stopped(error: BaseException) -> bool:
    """Whether ``error`` is a StopForward, or an exception a model wrapper raised from one (``raise … from``)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, StopForward):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Architecture facts every consumer needs, independent of the model family."""

    n_layer: int
    n_head: int
    n_kv_head: int
    d_model: int
    d_head: int
    max_positions: int
    vocab_size: int
    placement: Placement
    norm: NormKind | None
    causal: bool
    rotary: RotaryConfig | None = None
    attention: tuple[str, ...] = ()
    """Per layer of an encoder-decoder, which attention it is: ``"encoder"`` (the encoder's self-attention),
    ``"decoder"`` (the decoder's) or ``"cross"`` (decoder queries on the encoder's keys); empty for a model of one
    stack, whose every layer is self-attention."""

    def __post_init__(self) -> None:
        if self.n_layer < 1 or self.n_head < 1 or self.n_kv_head < 1 or self.d_head < 1:
            raise ConfigError(
                f"model spec needs positive sizes, got n_layer={self.n_layer}, n_head={self.n_head}, "
                f"n_kv_head={self.n_kv_head}, d_head={self.d_head}"
            )
        if self.n_head % self.n_kv_head:
            raise ConfigError(f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")


@dataclass(frozen=True, kw_only=True)
class LayerInputs:
    """Residual-stream tensors of one layer for one forward pass, each ``[batch, query, d_model]``.

    ``attention_input`` is what W_q, W_k, W_v act on (the N1 output for pre-LN, the block input for post-LN);
    ``mlp_input`` is what the MLP acts on. For post-LN layers ``attention_residual_sum`` = X + Attn(X) and
    ``mlp_residual_sum`` = X' + MLP(X') are the sums entering the norms; they are None otherwise.
    """

    layer: int
    block_input: Tensor
    attention_input: Tensor
    mlp_input: Tensor
    attention_residual_sum: Tensor | None = None
    mlp_residual_sum: Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class AttentionChunk:
    """Attention rows of some heads and query positions of one layer.

    ``probs`` is float32 ``[batch, head, query, key]``; masked keys are exact zeros. ``query_positions`` is
    ``[batch, query]`` (0-based positions of the rows), ``heads`` the 0-based query heads of dimension 1.
    """

    layer: int
    heads: tuple[int, ...]
    query_positions: Tensor
    probs: Tensor
    n_keys: Tensor  # [batch, query]: allowed keys of each row


@dataclass(frozen=True, kw_only=True)
class MoEModules:
    """One layer's mixture of experts as the model's own modules, which the weights-fidelity gate calls one at a
    time (``models/fidelity.py``): ``router`` maps x [n, d_model] to (logits [n, expert], gate weights [n, top_k],
    indices [n, top_k]); ``experts`` maps (x, indices [n, j], weights [n, j]) to Σ_j weight · E_index(x); the shared
    expert maps x to its output and its gate to the logit [n, 1] of its sigmoid. ``output_scale`` is the factor the
    block multiplies the MoE's output by (Granite-MoE's residual multiplier), folded into the normalized experts."""

    router: torch.nn.Module
    experts: torch.nn.Module
    shared: torch.nn.Module | None = None
    shared_gate: torch.nn.Module | None = None
    output_scale: float = 1.0


class ModelAdapter(ABC):
    """A loaded model seen through attnsens: normalized weights, layer inputs and streamed attention rows."""

    family: str = ""

    def __init__(self, module: torch.nn.Module, *, name: str, spec: ModelSpec) -> None:
        self.module = module
        self.name = name
        self.spec = spec
        self._layers: Sequence[LayerWeights] | None = None
        self._read_state: dict[str, tuple[Tensor, int, int]] = {}

    def __repr__(self) -> str:
        s = self.spec
        return (
            f"{type(self).__name__}(name={self.name!r}, family={self.family!r}, n_layer={s.n_layer}, "
            f"n_head={s.n_head}, n_kv_head={s.n_kv_head}, d_model={s.d_model}, placement={s.placement!r})"
        )

    def forward_score_bytes(self, batch: int, n: int) -> int:
        """Bytes the model's own forward pass holds at once for one layer's attention scores of ``batch``
        sequences of ``n`` tokens, which no chunking of the audit bounds: 0 where the model's attention runs
        through attnsens' chunked rows or a fused kernel; a model that computes every [n, n] score itself says
        so (``OwnGPTAdapter``)."""
        return 0

    @property
    def layers(self) -> Sequence[LayerWeights]:
        """Normalized weights of every layer (read once, detached, on the model's device). Each parameter's
        identity, version counter and storage are recorded as they are read; :meth:`check_weights_unchanged`
        compares them with the module's at bound time."""
        if self._layers is None:
            with torch.no_grad():
                state = _parameter_state(self.module)
                self._layers = self.read_layers()
            self._read_state = state
        return self._layers

    def reread_layers(self) -> Sequence[LayerWeights]:
        """Read the normalized weights again from the module as it is now (after a deliberate edit of its
        parameters), recording their versions anew."""
        self._layers = None
        return self.layers

    def check_weights_unchanged(self) -> None:
        """Refuse normalized weights read before the module's parameters changed: a parameter replaced, assigned
        new storage (``.data =``) or modified in place (its version counter moved, as every in-place torch
        operation does) since :attr:`layers` read them. An edit through ``.data`` moves no counter; the
        weights-fidelity gate's identification pass, which compares the normalized weights with the module as it
        is, sees those.

        Raises:
            WeightsChangedError: naming the first changed parameter and the fix.
        """
        if self._layers is None:
            return
        now = _parameter_state(self.module)
        for name, (tensor, version, pointer) in self._read_state.items():
            seen = now.get(name)
            if seen is None or seen[0] is not tensor or seen[1] != version or seen[2] != pointer:
                how = "was removed" if seen is None else "was replaced" if seen[0] is not tensor else "changed"
                raise WeightsChangedError(
                    f"parameter {name!r} of {self.name!r} {how} after attnsens read its weights, so they no longer "
                    "describe the model; load the model again (attnsens.models.load) or call "
                    "adapter.reread_layers() after editing it"
                )
        added = sorted(set(now) - set(self._read_state))
        if added:
            raise WeightsChangedError(
                f"parameter {added[0]!r} of {self.name!r} was added after attnsens read its weights; load the model "
                "again (attnsens.models.load) or call adapter.reread_layers() after editing it"
            )

    @property
    def device(self) -> torch.device:
        """Where the model's inputs go: its first parameter's device, or, where that parameter is offloaded (a
        meta tensor until its block runs), the device the model computes on (``models.offload``)."""
        from attnsens.models.offload import execution_device

        return execution_device(self.module)

    # --- what a family supplies -------------------------------------------------------------------------------

    @abstractmethod
    def read_layers(self) -> Sequence[LayerWeights]:
        """The model's parameters converted to the normalized layout (attnsens/weights.py)."""

    @abstractmethod
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> None:
        """Run the model once on ``input_ids`` [batch, n] (no cache, no gradients required)."""

    def forward_until_stopped(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> bool:
        """``forward``, ended early where an active query/key tap's callback raises StopForward; True if it was.

        The layers before the stop ran in full (their queries and keys were reported); nothing after it ran."""
        try:
            self.forward(input_ids, attention_mask)
        except Exception as error:
            if not _stopped(error):
                raise
            return True
        return False

    @abstractmethod
    def query_key_tap(self, on_query_key: QueryKeyCallback) -> contextlib.AbstractContextManager[None]:
        """While active, every attention layer reports its queries and keys (after rotary) to ``on_query_key``."""

    @abstractmethod
    def layer_input_taps(
        self, record: Callable[[int, str, Tensor], Tensor | None]
    ) -> contextlib.AbstractContextManager[None]:
        """While active, report each layer's residual tensors to ``record(layer, field, tensor)``.

        ``field`` is one of the LayerInputs field names. Where ``record`` returns a tensor for ``attention_input``
        or ``mlp_input``, the sublayer runs on it in place of its own input (same shape and type): the
        weights-fidelity gate feeds each sublayer random inputs this way (models/fidelity.py).
        """

    @abstractmethod
    def layer_output_taps(self, record: Callable[[int, str, Tensor], None]) -> contextlib.AbstractContextManager[None]:
        """While active, report each layer's own outputs to ``record(layer, field, tensor)``.

        ``field`` is one of :data:`OUTPUT_FIELDS`: the attention sublayer's output (after W_O and its bias, before
        any norm after it and the residual sum), the MLP's output (likewise) and the block's output; a family whose
        blocks apply a norm to a sublayer's output also reports that norm's output (:data:`NORMED_OUTPUT_FIELDS`).
        The weights-fidelity gate (models/fidelity.py) compares them with the reference forward of the normalized
        weights.
        """

    def tokenwise_modules(self) -> list[torch.nn.Module]:
        """Modules that transform each token's hidden state on its own, one tensor [batch, n, d] in and one out:
        each block's whole MLP where it is one module. The audit runs them a slice of tokens at a time
        (:func:`attnsens.models.tokenwise.in_token_chunks`), so that a long input never holds its [n, d_ff]
        activations at once. None by default."""
        return []

    def moe_modules(self, layer: int) -> MoEModules | None:
        """The modules of layer ``layer``'s mixture of experts, None where its MLP is dense (the default)."""
        return None

    @property
    def not_bounded(self) -> str | None:
        """What of the model its layers leave out, in one line (a hybrid's Mamba blocks, a branch beside the
        attention), for the commands to print; None where the layers are the whole model (the default)."""
        return None

    def query_sliceable_layers(self) -> list[torch.nn.Module]:
        """Blocks that may run a slice of queries at a time (:func:`attnsens.models.query_slices.in_query_slices`)
        while the audit reduces every row: causal decoder blocks whose attention the audit's tap computes. None
        by default."""
        return []

    def attention_window(self, layer: int) -> int | None:
        """The sliding window of ``layer``'s attention (keys t − window < j ≤ t), None for full attention."""
        return None

    def encode(self, text: str, *, max_length: int | None = None, special_tokens: bool = True) -> Tensor:
        """Token ids ``[1, n]`` of ``text`` with the model's tokenizer (truncated to ``max_length``), with the
        special tokens the tokenizer adds to one input ([CLS] … [SEP], BOS) unless ``special_tokens`` is False."""
        raise InputError(f"model {self.name!r} has no tokenizer; pass token ids instead of text")

    def special_tokens(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids the tokenizer puts before and after the tokens of one input (BERT: ([CLS],), ([SEP],))."""
        return (), ()

    pad_token_id: int = 0
    padding_side: str = "right"

    def encode_batch(self, texts: Sequence[str], *, max_length: int | None = None) -> tuple[Tensor, Tensor]:
        """``(input_ids, attention_mask)`` [batch, n] of several texts, each encoded as one input and padded on
        ``padding_side`` with ``pad_token_id`` to the longest (mask 1 = token, 0 = padding)."""
        encoded = [self.encode(text, max_length=max_length)[0] for text in texts]
        n = max(ids.numel() for ids in encoded)
        input_ids = torch.full((len(encoded), n), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(encoded), n), dtype=torch.long)
        for row, ids in enumerate(encoded):
            span = slice(n - ids.numel(), n) if self.padding_side == "left" else slice(0, ids.numel())
            input_ids[row, span], attention_mask[row, span] = ids, 1
        return input_ids, attention_mask

    # --- shared machinery ---------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def inference(self) -> Iterator[None]:
        """No gradients and eval mode (no dropout) for the duration; the module's training mode is restored."""
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.module.train(was_training)

    def check_input_ids(self, input_ids: Tensor) -> Tensor:
        """``input_ids`` as a LongTensor [batch, n] on the model's device; InputError naming the fix otherwise."""
        if not isinstance(input_ids, Tensor):
            raise InputError(f"input_ids must be a LongTensor [batch, n], got {type(input_ids).__name__}")
        if input_ids.ndim == 1:
            input_ids = input_ids.unsqueeze(0)
        if input_ids.ndim != 2 or input_ids.shape[1] == 0:
            raise ShapeError(f"input_ids must be [batch, n] with n ≥ 1, got shape {tuple(input_ids.shape)}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise InputError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
        n = input_ids.shape[1]
        if n > self.spec.max_positions:
            raise InputError(
                f"sequence length {n} exceeds the context of {self.name!r} ({self.spec.max_positions} positions); "
                f"use a shorter --seq-len"
            )
        return input_ids.to(self.device, torch.long)

    def layer_inputs(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> list[LayerInputs]:
        """The residual-stream inputs of every layer for one forward pass on ``input_ids`` [batch, n]."""
        input_ids = self.check_input_ids(input_ids)
        found: dict[int, dict[str, Tensor]] = {i: {} for i in range(self.spec.n_layer)}

        def record(layer: int, field: str, tensor: Tensor) -> None:
            found[layer][field] = tensor.detach()

        with self.inference(), self.layer_input_taps(record):
            self.forward(input_ids, attention_mask)
        return [LayerInputs(layer=i, **found[i]) for i in range(self.spec.n_layer)]

    def stream_attention(
        self,
        input_ids: Tensor,
        *,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        query_positions: Tensor | None = None,
        attention_mask: Tensor | None = None,
        chunk_size: int = 128,
    ) -> Iterator[AttentionChunk]:
        """Attention rows of the selected layers, heads and queries, in chunks of ``chunk_size`` queries.

        One forward pass keeps the (post-rotary) queries and keys of the selected layers — O(layers · n · d_model)
        memory, the size of the hidden states — and rows are recomputed in float32 one chunk at a time
        (docs/math.md A5), so at most one chunk ``[batch, head, chunk_size, n]`` of probabilities exists at once.
        For reduction inside the forward pass without keeping any queries, use attnsens.capture.

        Args:
            input_ids: token ids [batch, n].
            layers, heads: 0-based selections (default: all).
            query_positions: [batch, query] or [query] positions to recompute (default: all n).
            attention_mask: optional [batch, n] padding mask (1 = token, 0 = padding).
            chunk_size: queries per chunk.

        Raises:
            InputError, ShapeError, ConfigError: at the call, before any chunk is produced (bad ids, a sequence
                longer than the context, a selection out of range or naming a layer or head twice).
        """
        input_ids = self.check_input_ids(input_ids)
        layer_list = self.select_layers(layers)
        head_list = self.select_heads(heads)
        positions = self.query_positions_of(input_ids, query_positions)
        return self._attention_chunks(input_ids, layer_list, head_list, positions, attention_mask, chunk_size)

    def _attention_chunks(
        self,
        input_ids: Tensor,
        layer_list: tuple[int, ...],
        head_list: tuple[int, ...],
        positions: Tensor,
        attention_mask: Tensor | None,
        chunk_size: int,
    ) -> Iterator[AttentionChunk]:
        """The generator behind ``stream_attention``, on validated arguments."""
        kept: dict[int, tuple[Tensor, Tensor, AttentionCall]] = {}

        def keep(layer: int, query: Tensor, key: Tensor, call: AttentionCall) -> None:
            if layer in layer_list:
                self.check_call_heads(layer, query, key)
                kept[layer] = (query.detach(), key.detach(), call)
                if len(kept) == len(layer_list):  # the layers after the last one wanted need not run
                    raise StopForward

        with self.inference(), self.query_key_tap(keep):
            self.forward_until_stopped(input_ids, attention_mask)
        key_mask = key_padding_mask_of(attention_mask, input_ids)
        self.check_every_layer_called(layer_list, kept)
        for layer in layer_list:
            query, key, call = kept.pop(layer)
            count = positions.shape[1]
            spans = [(start, min(count, start + chunk_size)) for start in range(0, count, chunk_size)]
            chunks = chunked_rows(query, key, call, positions, spans, heads=head_list, key_padding_mask=key_mask)
            for chunk_positions, probs, n_keys, _ in chunks:  # every key: key_start is 0
                yield AttentionChunk(
                    layer=layer, heads=head_list, query_positions=chunk_positions, probs=probs, n_keys=n_keys
                )

    def check_call_heads(self, layer: int, query: Tensor, key: Tensor) -> None:
        """Refuse a layer whose attention call has other heads than the spec: rows of the spec's heads alone would
        leave the others out of every table without a word.

        Raises:
            UnsupportedModelError: naming the layer and both head counts.
        """
        n_head, n_kv = int(query.shape[1]), int(key.shape[1])
        if n_head != self.spec.n_head or n_kv == 0 or n_head % n_kv:
            raise UnsupportedModelError(
                f"layer {layer} of {self.name!r} calls its attention with {n_head} query heads and {n_kv} key "
                f"heads, where its config gives {self.spec.n_head} and {self.spec.n_kv_head}; attnsens does not "
                "audit a model whose config does not describe its attention"
            )

    def check_every_layer_called(self, layers: Iterable[int], called: Container[int]) -> None:
        """Refuse a forward pass in which some of ``layers`` never reached the tapped attention function.

        Raises:
            UnsupportedModelError: naming those layers.
        """
        missing = sorted(layer for layer in layers if layer not in called)
        if missing:
            raise UnsupportedModelError(
                f"layers {missing} of {self.name!r} never called the attention function attnsens taps, so their "
                "rows cannot be recomputed"
            )

    def select_layers(self, layers: Sequence[int] | None) -> tuple[int, ...]:
        return _select(layers, self.spec.n_layer, "layer")

    def select_heads(self, heads: Sequence[int] | None) -> tuple[int, ...]:
        return _select(heads, self.spec.n_head, "head")

    def sequence_shape(self, input_ids: Tensor) -> tuple[int, int]:
        """``(batch, n)``: sequences and token positions of the model's input (a vision model's n counts patches)."""
        batch, n = input_ids.shape
        return int(batch), int(n)

    def query_positions_of(self, input_ids: Tensor, query_positions: Tensor | None) -> Tensor:
        """Query positions as LongTensor [batch, query], validated against the sequence length."""
        batch, n = self.sequence_shape(input_ids)
        if query_positions is None:
            return torch.arange(n, device=input_ids.device).expand(batch, n)
        positions = torch.as_tensor(query_positions, dtype=torch.long, device=input_ids.device)
        if positions.ndim == 1:
            positions = positions.expand(batch, -1)
        if positions.ndim != 2 or positions.shape[0] != batch:
            raise ShapeError(f"query_positions must be [query] or [{batch}, query], got {tuple(positions.shape)}")
        if positions.numel() and (positions.min() < 0 or positions.max() >= n):
            raise InputError(f"query positions must lie in [0, {n - 1}] for sequences of length {n}")
        return positions


def _parameter_state(module: torch.nn.Module) -> dict[str, tuple[Tensor, int, int]]:
    """name → (the parameter, its version counter, its storage address), for every parameter of ``module`` that is
    not offloaded: accelerate replaces an offloaded (meta) parameter with its weights each time its block runs, so
    its identity says nothing; its weights are checked against the module by the weights-fidelity gate."""
    return {name: (p, p._version, p.data_ptr()) for name, p in module.named_parameters() if p.device.type != "meta"}


def _select(chosen: Sequence[int] | None, count: int, what: str) -> tuple[int, ...]:
    if chosen is None:
        return tuple(range(count))
    picked = tuple(int(i) for i in chosen)
    bad = [i for i in picked if not 0 <= i < count]
    if bad or not picked:
        raise ConfigError(f"{what} selection {list(picked)} must be non-empty within 0..{count - 1}")
    repeated = sorted({i for i in picked if picked.count(i) > 1})
    if repeated:
        raise ConfigError(f"{what} selection {list(picked)} names {what} {repeated} more than once; list each once")
    return picked
