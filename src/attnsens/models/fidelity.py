"""The weights-fidelity gate: normalized weights must reproduce the model's own blocks before anything is bounded.

A certified bound is a statement about the function the normalized ``LayerWeights`` define; it says something
about the model only if that function is the model's. The gate runs the model once on real tokens with taps on
every layer's inputs and outputs, evaluates the reference forward (``attnsens.geometry.layers``) of each layer's
normalized weights on the inputs the model actually saw, and compares sub-output by sub-output:

=================  ===========================================  ==============================================
field              reference (float64, from the captured input)  model's own tensor
=================  ===========================================  ==============================================
``attn_norm``      N1(X) (pre; X without N1) or N1(αX + A)      the attention input (pre) or MLP input (post)
``attention``      Attn(attention input)                         the attention sublayer's output
``attn_out_norm``  N_ao(attention output)                        the output of the norm after attention
``mlp_norm``       N2 of X + B (pre; X when parallel) or αY + F   the MLP input (pre) or the block output (post)
``mlp``            MLP(MLP input)                                the MLP's output
``mlp_out_norm``   N_mo(MLP output)                              the output of the norm after the MLP
``block``          the whole block on the block input            the block output
=================  ===========================================  ==============================================

B is what the attention sublayer adds to the residual stream: its output, or N_ao of it in a layer with a norm
after attention (Gemma 2/3; ``attn_out_norm``, ``mlp_out_norm`` are compared only for layers that have them).
A layer with a branch beside its attention that the weights do not model (Falcon-H1's Mamba-2 mixer,
``LayerWeights.beside_attention``) skips ``mlp_norm`` and ``block``, whose model tensors hold that branch.
Each comparison is a relative error max_t ‖ref_t − out_t‖₂ / max_t ‖out_t‖₂ over all tokens; a value above the
tolerance of the model's float type raises :class:`~attnsens.errors.WeightsFidelityError` naming the family, the
layer and the field. Checking on the captured sub-inputs (not a propagated stream) localises a mismatch to the
sublayer that causes it.

Agreement on a few real tokens says nothing about the directions those tokens do not span: a weight wrong only
off their span (a misread column block, or an edit u vᵀ with v orthogonal to every token) passes the comparisons
above, while a local bound uses every direction. So the gate also *identifies* each sublayer
(``attention_identification``, ``mlp_identification``): a second forward pass replaces every attention and MLP
input, at the sublayer itself (``ModelAdapter.layer_input_taps``), by seeded Gaussian tokens at the RMS of the real
ones, and compares the sublayer's output with the reference forward of the normalized weights on the same tokens.
There are at least ``max(d_model, head·d_head, d_ff) + 1`` of them (:func:`identification_tokens`), so in general
position they span the input of every linear map inside the sublayer — d_model for W_Q, W_K, W_V and W_in, the
heads' outputs for W_O, the hidden units for W_out — plus one for its bias: an affine map that agrees with
another on them is that map. A norm's γ and β are identified by the real tokens already (two tokens with distinct
normalized coordinates fix each γ_i, β_i), its ε by ``hf.check_norm_eps`` where the layout names it. The pass costs
two forwards of that many tokens (model and reference), set by the widths and not by the bounded sequence: about a
fifth of ``attnsens bounds smollm2 --seq-len 32`` at one thread (docs/performance.md §4).

A mixture of experts is identified part by part instead of as one MLP (random tokens near a tie between two
experts may be routed either way in the model's float type): the gate calls the model's router, experts and
shared expert modules (``ModelAdapter.moe_modules``) on the same random tokens, and compares the router's logits
(``router_identification``), its selected experts and gate weights on the tokens whose k-th and (k+1)-th logits are
clearly apart (``routing_identification``), every expert with all tokens routed to it (``expert_identification``)
and the shared expert with its gate (``shared_expert_identification``). The real tokens' ``mlp`` and ``block``
comparisons stay as for every layer.

Before any of this the adapter checks that no parameter changed since it read the normalized weights
(``ModelAdapter.check_weights_unchanged``: identity, version counter, storage); an edit that bypasses the version
counter (``.data``) still changes the function the identification pass compares.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from attnsens.errors import UnsupportedModelError, WeightsFidelityError
from attnsens.geometry.layers import (
    attention_input,
    attention_sublayer,
    block_forward,
    mlp_forward,
    moe_routing,
    norm_forward,
)
from attnsens.models.adapter import OUTPUT_FIELDS, LayerInputs, ModelAdapter, MoEModules
from attnsens.weights import LayerWeights, MLPWeights, MoEWeights

FIELDS = ("attn_norm", "attention", "attn_out_norm", "mlp_norm", "mlp", "mlp_out_norm", "block")
"""The sub-outputs the gate compares on the real forward pass, in forward order (a layer compares those it has)."""
IDENTIFICATION_FIELDS = ("attention_identification", "mlp_identification")
"""The sublayers the identification pass compares on random inputs, in every layer (module docstring)."""
MOE_IDENTIFICATION_FIELDS = (
    "router_identification",
    "routing_identification",
    "expert_identification",
    "shared_expert_identification",
)
"""A mixture of experts' parts, identified in place of ``mlp_identification`` (``_moe_identification``)."""

