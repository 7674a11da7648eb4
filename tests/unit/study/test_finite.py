"""Bad weights are named before any forward: layer and parameter for NaN/±Inf, the layer for a linear-algebra
failure; nothing is written."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import attnsens as A
from attnsens.cli import app
from attnsens.errors import InputError
from attnsens.store.layer_weights import save_layer_weights
from attnsens.study.bounds import bound_model
from attnsens.train.model import GPT, GPTConfig
from tests.unit.geometry.tiny_layers import tiny_layers

FAST = {"seq_len": 7, "n_queries": 3, "iterations": 2}


def _gpt_with(value: float) -> GPT:
    model = GPT(GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=16, d_ff=24, max_positions=16))
    with torch.no_grad():
        model.blocks[1].attn.c_attn.weight[2, 3] = value
    return model.eval()


@pytest.mark.parametrize(("value", "counts"), [(float("nan"), "1 NaN and 0 ±Inf"), (float("inf"), "0 NaN and 1 ±Inf")])
def test_audit_names_the_layer_and_parameter_and_writes_nothing(tmp_path, value, counts) -> None:
    tokens = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(0))
    with pytest.raises(InputError, match=rf"layer 1, parameter 'blocks\.1\.attn\.c_attn\.weight' .*{counts}"):
        A.study.audit(_gpt_with(value), tokens, out_dir=tmp_path / "out")
    assert not list((tmp_path / "out").rglob("*.parquet"))
    with pytest.raises(InputError, match=r"layer 1, parameter 'blocks\.1\.attn\.c_attn\.weight'"):
        bound_model(A.models.load(_gpt_with(value)), tokens, **FAST)


def test_bounds_of_layer_weights_name_the_tensor(tmp_path) -> None:
    layers = tiny_layers(n_layer=2)
    layers[1].mlp.w_in[0, 0] = float("nan")
    with pytest.raises(InputError, match=r"layer 1, parameter 'layers\.1\.mlp\.w_in'"):
        bound_model(layers, **FAST)
    path = save_layer_weights(layers, tmp_path / "bad.safetensors")
    result = CliRunner().invoke(app, ["bounds", str(path)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "layers.1.mlp.w_in" in result.output
    sandwich = tiny_layers(n_layer=1, out_norms=True)
    sandwich[0].attn_out_norm.gamma[2] = float("inf")
    with pytest.raises(InputError, match=r"layer 0, parameter 'layers\.0\.attn_out_norm\.gamma'"):
        bound_model(sandwich, **FAST)


def test_a_linear_algebra_failure_names_the_layer(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise torch.linalg.LinAlgError("linalg.svd: The algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "svd", fail)
    with pytest.raises(InputError, match=r"^layer 0 of layers: .*failed to converge.*check that layer's weights"):
        bound_model(tiny_layers(n_layer=2), **FAST)


def test_finite_weights_whose_sum_overflows_pass_and_a_single_bad_entry_is_found() -> None:
    """The check reads each tensor once through its sum; a sum that overflows (finite entries) or is NaN/±Inf
    is settled entry by entry, so neither a false alarm nor a missed entry is possible."""
    from attnsens.study.finite import check_finite_module

    module = torch.nn.Linear(4, 3)
    with torch.no_grad():
        module.weight.fill_(3e38)  # every entry finite, the float32 sum overflows to +inf
    check_finite_module(module, name="m")
    for bad in (float("nan"), float("inf"), -float("inf")):
        with torch.no_grad():
            module.weight.fill_(1.0)
            module.weight[2, 1] = bad
        with pytest.raises(InputError, match=r"parameter 'weight' \(3, 4\)"):
            check_finite_module(module, name="m")
    with torch.no_grad():  # +inf and −inf: their sum is NaN
        module.weight[0, 0], module.weight[0, 1] = float("inf"), -float("inf")
    with pytest.raises(InputError, match="0 NaN and 3 ±Inf"):
        check_finite_module(module, name="m")


def test_a_weight_written_after_a_passed_check_is_read_again() -> None:
    """Checked weights are not read twice while unchanged; an in-place write (an optimizer step, a fill) makes the
    next check read the tensor again and find the NaN."""
    from attnsens.study.finite import check_finite_module

    module = torch.nn.Linear(4, 4)
    check_finite_module(module, name="m")
    check_finite_module(module, name="m")
    with torch.no_grad():
        module.weight[1, 2] = float("nan")
    with pytest.raises(InputError, match="NaN"):
        check_finite_module(module, name="m")
