"""Normalized layer weights in the form of the float64 block oracle (tests/reference/model_oracles.py)."""

from __future__ import annotations

from dataclasses import asdict

import torch

import attnsens.models as M


def _as_oracle_block(layer: M.LayerWeights) -> dict:
    def f64(value):
        return value.double() if isinstance(value, torch.Tensor) else value

    def norm(weights: M.NormWeights | None) -> dict | None:
        if weights is None:
            return None
        return {"kind": weights.kind, "gamma": f64(weights.gamma), "beta": f64(weights.beta), "eps": weights.eps}

    attention = {k: f64(v) for k, v in asdict(layer.attention).items() if k != "rotary"}
    rotary = layer.attention.rotary
    return {
        "placement": layer.placement,
        "parallel": layer.parallel_residual,
        "alpha": layer.residual_scale,
        "attention": attention,
        "mlp": {k: f64(v) for k, v in asdict(layer.mlp).items()},
        "norm1": norm(layer.attn_norm),
        "norm2": norm(layer.mlp_norm),
        "rotary": None if rotary is None else (rotary.base, rotary.rotary_dim),
    }
