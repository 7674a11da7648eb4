"""The demo's own configuration reaches the regime the paper describes (slow: trains a tiny GPT for real).

The thresholds are those the study's demo is tuned for: eval loss clearly below the best bigram, heads that
form (median p_max·n at the last checkpoint at least 5× its value at step 0 in most layers), and a layer whose
mean normalized entropy falls well below 0.9.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attnsens.report.cells import layer_cells_of
from attnsens.store import read_table
from attnsens.study.study import StudyConfig, run_study

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def test_the_demo_configuration_reaches_the_regime(tmp_path: Path) -> None:
    config = StudyConfig.from_preset("tiny", seeds=(0,), bounds=False)
    run_study(config, tmp_path)

    training = read_table(tmp_path / "training")
    final_eval = training.dropna(subset=["eval_loss"]).sort_values("step")["eval_loss"].iloc[-1]
    baselines = read_table(tmp_path / "baselines").set_index("name")
    assert final_eval < baselines.loc["bigram", "eval_loss"] - 0.1  # 3.81 against 3.99 when tuned

    cells = layer_cells_of(read_table(tmp_path / "rows"))
    cells = cells[cells["subset"] == "all"].set_index(["step", "layer"])
    first, last = cells.loc[0], cells.loc[config.train.steps]
    growth = last["p_max_n_median"] / first["p_max_n_median"]
    assert (growth >= 5).sum() > len(growth) / 2, growth.to_dict()
    assert last["normalized_entropy_mean"].min() < 0.85


def test_post_ln_trains_with_its_own_warmup_in_the_tiny_study(tmp_path: Path) -> None:
    """``--placements pre,post``: the tiny Post-LN GPT, warmed up over 300 steps to 2e-3 (StudyConfig.train_for),
    ends below the bigram baseline. With Pre-LN's 60 steps to 6e-3 it stayed at the unigram loss."""
    config = StudyConfig.from_preset("tiny", seeds=(0,), placements=("post",), bounds=False)
    assert (config.train_for("post").lr, config.train_for("post").warmup_steps) == (2e-3, 300)
    run_study(config, tmp_path)

    training = read_table(tmp_path / "training")
    final_eval = training.dropna(subset=["eval_loss"]).sort_values("step")["eval_loss"].iloc[-1]
    baselines = read_table(tmp_path / "baselines").set_index("name")
    assert final_eval < baselines.loc["bigram", "eval_loss"] - 0.1  # 3.66 against 3.99 when tuned