DEFAULT_TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-6,  # without RoPE; with it, float32's (``tolerance_of``)
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 3e-2,  # measured up to 1.1e-2 on tiny random-init models (one bfloat16 rounding is 3.9e-3)
}
"""Largest accepted relative error per model float type (structural mismatches give 5e-2 to 1.5)."""
HALF_TOLERANCE = 3e-2
"""Tolerance of any other float type."""

PROBE_LENGTH = 16
IDENTIFICATION_LENGTH = 64
"""Tokens per sequence of the identification pass (fewer where the context is shorter); its batch grows until
the pass has :func:`identification_tokens` tokens."""


@dataclass(frozen=True, kw_only=True)
class FieldFidelity:
    """One comparison of the gate: ``relative_error`` of ``field`` in ``layer`` against ``tolerance``."""

    layer: int
    field: str
    relative_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.relative_error <= self.tolerance


def probe_input_ids(adapter: ModelAdapter, length: int = PROBE_LENGTH, *, batch: int = 1) -> Tensor:
    """Seeded token ids ``[batch, n]`` (n = min(length, context)) for gating a model when no tokens are given, or
    seeded images ``[batch, channel, H, W]`` for a vision encoder."""
    generator = torch.Generator().manual_seed(0)
    config = getattr(getattr(adapter.module, "base_model", None), "config", None)
    if config is not None and getattr(config, "image_size", None) and getattr(config, "patch_size", None):
        side = config.image_size  # a vision encoder: seeded images of standard-normal pixels
        return torch.randn(batch, config.num_channels, side, side, generator=generator)
    n = max(1, min(length, adapter.spec.max_positions))
    return torch.randint(0, adapter.spec.vocab_size, (batch, n), generator=generator)


def _hidden_width(mlp: MLPWeights | MoEWeights) -> int:
    """d_ff of a dense MLP; the widest expert's (the shared one's included) of a mixture of experts."""
    if isinstance(mlp, MLPWeights):
        return mlp.w_in.shape[0]
    return max(expert.w_in.shape[0] for expert in (*mlp.experts, *([] if mlp.shared is None else [mlp.shared])))


def identification_tokens(layers: Sequence[LayerWeights]) -> int:
    """Tokens that identify every sublayer of ``layers``: one more than the widest input of a linear map inside
    one, max(d_model, head·d_head, d_ff) + 1 (module docstring; d_ff the widest expert's in a mixture)."""
    widest = max(
        max(layer.attention.d_model, layer.attention.n_head * layer.attention.d_head, _hidden_width(layer.mlp))
        for layer in layers
    )
    return widest + 1


