"""The safetensors file of a list of normalized ``LayerWeights`` (``attnsens bounds FILE.safetensors``).

Layout: tensors
``layers.{i}.attention.{w_q,w_k,w_v,w_o,b_q,b_k,b_v,b_o,alibi_slopes}``,
``layers.{i}.mlp.{w_in,w_out,b_in,b_out,w_gate,b_gate}``,
``layers.{i}.{attn_norm,mlp_norm,attn_out_norm,mlp_out_norm}.{gamma,beta}``,
``layers.{i}.attention.{q_norm,k_norm}.{gamma,beta}`` (QK-norm; beta: added after a per-head norm) (absent = None;
shapes as in ``attnsens.weights``), and the
metadata key ``attnsens.layers``: a JSON list with, per layer, ``placement``, ``tau``, ``causal``, ``mlp_kind``,
``activation``, ``norm_kind`` (of the pre-norms), ``norm_eps`` ([attn, mlp]), ``residual_scale``,
``parallel_residual``, ``rotary`` (null or the fields of ``RotaryConfig``), ``sliding_window`` (null or an int;
a window on both sides where ``causal`` is false), ``qk_norm_eps`` ([q, k], the QK-norms' ε),
``qk_norm_after_rotary`` (whether they follow RoPE), ``softcap`` (null or the logit cap) and, for the norms after
each sublayer, ``out_norm_kinds`` and ``out_norm_eps`` ([attn, mlp], null where a layer has none) and ``xielu``
(null or the fields of ``XIELUParameters``, the activation's parameters) and ``beside_attention`` (null or the
name of a branch beside the attention that the weights do not model: no block bound). Files written before a key
existed lack it: no sliding window, no QK-norm (or one before RoPE), no softcap, no norms after the sublayers, no
xIELU parameters, no branch beside the attention.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from attnsens.errors import FileFormatError, UnsupportedModelError
from attnsens.weights import (
    AttentionWeights,
    LayerWeights,
    MLPWeights,
    MoEWeights,
    NormWeights,
    RotaryConfig,
    XIELUParameters,
)

FORMAT_KEY = "attnsens.layers"


_TENSORS = {
    "attention": ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o", "alibi_slopes"),
    "mlp": ("w_in", "w_out", "b_in", "b_out", "w_gate", "b_gate"),
    "attn_norm": ("gamma", "beta"),
    "mlp_norm": ("gamma", "beta"),
    "attn_out_norm": ("gamma", "beta"),
    "mlp_out_norm": ("gamma", "beta"),
}


def save_layer_weights(layers: Sequence[LayerWeights], path: str | os.PathLike[str]) -> Path:
    """Write ``layers`` to a safetensors file in the layout of the module docstring.

    Raises:
        UnsupportedModelError: a layer whose MLP is a mixture of experts, which this layout does not hold.
    """
    from safetensors.torch import save_file

    tensors: dict[str, Tensor] = {}
    configs = []
    for i, layer in enumerate(layers):
        mlp = layer.mlp
        if isinstance(mlp, MoEWeights):
            raise UnsupportedModelError(
                f"layer {layer.index} holds a mixture of experts, which the weights file does not store; bound the "
                "model itself (attnsens bounds MODEL) instead of a weights file"
            )
        for part, names in _TENSORS.items():
            obj = getattr(layer, part)
            for name in names:
                value = None if obj is None else getattr(obj, name)
                if value is not None:
                    tensors[f"layers.{i}.{part}.{name}"] = value.detach().contiguous().cpu()
        qk_norms = {"q_norm": layer.attention.q_norm, "k_norm": layer.attention.k_norm}
        for name, qk_norm in qk_norms.items():
            if qk_norm is not None:
                tensors[f"layers.{i}.attention.{name}.gamma"] = qk_norm.gamma.detach().contiguous().cpu()
                if qk_norm.beta is not None:
                    tensors[f"layers.{i}.attention.{name}.beta"] = qk_norm.beta.detach().contiguous().cpu()
        rotary = layer.attention.rotary
        out_norms = (layer.attn_out_norm, layer.mlp_out_norm)
        configs.append({
            "placement": layer.placement, "tau": layer.attention.tau, "causal": layer.attention.causal,
            "mlp_kind": mlp.kind, "activation": mlp.activation,
            "norm_kind": next((n.kind for n in (layer.attn_norm, layer.mlp_norm) if n is not None), None),
            "norm_eps": [None if n is None else n.eps for n in (layer.attn_norm, layer.mlp_norm)],
            "residual_scale": layer.residual_scale, "parallel_residual": layer.parallel_residual,
            "rotary": None if rotary is None else vars(rotary), "sliding_window": layer.attention.sliding_window,
            "qk_norm_eps": [None if n is None else n.eps for n in qk_norms.values()],
            "qk_norm_after_rotary": layer.attention.qk_norm_after_rotary,
            "softcap": layer.attention.softcap,
            "out_norm_kinds": [None if n is None else n.kind for n in out_norms],
            "out_norm_eps": [None if n is None else n.eps for n in out_norms],
            "xielu": None if mlp.xielu is None else vars(mlp.xielu),
            "beside_attention": layer.beside_attention,
        })  # fmt: skip
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={FORMAT_KEY: json.dumps(configs)})
    return path


def load_layer_weights(path: str | os.PathLike[str]) -> list[LayerWeights]:
    """Read a safetensors file written in the layout of the module docstring into ``LayerWeights``."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileFormatError(f"weight file {path} does not exist; pass a .safetensors file of the attnsens layout")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise FileFormatError(f"cannot read {path} as safetensors ({err}); check the file") from None
    if FORMAT_KEY not in metadata:
        raise FileFormatError(
            f"{path} has no {FORMAT_KEY!r} metadata; write it with attnsens.store.layer_weights.save_layer_weights"
        )
    layers = []
    for i, cfg in enumerate(json.loads(metadata[FORMAT_KEY])):
        try:
            layers.append(_layer_from(tensors, i, cfg))
        except (KeyError, TypeError, AttributeError) as err:
            raise FileFormatError(
                f"{path}: layer {i} is incomplete ({err}); see the layout in attnsens.store.layer_weights"
            ) from None
    return layers


