"""Bounds estimates draw from generators keyed by (run, seed, step, layer): never from torch's global generator."""

from __future__ import annotations

import pandas as pd
import torch

from attnsens.seeding import derived_generator, derived_seed
from attnsens.study.bounds import bound_model
from tests.unit.geometry.tiny_layers import tiny_layers

FAST = {"seq_len": 7, "n_queries": 3, "iterations": 3}


def test_estimates_do_not_depend_on_the_global_generator() -> None:
    layers = tiny_layers(placement="pre", n_layer=2)
    torch.manual_seed(1)
    first = bound_model(layers, run_id="r", step=4, seed=1, **FAST)
    torch.manual_seed(2)
    torch.rand(1000)
    second = bound_model(layers, run_id="r", step=4, seed=1, **FAST)
    pd.testing.assert_frame_equal(first, second)
    assert set(first["step"]) == {4} and set(first["seed"]) == {1}


def test_each_key_has_its_own_stream() -> None:
    layers = tiny_layers(placement="pre", n_layer=2)
    base = bound_model(layers, run_id="r", step=4, seed=1, **FAST)["mha_jacobian_estimate"]
    other = bound_model(layers, run_id="r", step=8, seed=1, **FAST)["mha_jacobian_estimate"]
    assert not base.equals(other)
    assert derived_seed("r", 1, 4, 0) != derived_seed("r", 1, 4, 1) < 2**63
    a, b = (torch.rand(5, generator=derived_generator("r", 1, 4, 0)) for _ in range(2))
    assert torch.equal(a, b)