def identification_fields(layer: LayerWeights) -> tuple[str, ...]:
    """The identification pass's fields of ``layer``: ``IDENTIFICATION_FIELDS``, or for a mixture of experts the
    attention's and ``MOE_IDENTIFICATION_FIELDS`` (the shared expert's where it has one)."""
    if not isinstance(layer.mlp, MoEWeights):
        return IDENTIFICATION_FIELDS
    fields = ("attention_identification", *MOE_IDENTIFICATION_FIELDS)
    return fields if layer.mlp.shared is not None else fields[:-1]


def relative_error(reference: Tensor, observed: Tensor) -> float:
    """max over tokens of ‖reference − observed‖₂ divided by the largest token norm of ``observed`` (of
    ``reference`` when ``observed`` is zero); inf for mismatched shapes or non-finite values."""
    reference, observed = reference.to(torch.float64), observed.to(torch.float64)
    if reference.shape != observed.shape:
        return math.inf
    scale = torch.linalg.vector_norm(observed, dim=-1).amax()
    if scale == 0:
        scale = torch.linalg.vector_norm(reference, dim=-1).amax()
    error = torch.linalg.vector_norm(reference - observed, dim=-1).amax()
    if error == 0:
        return 0.0
    value = float(error / scale) if scale > 0 else math.inf
    return value if math.isfinite(value) else math.inf


def tolerance_of(dtype: torch.dtype, *, rotary: bool = False) -> float:
    """The gate's default tolerance for a model whose weights are ``dtype``. transformers computes the cos/sin
    tables of RoPE in float32 whatever the model's type, so a float64 model with RoPE is a float32 one in its
    rotations (relative errors of 1.6–4.2·10^-6 measured at 40 tokens on tiny Llama and Qwen2 models, growing with
    the position) and gets float32's tolerance."""
    if rotary and dtype == torch.float64:
        dtype = torch.float32
    return DEFAULT_TOLERANCE.get(dtype, HALF_TOLERANCE)


def _comparisons(layer: LayerWeights, seen: dict[str, Tensor]) -> dict[str, tuple[Callable[[], Tensor], Tensor]]:
    """field → (reference thunk, the model's tensor), all reference inputs taken from the model's own tensors."""
    x, a_in, m_in = seen["block_input"], seen["attention_input"], seen["mlp_input"]
    a_out, m_out, y = seen["attention_output"], seen["mlp_output"], seen["block_output"]
    checks: dict[str, tuple[Callable[[], Tensor], Tensor]] = {
        "attention": (lambda: attention_sublayer(a_in, layer.attention), a_out),
        "mlp": (lambda: mlp_forward(m_in, layer.mlp), m_out),
        "block": (lambda: block_forward(x, layer), y),
    }
    # What the attention sublayer adds to the stream: the model's normed output where the layer has a norm after
    # attention (the reference N_ao(a_out) when the family does not report it), its raw output otherwise.
    added = a_out
    for field, norm, raw, normed in (
        ("attn_out_norm", layer.attn_out_norm, a_out, "normed_attention_output"),
        ("mlp_out_norm", layer.mlp_out_norm, m_out, "normed_mlp_output"),
    ):
        if norm is None:
            continue
        reference = functools.partial(norm_forward, raw, norm)
        if normed in seen:
            checks[field] = (reference, seen[normed])
        if field == "attn_out_norm":
            added = seen[normed] if normed in seen else reference()
    alpha = layer.residual_scale
    if layer.placement == "pre":
        mlp_norm = layer.mlp_pre_norm()
        mid = x if layer.parallel_residual else x + added
        # Without N1 the attention must read the block input itself: a norm the weights miss shows here.
        checks["attn_norm"] = (lambda: attention_input(x, layer), a_in)
        checks["mlp_norm"] = (lambda: norm_forward(mid, mlp_norm), m_in)
    elif layer.placement == "post":
        attn_norm, mlp_norm = layer.norms()
        checks["attn_norm"] = (lambda: norm_forward(alpha * a_in + a_out, attn_norm), m_in)
        checks["mlp_norm"] = (lambda: norm_forward(alpha * m_in + m_out, mlp_norm), y)
    if layer.beside_attention is not None:  # a branch the weights do not model adds to the sum N2 reads
        del checks["mlp_norm"], checks["block"]
    return {field: checks[field] for field in FIELDS if field in checks}