def _layer_from(tensors: dict[str, Tensor], i: int, cfg: dict[str, Any]) -> LayerWeights:
    def get(part: str, name: str) -> Tensor | None:
        return tensors.get(f"layers.{i}.{part}.{name}")

    def norm(part: str, eps: float, kind: Any = None) -> NormWeights | None:
        gamma = get(part, "gamma")
        if gamma is None:
            return None
        kind = cfg["norm_kind"] if kind is None else kind
        return NormWeights(kind=kind, gamma=gamma, beta=get(part, "beta"), eps=eps)

    def qk_norm(name: str, eps: float | None) -> NormWeights | None:
        gamma = get("attention", f"{name}.gamma")
        if gamma is None or eps is None:
            return None
        return NormWeights(kind="rmsnorm", gamma=gamma, beta=get("attention", f"{name}.beta"), eps=eps)

    qk_eps = cfg.get("qk_norm_eps", [None, None])
    out_kinds, out_eps = cfg.get("out_norm_kinds", [None, None]), cfg.get("out_norm_eps", [None, None])
    # Any: a required tensor the file lacks (None) fails the dataclass's shape checks, reported as FileFormatError.
    attention_tensors: dict[str, Any] = {n: get("attention", n) for n in _TENSORS["attention"]}
    mlp_tensors: dict[str, Any] = {n: get("mlp", n) for n in _TENSORS["mlp"]}
    attention = AttentionWeights(
        **attention_tensors, tau=cfg["tau"], causal=cfg["causal"],
        sliding_window=cfg.get("sliding_window"),
        rotary=None if cfg["rotary"] is None else RotaryConfig(**cfg["rotary"]),
        q_norm=qk_norm("q_norm", qk_eps[0]), k_norm=qk_norm("k_norm", qk_eps[1]), softcap=cfg.get("softcap"),
        qk_norm_after_rotary=bool(cfg.get("qk_norm_after_rotary", False)),
    )  # fmt: skip
    xielu = cfg.get("xielu")
    mlp = MLPWeights(
        kind=cfg["mlp_kind"], activation=cfg["activation"], **mlp_tensors,
        xielu=None if xielu is None else XIELUParameters(**xielu),
    )  # fmt: skip
    return LayerWeights(
        index=i, placement=cfg["placement"], attention=attention, mlp=mlp,
        attn_norm=norm("attn_norm", cfg["norm_eps"][0]), mlp_norm=norm("mlp_norm", cfg["norm_eps"][1]),
        residual_scale=cfg["residual_scale"], parallel_residual=cfg["parallel_residual"],
        attn_out_norm=norm("attn_out_norm", out_eps[0], out_kinds[0]),
        mlp_out_norm=norm("mlp_out_norm", out_eps[1], out_kinds[1]), beside_attention=cfg.get("beside_attention"),
    )  # fmt: skip
