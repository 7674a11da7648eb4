"""What the influence certificate reads from a model: embeddings, a positional bound, layers, the unembedding.

:class:`CertificateInputs` is the model-independent input of :func:`attnsens.influence.certified_constant`
(docs/math.md §10.4, algorithm A6). :func:`certificate_inputs` builds it from attnsens' own GPT, from a model adapter
(``attnsens.models.load``) that wraps one, or from a list of normalized layers plus explicit embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from attnsens._rounding import add_up, mul_up, norm2_upper_bound, sqrt_up, square_up, sum_upper_bound
from attnsens.errors import ConfigError, ShapeError, UnsupportedModelError
from attnsens.geometry.attention_accuracy import norm_upper
from attnsens.models.own_gpt import gpt_layer_weights
from attnsens.train.model import GPT
from attnsens.weights import LayerWeights, NormWeights

PositionKind = Literal["none", "sinusoidal", "learned"]

# A stored sin/cos pair (s·fl(sin x), s·fl(cos x)) lies within s·2^-21 of the pair at the same x, whatever the
# precision of the table and of its angle (float32 or better, sin/cos within a few ulps): the bound covers every
# angle, so only the pair's own rounding is added, s·2^-21 per pair.
_TABLE_PAIR_ROUNDING = 2.0**-21


@dataclass(frozen=True, kw_only=True)
class PositionBound:
    """A bound on the positional part of layer 0: sup_a,j ‖v_a + p_j‖₂ over tokens a and positions j < max_length.

    ``embedding_norm_upper_bound[a]`` bounds sup_j ‖v_a + p_j‖₂ for token a; ``max_length`` is None when the bound
    holds for every length (no or sinusoidal positions) and n_ctx for learned absolute positions, which do not
    exist beyond it (docs/math.md §10.6).
    """

    kind: PositionKind
    embedding_norm_upper_bound: Tensor  # [vocab] float64
    max_length: int | None

    def __post_init__(self) -> None:
        if self.embedding_norm_upper_bound.ndim != 1:
            raise ShapeError(
                f"embedding_norm_upper_bound must be [vocab], got {tuple(self.embedding_norm_upper_bound.shape)}"
            )
        if self.max_length is not None and self.max_length < 2:
            raise ConfigError(f"max_length must be >= 2 or None, got {self.max_length}")


@dataclass(frozen=True, kw_only=True)
class CertificateInputs:
    """Everything the recursion of docs/math.md §10.3 needs from a model.

    ``token_embedding`` is [vocab, d_model] (rows v_a), ``unembedding`` [vocab, d_model] (rows u_v, logits = U y)
    or None, ``final_norm`` a norm applied before the unembedding (None for LN-free models).
    """

    token_embedding: Tensor
    positions: PositionBound
    layers: tuple[LayerWeights, ...]
    unembedding: Tensor | None = None
    final_norm: NormWeights | None = None

    def __post_init__(self) -> None:
        if self.token_embedding.ndim != 2:
            raise ShapeError(f"token_embedding must be [vocab, d_model], got {tuple(self.token_embedding.shape)}")
        vocab, d_model = self.token_embedding.shape
        if self.positions.embedding_norm_upper_bound.shape != (vocab,):
            raise ShapeError(
                f"position bound is for {self.positions.embedding_norm_upper_bound.shape[0]} tokens, "
                f"the embedding has {vocab}; build both from the same model"
            )
        if not self.layers:
            raise ConfigError("a certificate needs at least one layer; got an empty layer list")
        for layer in self.layers:
            if layer.attention.d_model != d_model:
                raise ShapeError(f"layer {layer.index} has d_model {layer.attention.d_model}, embedding {d_model}")
        if self.unembedding is not None and self.unembedding.shape[1:] != (d_model,):
            raise ShapeError(f"unembedding must be [vocab, {d_model}], got {tuple(self.unembedding.shape)}")


def sinusoidal_position_bound(token_embedding: Tensor, *, scale: float) -> PositionBound:
    """sup_j ‖v_a + p_j‖₂ for the pairs p_j[2i] = s·sin(jω_i), p_j[2i+1] = s·cos(jω_i), valid for every j ≥ 0.

    ‖v + p_j‖² = ‖v‖² + ‖p_j‖² + 2⟨v, p_j⟩ with ‖p_j‖² ≤ s²·⌈d/2⌉, and each sin/cos pair contributes
    s(v_{2i} sin + v_{2i+1} cos) ≤ s·√(v_{2i}² + v_{2i+1}²) to ⟨v, p_j⟩ (an unpaired last sine at odd d at most
    s|v_{d−1}|). This is never larger than ‖v‖ + s√⌈d/2⌉ and is exact up to the choice of j. The stored table's
    rounding adds at most s·2^-21·√⌈d/2⌉, and every step is rounded up (``attnsens._rounding``).

    Args:
        token_embedding: [vocab, d_model].
        scale: the amplitude s ≥ 0.

    Returns:
        PositionBound(kind="sinusoidal", max_length=None).
    """
    v = token_embedding.detach().to(torch.float64)
    d_model = v.shape[1]
    pairs = math.ceil(d_model / 2)
    pair_norms = norm2_upper_bound(v[:, : 2 * (d_model // 2)].reshape(v.shape[0], -1, 2))
    if d_model % 2:
        pair_norms = torch.cat((pair_norms, v[:, -1:].abs()), dim=-1)
    cross = sum_upper_bound(pair_norms)
    amplitude = torch.tensor(float(scale), dtype=torch.float64)
    token = sum_upper_bound(square_up(v.abs()))
    position = mul_up(square_up(amplitude), float(pairs))
    squared = add_up(add_up(token, position), mul_up(mul_up(cross, 2.0), amplitude))
    rounding = mul_up(mul_up(amplitude, _TABLE_PAIR_ROUNDING), sqrt_up(torch.tensor(float(pairs), dtype=torch.float64)))
    bound = add_up(sqrt_up(squared), rounding)
    return PositionBound(kind="sinusoidal", embedding_norm_upper_bound=bound, max_length=None)


def learned_position_bound(token_embedding: Tensor, position_table: Tensor, *, chunk: int = 256) -> PositionBound:
    """max_j ‖v_a + p_j‖₂ exactly over a learned table of n_ctx positions; the certificate then holds for n ≤ n_ctx.

    Args:
        token_embedding: [vocab, d_model].
        position_table: [n_ctx, d_model].
        chunk: tokens per block, to keep memory at chunk · n_ctx · d_model.
    """
    v = token_embedding.detach().to(torch.float64)
    p = position_table.detach().to(torch.float64)
    bounds = [
        norm_upper(torch.linalg.vector_norm(v[start : start + chunk, None, :] + p[None], dim=-1), v.shape[1]).amax(-1)
        for start in range(0, v.shape[0], chunk)
    ]  # the float sums v + p and their norms carry rule 3 of attnsens._rounding (attention_accuracy.norm_upper)
    return PositionBound(kind="learned", embedding_norm_upper_bound=torch.cat(bounds), max_length=p.shape[0])


def certificate_inputs(
    model: Any,
    *,
    token_embedding: Tensor | None = None,
    positions: PositionBound | None = None,
    unembedding: Tensor | None = None,
) -> CertificateInputs:
    """CertificateInputs from a CertificateInputs, attnsens' own GPT, an adapter wrapping one, or a layer list.

    A bare ``Sequence[LayerWeights]`` needs ``token_embedding`` and ``positions``; without ``positions`` the
    layer-0 input is taken to be the token embedding alone (no positional embeddings).
    """
    if isinstance(model, CertificateInputs):
        return model
    if isinstance(model, Sequence) and all(isinstance(layer, LayerWeights) for layer in model):
        if token_embedding is None:
            raise ConfigError("certifying a bare layer list needs token_embedding=[vocab, d_model]; pass it")
        if positions is None:
            norms = norm2_upper_bound(token_embedding.detach().to(torch.float64))
            positions = PositionBound(kind="none", embedding_norm_upper_bound=norms, max_length=None)
        return CertificateInputs(
            token_embedding=token_embedding, positions=positions, layers=tuple(model), unembedding=unembedding
        )
    module = getattr(model, "module", model)
    if isinstance(module, GPT):
        return _gpt_inputs(module)
    raise UnsupportedModelError(
        f"no influence certificate for {type(model).__name__}: it needs token/position embeddings and LN-free "
        "layers; pass attnsens' own GPT, a CertificateInputs, or a list of LayerWeights with token_embedding="
    )


def _gpt_inputs(gpt: GPT) -> CertificateInputs:
    config = gpt.config
    embedding = gpt.wte.weight.detach()
    if config.positions == "sinusoidal":
        positions = sinusoidal_position_bound(embedding, scale=config.position_scale)
    elif gpt.wpe is not None:  # learned positions
        positions = learned_position_bound(embedding, gpt.wpe.weight)
    else:
        norms = norm2_upper_bound(embedding.to(torch.float64))
        positions = PositionBound(kind="none", embedding_norm_upper_bound=norms, max_length=None)
    final_norm = None
    if gpt.ln_f is not None:
        bias = None if gpt.ln_f.bias is None else gpt.ln_f.bias.detach()
        final_norm = NormWeights(kind="layernorm", gamma=gpt.ln_f.weight.detach(), beta=bias, eps=config.layer_norm_eps)
    return CertificateInputs(
        token_embedding=embedding,
        positions=positions,
        layers=tuple(gpt_layer_weights(gpt)),
        unembedding=gpt.unembedding.detach(),
        final_norm=final_norm,
    )
