"""``audit(..., exact_support=N)``: the same rows table with every row of at most N keys proved exact, the choice
recorded in the run folder's config, and an invalid value refused before anything loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnsens.models as M
from attnsens.errors import ConfigError
from attnsens.study.auditing import audit
from tests.unit.models.tiny_models import VOCAB, tiny_model

N_TOKENS = 40


@pytest.fixture(scope="module")
def causal_lm() -> M.ModelAdapter:
    return M.load(tiny_model("llama"))


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, N_TOKENS), generator=torch.Generator().manual_seed(5))


def test_every_row_up_to_the_support_is_exact_and_inside_the_default_interval(
    causal_lm: M.ModelAdapter, ids: torch.Tensor
) -> None:
    default = audit(causal_lm, ids).rows
    proved = audit(causal_lm, ids, exact_support=N_TOKENS).rows
    assert not bool(default["theta_exact"].all())  # the premise: some rows of 25–40 keys stay unproved
    assert bool(proved["theta_exact"].all())
    assert (proved["theta_lower"] >= default["theta_lower"]).all()
    assert (proved["theta_upper"] <= default["theta_upper"]).all()
    for column in ("p_max", "entropy", "n_eff", "layer", "head", "query"):
        assert (proved[column] == default[column]).all(), column


def test_the_choice_is_part_of_the_run_config(causal_lm: M.ModelAdapter, ids: torch.Tensor, tmp_path: Path) -> None:
    audit(causal_lm, ids, out_dir=tmp_path / "run", exact_support=32)
    with pytest.raises(ConfigError, match="exact_support"):
        audit(causal_lm, ids, out_dir=tmp_path / "run")  # resuming with another choice would mix two certificates
    again = audit(causal_lm, ids, out_dir=tmp_path / "run", exact_support=32)
    assert bool(again.rows.loc[again.rows["n_keys"] <= 32, "theta_exact"].all())


@pytest.mark.parametrize("value", [23, 49])
def test_an_invalid_support_is_refused_before_the_model_loads(value: int) -> None:
    with pytest.raises(ConfigError, match=f"exact_support={value} must lie in"):
        audit("no/such/model", torch.zeros(1, 4, dtype=torch.long), exact_support=value)
