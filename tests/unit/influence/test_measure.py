"""The measurement harness: table shape, determinism, batching, models without a certificate."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from attnsens.errors import ConfigError
from attnsens.influence import builtin_lnfree, measure
from attnsens.influence.experiment import run_influence

COLUMNS = ["n", "position_kind", "influence_max", "influence_median", "tv_max", "tv_median", "n_samples"]


def test_table_has_one_row_per_length_and_position_kind() -> None:
    table = measure(builtin_lnfree(), (5, 11), n_samples=3)
    assert list(table.columns) == COLUMNS
    assert list(zip(table.n, table.position_kind, strict=True)) == [
        (n, kind) for n in (5, 11) for kind in ("first", "middle", "random")
    ]
    assert (table.influence_median <= table.influence_max).all()
    assert ((table.tv_max >= 0) & (table.tv_max <= 1)).all()


def test_seeded_and_independent_of_batch_size() -> None:
    model = builtin_lnfree()
    # In float64, so that the comparison is not at the mercy of float32 GEMM kernels whose rounding depends on
    # the batch shape (a TV of 3e-4 is a difference of nearly equal float32 numbers).
    one = measure(model, (7, 13), n_samples=4, seed=5, batch_size=1, dtype=torch.float64)
    many = measure(model, (7, 13), n_samples=4, seed=5, dtype=torch.float64)
    pd.testing.assert_frame_equal(one, many, rtol=1e-9, atol=1e-12)
    other = measure(model, (7, 13), n_samples=4, seed=6)
    assert not one.influence_max.equals(other.influence_max)


def test_matches_a_naive_per_sample_loop() -> None:
    """Recompute one length by hand: forward x and x' one at a time through the model's own logits."""
    model = builtin_lnfree()
    n, samples = 9, 2
    table = measure(model, (n,), n_samples=samples, positions=("first",), seed=1)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 32, (samples, n), generator=generator)
    shift = torch.randint(1, 32, (samples,), generator=generator)
    captured: list[torch.Tensor] = []
    handle = model.hook_final.register_forward_hook(lambda _m, _i, out: captured.append(out[:, -1]))
    influences, tvs = [], []
    with torch.no_grad():
        for k in range(samples):
            replaced = tokens[k].clone()
            replaced[0] = (replaced[0] + shift[k]) % 32
            p = torch.softmax(model(tokens[k : k + 1])[0, -1].double(), -1)
            q = torch.softmax(model(replaced[None])[0, -1].double(), -1)
            influences.append(float(torch.linalg.vector_norm(captured[-2] - captured[-1])))
            tvs.append(float(0.5 * (p - q).abs().sum()))
    handle.remove()
    assert table.influence_max.iloc[0] == pytest.approx(max(influences), rel=1e-5)
    assert table.tv_max.iloc[0] == pytest.approx(max(tvs), rel=1e-4)


def test_bad_arguments_are_refused() -> None:
    model = builtin_lnfree()
    with pytest.raises(ConfigError, match="positions"):
        measure(model, (8,), positions=("last",))
    with pytest.raises(ConfigError, match="length"):
        measure(model, (1,))


def test_transformers_model_is_measured_without_a_certificate() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from attnsens.models import load

    torch.manual_seed(0)
    module = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=6, vocab_size=13, n_positions=29))
    result = run_influence(load(module), (4, 8, 16, 29), name="tiny-gpt2", n_samples=2)
    assert not result.certificate.applicable
    assert result.table.influence_upper_bound.isna().all()
    assert result.table.tv_max.notna().all() and (result.table.influence_max > 0).all()
    summary = result.summary()
    assert summary["certified_C"] is None and summary["reasons"]
    with pytest.raises(ConfigError, match="29"):
        measure(load(module), (30,))
