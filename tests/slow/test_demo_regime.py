"""What the tiny preset and the demo are tuned for (slow: trains tiny GPTs for real).

The preset's own schedule (``attnsens study --config tiny``, 1,200 steps) learns more than bigram statistics: eval
loss clearly below the best bigram, heads that form (median p_max·n at the last checkpoint at least 5× its value at
step 0 in most layers), and a layer whose mean normalized entropy falls well below 0.9. The demo (``make demo``, its
flags read from the Makefile) trains a LayerNorm-free GPT beside Pre-LN for the influence experiment, and that
experiment is informative only where attention is not uniform: median p_max·n ≥ 3 in some layer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from attnsens.report.cells import layer_cells_of
from attnsens.store import read_table
from attnsens.study.study import StudyConfig, influence_path, run_study

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def demo_flags() -> dict[str, str]:
    """The flags of ``make demo``'s ``attnsens study`` command."""
    line = next(line for line in MAKEFILE.read_text().splitlines() if "attnsens study" in line)
    return dict(re.findall(r"--([a-z-]+) (\S+)", line))


def test_the_tiny_preset_learns_more_than_bigrams(tmp_path: Path) -> None:
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


def test_the_demos_ln_free_gpt_is_not_uniform_and_its_influence_is_measured(tmp_path: Path) -> None:
    """The demo's LayerNorm-free runs, trained as ``make demo`` trains them (seed 0 here): attention concentrates
    (median p_max·n ≥ 3 in some layer at the last checkpoint), and the study measures influence there with at least
    16 samples per length, a slope with its interval, the certified constant and each layer's A_k; the report
    shows the influence section."""
    flags = demo_flags()
    assert "none" in flags["placements"].split(",")
    config = StudyConfig.from_preset("tiny", seeds=(0,), placements=("none",), steps=int(flags["steps"]), bounds=False)
    run_study(config, tmp_path)

    cells = layer_cells_of(read_table(tmp_path / "rows"))
    last = cells[(cells["subset"] == "all") & (cells["step"] == config.train.steps)]
    assert last["p_max_n_median"].max() >= 3, last["p_max_n_median"].tolist()

    influence = read_table(tmp_path / influence_path("none", 0))
    assert (influence["n_samples"] >= 16).all() and influence["n"].nunique() >= 5
    findings = json.loads((tmp_path / "findings.json").read_text(encoding="utf-8"))
    (finding,) = [f for f in findings if f["finding"] == "influence"]
    assert finding["ci_low"] < finding["statistic"] < finding["ci_high"]
    assert finding["log10_certified_C"] is not None and finding["input_set_log10_C"] is not None
    assert max(finding["p_max_n_median_per_layer"]) >= 3
    report = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert '<section id="influence">' in report and "A_k (certified recursion)" in report