_INPUT_FIELDS = ("block_input", "attention_input", "mlp_input")
"""What ``layer_input_taps`` reports for every layer."""


def _identification(
    adapter: ModelAdapter, layers: Sequence[LayerWeights], scales: dict[tuple[int, str], float], limit: float
) -> list[FieldFidelity]:
    """The identification pass (module docstring): every attention and MLP input replaced by seeded Gaussian
    tokens of RMS ``scales[(layer, field)]``, each sublayer's output compared with its reference as it comes, so
    that no more than one layer's tensors are held. The reference runs in float64 for a float64 model and in
    float32 otherwise (its rounding, about 10⁻⁷ relative, far below any tolerance but float64's)."""
    n = max(1, min(IDENTIFICATION_LENGTH, adapter.spec.max_positions))
    probe = probe_input_ids(adapter, n)
    _, n = adapter.sequence_shape(probe)
    tokens = identification_tokens(layers)
    batch = -(-tokens // n)
    # the shortest sequences that still give ``tokens`` in ``batch`` of them (a vision encoder's length is its own)
    input_ids = adapter.check_input_ids(probe_input_ids(adapter, -(-tokens // batch), batch=batch))
    generator = torch.Generator().manual_seed(1)
    given: dict[int, dict[str, Tensor]] = {}
    errors: dict[tuple[int, str], float] = {}
    reference_dtype = torch.float64 if layers[0].attention.w_q.dtype == torch.float64 else torch.float32

    def replace(layer: int, field: str, tensor: Tensor) -> Tensor | None:
        if field not in ("attention_input", "mlp_input"):
            return None
        mine = given.setdefault(layer, {})
        for other in mine.values():  # one module's output feeding both sublayers (GPT-J's ln_1): one replacement
            if other.shape == tensor.shape and torch.equal(other, tensor):
                mine[field] = other
                return None
        noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float64) * scales.get((layer, field), 1.0)
        mine[field] = noise.to(tensor.device, tensor.dtype)
        return mine[field]

    def compare(layer: int, field: str, tensor: Tensor) -> None:
        name = {"attention_output": "attention", "mlp_output": "mlp"}.get(field)
        seen = given.get(layer, {})
        source = {"attention": "attention_input", "mlp": "mlp_input"}.get(name or "")
        if name is None or source not in seen or not 0 <= layer < len(layers):
            return
        x = seen.pop(source).to(reference_dtype)  # compared once: a layer's inputs are dropped as its outputs come
        weights = layers[layer]  # an offloaded model's layer is read here, while its block runs
        if name == "attention":
            reference = attention_sublayer(x, weights.attention)
            errors[(layer, "attention_identification")] = relative_error(reference, tensor)
        elif isinstance(weights.mlp, MoEWeights):  # its parts, each on its own (random tokens route near ties)
            modules = adapter.moe_modules(layer)
            if modules is not None:  # the same random tokens, in float64 (exactly the model's values)
                tokens = x.to(torch.float64).flatten(0, -2)
                errors.update(_moe_identification(modules, weights.mlp, tokens, layer, limit, tensor))
        else:
            errors[(layer, "mlp_identification")] = relative_error(mlp_forward(x, weights.mlp), tensor)

    with adapter.inference(), adapter.layer_input_taps(replace), adapter.layer_output_taps(compare):
        adapter.forward(input_ids, None)
    return [
        FieldFidelity(
            layer=layer.index, field=field, relative_error=errors.get((layer.index, field), math.inf), tolerance=limit
        )
        for layer in layers
        for field in identification_fields(layer)
    ]


def _moe_identification(
    modules: MoEModules, moe: MoEWeights, x: Tensor, layer: int, limit: float, like: Tensor
) -> dict[tuple[int, str], float]:
    """A mixture of experts identified part by part on the random tokens ``x`` [n, d_model] (float64), each part
    the model's own module called alone in the model's float type (that of ``like``):

    * ``router_identification``: its logits against W_r x (an affine map, identified by n > d_model tokens);
    * ``routing_identification``: its selected experts and gate weights against ``moe_routing``'s, on the tokens
      whose k-th and (k+1)-th logits lie apart by more than ``limit`` times the logits' magnitude |W_r||x| (a
      near-tie may route either way in the model's float type); infinite where the selected sets differ on one
      of them, or where none is apart;
    * ``expert_identification``: every expert, called with all n tokens routed to it at weight 1, against its
      normalized weights (the largest error over the experts);
    * ``shared_expert_identification``: the shared expert and its sigmoid gate, likewise.

    Each expert sees all n > d_ff tokens, so each is identified whatever the router does with random tokens.
    """
    dtype, device = like.dtype, like.device
    model_x = x.to(device, dtype)
    reference_x = x.to(torch.float64 if dtype == torch.float64 else torch.float32)
    errors: dict[tuple[int, str], float] = {}
    logits, weights, indices = modules.router(model_x)[:3]
    errors[(layer, "router_identification")] = relative_error(reference_x @ moe.router.to(reference_x.dtype).T, logits)
    reference_logits, reference_selected, reference_weights = moe_routing(x, moe)
    magnitude = (x.abs() @ moe.router.to(torch.float64).abs().T).amax(dim=-1)
    ranked = reference_logits.topk(min(moe.top_k + 1, moe.n_expert), dim=-1).values
    margin = ranked[:, moe.top_k - 1] - ranked[:, -1] if moe.top_k < moe.n_expert else magnitude + 1.0
    apart = margin > limit * magnitude
    routing = math.inf
    if indices.shape == reference_selected.shape and bool(apart.any()):
        mine, mine_order = indices[apart].to(reference_selected.device).sort(dim=-1)
        theirs, their_order = reference_selected[apart].sort(dim=-1)
        if torch.equal(mine, theirs):
            theirs_weights = reference_weights[apart].gather(-1, their_order)
            routing = relative_error(theirs_weights, weights[apart].to(torch.float64).gather(-1, mine_order))
    errors[(layer, "routing_identification")] = routing
    ones = torch.ones(model_x.shape[0], 1, dtype=dtype, device=device)
    errors[(layer, "expert_identification")] = max(
        relative_error(
            mlp_forward(reference_x, expert),
            modules.experts(model_x, torch.full_like(ones, e, dtype=torch.long), ones) * modules.output_scale,
        )
        for e, expert in enumerate(moe.experts)
    )
    if moe.shared is not None and moe.shared_gate is not None and modules.shared is not None:
        gate = modules.shared_gate
        gate_error = math.inf if gate is None else relative_error(
            torch.sigmoid(reference_x @ moe.shared_gate.to(reference_x.dtype))[:, None], torch.sigmoid(gate(model_x))
        )  # fmt: skip
        shared = relative_error(mlp_forward(reference_x, moe.shared), modules.shared(model_x) * modules.output_scale)
        errors[(layer, "shared_expert_identification")] = max(gate_error, shared)
    return errors


def _rms(tensor: Tensor) -> float:
    """The RMS of every entry of ``tensor`` (1 where it is 0 or not finite: a scale for random inputs)."""
    value = float(tensor.to(torch.float64).square().mean().sqrt())
    return value if math.isfinite(value) and value > 0 else 1.0


def weights_fidelity(
    adapter: ModelAdapter, input_ids: Tensor | None = None, *, tolerance: float | None = None
) -> tuple[list[LayerInputs], list[FieldFidelity]]:
    """Check that the adapter's normalized weights are still the module's, run the model once on ``input_ids``
    (default: :func:`probe_input_ids`) and compare every layer's normalized weights with the model's own
    sub-outputs, then identify every sublayer on random inputs (module docstring).

    Returns:
        The layer inputs of the real forward pass and one :class:`FieldFidelity` per (layer, field): the real
        pass's fields in forward order, then the identification pass's; no mismatch raised.

    Raises:
        WeightsChangedError: a parameter changed after the adapter read its normalized weights.
    """
    input_ids = adapter.check_input_ids(probe_input_ids(adapter) if input_ids is None else input_ids)
    layers = adapter.layers  # first: an adapter that refuses a model's weights does so before any hook is placed
    adapter.check_weights_unchanged()
    found: dict[int, dict[str, Tensor]] = {i: {} for i in range(adapter.spec.n_layer)}

    def record(layer: int, field: str, tensor: Tensor) -> None:
        found[layer][field] = tensor.detach()

    with adapter.inference(), adapter.layer_input_taps(record), adapter.layer_output_taps(record):
        adapter.forward(input_ids, None)
    for index, seen in found.items():
        unseen = [name for name in (*_INPUT_FIELDS, *OUTPUT_FIELDS) if name not in seen]
        if unseen:  # e.g. BLOOM with pretraining_tp > 1 and slow_but_exact slices W_O outside its module
            raise UnsupportedModelError(
                f"{adapter.family} model {adapter.name!r}: layer {index} computed its {', '.join(unseen)} without "
                "calling the modules attnsens taps, so its weights cannot be checked against what the model does; "
                "bounds need a model that runs its sublayers as modules (audits of its rows are unaffected)"
            )
    rotary = any(layer.attention.rotary is not None for layer in layers)
    limit = tolerance_of(layers[0].attention.w_q.dtype, rotary=rotary)
    limit = limit if tolerance is None else tolerance
    results = []
    with torch.no_grad():
        for layer, seen in zip(layers, (found[i] for i in range(len(layers))), strict=True):
            f64 = {name: t.to(torch.float64) for name, t in seen.items()}
            for field, (reference, observed) in _comparisons(layer, f64).items():
                error = relative_error(reference(), observed)
                results.append(FieldFidelity(layer=layer.index, field=field, relative_error=error, tolerance=limit))
    scales = {(i, name): _rms(seen[name]) for i, seen in found.items() for name in ("attention_input", "mlp_input")}
    results += _identification(adapter, layers, scales, limit)
    names = {f.name for f in fields(LayerInputs)}
    inputs = [
        LayerInputs(layer=i, **{k: v for k, v in found[i].items() if k in names}) for i in range(adapter.spec.n_layer)
    ]
    return inputs, results


def check_weights_fidelity(
    adapter: ModelAdapter, input_ids: Tensor | None = None, *, tolerance: float | None = None
) -> list[LayerInputs]:
    """The gate: :func:`weights_fidelity`, raising on the first (layer, field) that fails: the real pass's in
    forward order, then the identification pass's.

    Returns:
        The layer inputs of the checked forward pass (what a bound on ``input_ids`` then uses).

    Raises:
        WeightsFidelityError: naming the family, layer, field and relative error.
        WeightsChangedError: a parameter changed after the adapter read its weights.
        UnsupportedModelError: the adapter already knows it cannot read the model's weights.
    """
    inputs, results = weights_fidelity(adapter, input_ids, tolerance=tolerance)
    for result in results:
        if not result.passed:
            raise WeightsFidelityError(
                family=adapter.family,
                layer=result.layer,
                field=result.field,
                relative_error=result.relative_error,
                tolerance=result.tolerance,
                model=adapter.name,
            )
    return inputs
