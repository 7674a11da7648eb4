"""The influence recursion on the inputs actually seen: what the certified constant becomes when each block's input
norm B_{k−1} and score oscillation 2A_{k,h} are taken as measured instead of bounded over all inputs.

The certified C (``certificate.certified_constant``) holds for every input, so it carries the worst case of every
layer: a factor e^{2A_k} per layer with A_k = ‖G‖B² + ‖g‖B, and B grows with depth. On a model whose attention is
not uniform those factors make C astronomically large (10^3000 and more) while the measured influence stays small.
The *input-set* value below reruns the same recursion (``recursion.run_recursion`` with ``observed``) with the
norms and oscillations that a given set of inputs reaches. It explains where the certified constant's size comes
from; it is not a certificate for any input outside that set (docs/math.md §10.6).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnsens.influence.recursion import ObservedLayer, log_poly_at, run_recursion

if TYPE_CHECKING:
    from attnsens.influence.certificate import InfluenceCertificate


@dataclass(frozen=True, kw_only=True)
class LayerObservation:
    """One block on a set of inputs: the recursion's observed inputs and how concentrated attention is there."""

    layer: int
    observed: ObservedLayer
    p_max_n_median: float  # median over query rows and heads of p_max · (number of keys)


def observe_layers(model: torch.nn.Module, sequences: Sequence[Tensor]) -> list[LayerObservation]:
    """Run attnsens' own GPT on each ``[batch, n]`` token tensor of ``sequences`` and record, per block, the largest
    norm of an input row, half the largest oscillation of a score row per head, and the median p_max·n.

    Uses the model's hook points ``blocks.{k}.hook_resid_pre``, ``blocks.{k}.attn.hook_scores`` and
    ``.hook_pattern`` (attnsens.train.model).
    """
    blocks: list[Any] = list(model.blocks)  # type: ignore[arg-type]
    hidden = [0.0] * len(blocks)
    half_range = [torch.zeros(block.attn.n_head, dtype=torch.float64) for block in blocks]
    p_max_n: list[list[Tensor]] = [[] for _ in blocks]
    keys: dict[int, Tensor] = {}  # the number of keys of each row of the current pass (finite scores)
    handles = []
    for k, block in enumerate(blocks):

        def on_resid(_m: object, _a: object, x: Tensor, k: int = k) -> None:
            hidden[k] = max(hidden[k], float(x.detach().double().norm(dim=-1).max()))

        def on_scores(_m: object, _a: object, s: Tensor, k: int = k) -> None:
            s = s.detach().double()
            finite = torch.isfinite(s)
            keys[k] = finite.sum(dim=-1).clamp(min=1)
            high = torch.where(finite, s, -math.inf).amax(dim=-1)
            low = torch.where(finite, s, math.inf).amin(dim=-1)
            spread = (high - low).amax(dim=(0, 2)) / 2  # per head
            half_range[k] = torch.maximum(half_range[k], spread)

        def on_pattern(_m: object, _a: object, p: Tensor, k: int = k) -> None:
            p_max_n[k].append((p.amax(dim=-1).double() * keys[k]).flatten())

        handles += [
            block.hook_resid_pre.register_forward_hook(on_resid),
            block.attn.hook_scores.register_forward_hook(on_scores),
            block.attn.hook_pattern.register_forward_hook(on_pattern),
        ]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for tokens in sequences:
                model(tokens)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return [
        LayerObservation(
            layer=k,
            observed=ObservedLayer(hidden_norm=hidden[k], score_half_range=tuple(float(a) for a in half_range[k])),
            p_max_n_median=float(torch.cat(p_max_n[k]).median()),
        )
        for k in range(len(blocks))
    ]


def input_set_log10_constant(
    certificate: InfluenceCertificate, observations: Sequence[LayerObservation]
) -> float | None:
    """log10 of the recursion's constant with the observed norms and oscillations (module docstring), or None where
    the certificate has no recursion to rerun (a model it does not model)."""
    if not certificate.blocks or not certificate.layers or certificate.log10_constant is None:
        return None
    first = observations[0].observed.hidden_norm
    rows = run_recursion(
        certificate.blocks,
        embedding_norm=first,
        # two inputs differ at one position by at most the embeddings' diameter, and by at most 2·B_0 on the set
        embedding_diameter=min(certificate.embedding_diameter, 2 * first),
        observed=[o.observed for o in observations],
    )
    # the same final factor as the certificate's (a final norm's Lipschitz constant; 1 without one)
    final = certificate.log10_constant - log_poly_at(certificate.layers[-1].log_other_positions, 1.0) / math.log(10.0)
    return log_poly_at(rows[-1].log_other_positions, 1.0) / math.log(10.0) + final
