"""Non-finite weights are found before any forward pass and named by layer and parameter.

A NaN or ±Inf weight makes every attention row downstream NaN; the θ engine would then reject "row 0" of
some tensor, which says nothing about the cause. ``audit``, ``bounds`` and the study check the weights first.
"""

from __future__ import annotations

import dataclasses
import re
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from attnsens.errors import InputError
from attnsens.weights import LayerWeights

# Block containers of the supported families: GPT-2 ``h.3.``, Llama/BERT ``layers.3.``/``layer.3.``, own GPT
# ``blocks.3.``.
_LAYER = re.compile(r"(?:^|\.)(?:h|layers|layer|blocks)\.(\d+)\.")


_RESTORE = "restore the weights (reload the model, or retrain from a good checkpoint)"


def check_finite_module(module: torch.nn.Module, *, name: str, fix: str = _RESTORE) -> None:
    """Raise InputError naming the first parameter of ``module`` (and its layer) that holds NaN or ±Inf, with
    ``fix`` as the advice (a study names the checkpoint to rebuild)."""
    _check(module.named_parameters(), name, fix)


def check_finite_layers(layers: Sequence[LayerWeights], *, name: str) -> None:
    """Raise InputError naming the first normalized weight (``layers.{i}.{part}.{tensor}``) with NaN or ±Inf; one
    layer at a time, so that an offloaded model's layers are read and dropped in turn."""
    for layer in layers:
        named = []
        for part in ("attention", "mlp", "attn_norm", "mlp_norm", "attn_out_norm", "mlp_out_norm"):
            weights = getattr(layer, part)
            if weights is None:
                continue
            named += _named_tensors(f"layers.{layer.index}.{part}", weights)
        _check(named, name, _RESTORE)


def _named_tensors(prefix: str, weights: Any) -> list[tuple[str, Tensor]]:
    """Every tensor of a weights dataclass, by dotted name, inside nested ones (a mixture of experts' experts:
    ``mlp.experts.3.w_in``) too."""
    if isinstance(weights, Tensor):
        return [(prefix, weights)]
    if isinstance(weights, tuple):
        return [pair for i, value in enumerate(weights) for pair in _named_tensors(f"{prefix}.{i}", value)]
    if dataclasses.is_dataclass(weights):
        return [
            pair
            for field in dataclasses.fields(weights)
            for pair in _named_tensors(f"{prefix}.{field.name}", getattr(weights, field.name))
        ]
    return []


def _check(named: Iterable[tuple[str, Tensor]], model: str, fix: str) -> None:
    for parameter, tensor in named:
        if not tensor.is_floating_point() or tensor.device.type == "meta" or _all_finite(tensor):
            continue  # an offloaded parameter (meta) is checked in its normalized weights, read as it is bounded
        nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
        match = _LAYER.search(parameter)
        where = f"layer {match.group(1)}, " if match else ""
        raise InputError(
            f"{model} has non-finite weights: {where}parameter {parameter!r} {tuple(tensor.shape)} holds {nan} NaN "
            f"and {inf} ±Inf values; {fix}"
        )


_CHECKED: dict[int, tuple[weakref.ref[Tensor], int, int]] = {}
"""id(tensor) → (the tensor, its version counter and data pointer) when it was last found finite: a tensor that has
not been written since (torch bumps ``_version`` on every in-place write, optimizer steps included) is not read
again, so auditing a loaded model chunk after chunk or sequence after sequence checks its weights once."""


def _all_finite(tensor: Tensor) -> bool:
    """Whether every entry is finite. A NaN or ±Inf entry makes the float sum NaN or ±Inf whatever the order
    (NaN propagates, ∞ + finite = ∞, ∞ − ∞ = NaN), so a finite sum proves it in one read of the tensor; a
    non-finite sum (a NaN, an Inf, or only an overflow of the sum) is settled entry by entry."""
    stamp = (tensor._version, tensor.data_ptr())
    seen = _CHECKED.get(id(tensor))
    if seen is not None and seen[0]() is tensor and seen[1:] == stamp:
        return True
    with torch.no_grad():
        finite = bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())
    if finite:
        key = id(tensor)

        def forget(_ref: weakref.ref[Tensor]) -> None:
            _CHECKED.pop(key, None)

        _CHECKED[key] = (weakref.ref(tensor, forget), *stamp)
    return finite
