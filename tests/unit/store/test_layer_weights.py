"""The safetensors layout of ``LayerWeights``: norms after each sublayer round-trip, and files written before they
existed still load (without them)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from attnsens.store.layer_weights import FORMAT_KEY, load_layer_weights, save_layer_weights
from attnsens.weights import LayerWeights, NormWeights
from tests.unit.geometry.tiny_layers import tiny_layers


def _assert_same_norm(a: NormWeights | None, b: NormWeights | None) -> None:
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        assert (a.kind, a.eps) == (b.kind, b.eps)
        torch.testing.assert_close(a.gamma, b.gamma, rtol=0, atol=0)
        assert (a.beta is None) == (b.beta is None)
        if a.beta is not None:
            torch.testing.assert_close(a.beta, b.beta, rtol=0, atol=0)


@pytest.mark.parametrize(("placement", "norm"), [("pre", "rmsnorm"), ("none", "rmsnorm"), ("pre", "layernorm")])
def test_norms_after_the_sublayers_round_trip(tmp_path, placement: str, norm: str) -> None:
    layers = tiny_layers(placement, out_norms=True, gated=norm == "rmsnorm", norm=norm)
    # One layer with only the MLP's output norm (each is optional), with its own ε.
    mlp_only = NormWeights(kind="rmsnorm", gamma=layers[1].mlp_out_norm.gamma, beta=None, eps=1e-6)
    layers[1] = LayerWeights(**{**vars(layers[1]), "attn_out_norm": None, "mlp_out_norm": mlp_only})
    loaded = load_layer_weights(save_layer_weights(layers, tmp_path / "w.safetensors"))
    for a, b in zip(layers, loaded, strict=True):
        assert (a.placement, a.has_out_norms) == (b.placement, b.has_out_norms)
        for part in ("attn_norm", "mlp_norm", "attn_out_norm", "mlp_out_norm"):
            _assert_same_norm(getattr(a, part), getattr(b, part))


def test_a_file_without_the_new_keys_loads_without_output_norms(tmp_path) -> None:
    """Files written before ``out_norm_kinds``/``out_norm_eps`` (and the keys before them) existed."""
    path = save_layer_weights(tiny_layers("pre"), tmp_path / "new.safetensors")
    with safe_open(str(path), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        configs = json.loads(handle.metadata()[FORMAT_KEY])
    for config in configs:
        for key in ("out_norm_kinds", "out_norm_eps", "qk_norm_eps", "softcap", "sliding_window"):
            del config[key]
    old = tmp_path / "old.safetensors"
    save_file(tensors, str(old), metadata={FORMAT_KEY: json.dumps(configs)})
    loaded = load_layer_weights(old)
    assert [layer.has_out_norms for layer in loaded] == [False, False]
    torch.testing.assert_close(loaded[0].attn_norm.gamma, tiny_layers("pre")[0].attn_norm.gamma)


def test_a_qk_norm_with_beta_round_trips(tmp_path) -> None:
    """A per-head QK-norm with a beta (a LayerNorm QK-norm read centred): the file keeps β, the loaded norm is the
    same RMSNorm plus β."""
    layers = tiny_layers("pre")
    d_head = layers[0].attention.d_head
    gen = torch.Generator().manual_seed(5)
    q_norm, k_norm = (
        NormWeights(
            kind="rmsnorm",
            gamma=1 + torch.rand(d_head, generator=gen),
            beta=torch.randn(d_head, generator=gen),
            eps=1e-5,
        )
        for _ in range(2)
    )
    attention = layers[0].attention.__class__(**{**vars(layers[0].attention), "q_norm": q_norm, "k_norm": k_norm})
    layers[0] = LayerWeights(**{**vars(layers[0]), "attention": attention})
    loaded = load_layer_weights(save_layer_weights(layers, tmp_path / "w.safetensors"))
    _assert_same_norm(loaded[0].attention.q_norm, q_norm)
    _assert_same_norm(loaded[0].attention.k_norm, k_norm)
