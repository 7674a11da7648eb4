"""Findings are statistical claims computed from the data: each verdict fires on a table made to show its case.

The synthetic rows vary from sequence to sequence (the resampled unit), so intervals have the width the data give
them; nothing here sets a verdict or an interval directly.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from attnsens.report.bootstrap import interval, unit_weights, weighted_median, weighted_ratio
from attnsens.report.data import DominantCheck, RunData
from attnsens.report.findings import MAJORITY, NEAR_ONE, SHARP, evaluate_findings, findings_records
from attnsens.report.run_statistics import envelope

N_KEYS = 64


def _rows(
    *,
    steps: tuple[int, ...] = (0, 100),
    p_max: dict[int, float] | None = None,
    theta: dict[int, float] | None = None,
    spread: float = 0.0,
    seeds: tuple[int, ...] = (0, 1),
    sequences: int = 8,
    layers: int = 2,
    heads: int = 4,
    per_sequence: int = 6,
    outlier: tuple[int, int, float, float] | None = None,
    dominant_share: dict[int, float] | None = None,
    run_id: str = "run",
) -> pd.DataFrame:
    """Rows with p_max and θ lower bound set per step (θ defaults to what p_max implies, E).

    ``spread`` moves each sequence's θ by up to ±spread (evenly over the sequences), so the sequences disagree;
    ``outlier`` = (layer, head, p_max, θ) gives one head its own rows; ``dominant_share`` makes that share of
    each sequence's rows at a step dominant (p_max 0.7), the share itself spread ±0.1 over the sequences.
    """
    records = []
    for step in steps:
        m0 = (p_max or {}).get(step, 0.05)
        for seed in seeds:
            for batch in range(sequences):
                offset = spread * (2 * batch / max(sequences - 1, 1) - 1)
                share = (dominant_share or {}).get(step, 0.0)
                share = min(max(share + (0.1 * (2 * batch / max(sequences - 1, 1) - 1) if share else 0.0), 0), 1)
                for layer in range(layers):
                    for head in range(heads):
                        for index in range(per_sequence):
                            m = m0
                            value = (theta or {}).get(step)
                            if outlier is not None and (layer, head) == outlier[:2]:
                                m, value = outlier[2], outlier[3]
                            dominant = index < round(share * per_sequence)
                            if dominant:
                                m = 0.7
                            floor = float(envelope(np.array([m]), np.array([1.0]))[0])
                            lower = floor if value is None or dominant else max(value + offset, floor)
                            rest = (1 - m) / (N_KEYS - 1)
                            entropy = -(m * np.log(m) + (N_KEYS - 1) * rest * np.log(rest))
                            records.append(
                                {
                                    "run_id": run_id,
                                    "step": step,
                                    "seed": seed,
                                    "layer": layer,
                                    "head": head,
                                    "batch": batch,
                                    "core": True,
                                    "theta_lower": lower,
                                    "envelope": floor,
                                    "p_max_n": m * N_KEYS,
                                    "normalized_entropy": entropy / np.log(N_KEYS),
                                    "dominant": dominant,
                                    "sink": False,
                                }
                            )
    return pd.DataFrame(records)


def _data(rows: pd.DataFrame, *, kinds: dict[str, str] | None = None, **extra) -> RunData:
    checks = {
        str(run): DominantCheck(
            n_rows=len(part),
            n_dominant=int(part["dominant"].sum()),
            fraction_exact_among_dominant=1.0,
            max_abs_deviation_lower=0.0,
            max_abs_deviation_upper=0.0,
        )
        for run, part in rows.groupby("run_id")
    }
    return RunData(
        run_dir=".",
        tables=("rows",),
        manifest=extra.pop("manifest", None),
        summary=None,
        rows_sample=None,
        training=extra.pop("training", None),
        grad_norms=None,
        bounds=None,
        influence=extra.pop("influence", None),
        dominant_checks=checks,
        run_kinds=kinds or {str(run): "training" for run in rows["run_id"].unique()},
        baselines=extra.pop("baselines", None),
        finding_rows=rows,
    )


def _find(data: RunData, finding: str, *, subset: str = "all", threshold: float | None = None, run_id: str = "run"):
    matches = [
        f
        for f in evaluate_findings(data)
        if f.run_id == run_id
        and f.finding == finding
        and f.subset == subset
        and (threshold is None or f.threshold == threshold)
    ]
    assert len(matches) == 1, matches
    return matches[0]


# The bootstrap itself.


def test_weighted_median_of_unit_weights_equals_the_median_of_the_resampled_rows():
    rng = np.random.default_rng(3)
    values = rng.normal(size=57)
    units = rng.integers(0, 7, size=57)
    weights = rng.multinomial(7, np.full(7, 1 / 7), size=11).astype(float)
    got = weighted_median(values, units, weights)
    for b in range(11):
        resampled = np.repeat(values, weights[b, units].astype(int))
        ordered = np.sort(resampled)
        assert got[b] == ordered[(len(ordered) - 1) // 2]  # the lower median
    ratio = weighted_ratio(values, np.ones_like(values), units, weights)
    for b in range(11):
        assert ratio[b] == pytest.approx(np.repeat(values, weights[b, units].astype(int)).mean())


@pytest.mark.parametrize("case", range(20))
def test_weighted_median_equals_the_lower_median_of_the_resampled_rows_with_ties_and_empty_units(case: int):
    """Ties among the values, units without rows, replicates that draw no unit with rows (NaN)."""
    rng = np.random.default_rng(case)
    n_units, n_rows = int(rng.integers(1, 9)), int(rng.integers(1, 200))
    values = np.round(rng.normal(size=n_rows), int(rng.integers(0, 2)))  # many ties
    units = rng.integers(0, n_units, size=n_rows)
    weights = rng.multinomial(n_units, np.full(n_units, 1 / n_units), size=13).astype(float)
    got = weighted_median(values, units, weights)
    for b in range(13):
        resampled = np.sort(np.repeat(values, weights[b, units].astype(int)))
        expected = resampled[(len(resampled) - 1) // 2] if len(resampled) else np.nan
        assert got[b] == expected or (np.isnan(expected) and np.isnan(got[b]))


def test_two_level_weights_draw_seeds_then_their_sequences():
    weights = unit_weights(np.repeat([0, 1, 2], 5), np.tile(np.arange(5), 3), key="k", replicates=400)
    assert weights.n_units == 15 and weights.n_seeds == 3
    # Every replicate draws 3 seeds of 5 sequences: 15 units in all, in whole seeds' worth per seed.
    assert (weights.weights.sum(axis=1) == 15).all()
    per_seed = weights.weights.reshape(400, 3, 5).sum(axis=2)
    assert (per_seed % 5 == 0).all() and (per_seed == 0).any()  # some replicates leave a seed out
    again = unit_weights(np.repeat([0, 1, 2], 5), np.tile(np.arange(5), 3), key="k", replicates=400)
    assert (again.weights == weights.weights).all()  # seeded by the run id: the same report twice


def test_interval_of_identical_replicates_is_a_point():
    value = interval(0.5, np.full(100, 0.5))
    assert (value.low, value.high) == (0.5, 0.5) and value.above(0.5) and not value.below(0.5)


# θ.


def test_small_p_max_makes_theta_near_one_implied_by_p_max():
    data = _data(_rows(p_max={0: 0.05, 100: 0.08}, theta={0: 0.999, 100: 0.998}))
    theta = _find(data, "theta", threshold=NEAR_ONE)
    assert theta.verdict == "implied by p_max"
    assert theta.details["envelope_ci_low"] >= NEAR_ONE
    assert "follows from p_max alone" in theta.measured
    assert _find(data, "theta", threshold=SHARP).verdict == "implied by p_max"  # E = 1 − 0.08² ≥ 0.99


def test_theta_above_what_p_max_implies_agrees():
    # p_max = 1/3: E = 8/9 < 0.9, so θ ≥ 0.9 is the certificate's, not p_max's.
    data = _data(_rows(p_max={0: 1 / 3, 100: 1 / 3}, theta={0: 0.97, 100: 0.96}))
    theta = _find(data, "theta", threshold=NEAR_ONE)
    assert theta.verdict == "agrees"
    assert theta.ci_low >= NEAR_ONE and theta.details["envelope_statistic"] < NEAR_ONE
    assert theta.details["cells_certificate_adds"] == theta.details["n_cells"] == 4
    assert _find(data, "theta", threshold=SHARP).verdict == "disagrees"  # 0.96 < 0.99 on every sequence


def test_dominant_rows_make_theta_disagree_on_its_envelope():
    data = _data(_rows(p_max={0: 0.05, 100: 0.8}))
    theta = _find(data, "theta", threshold=NEAR_ONE)
    assert theta.verdict == "disagrees" and theta.ci_high < NEAR_ONE
    assert theta.statistic == pytest.approx(4 * 0.8 * 0.2)
    assert theta.statistic == pytest.approx(theta.details["envelope_statistic"])


def test_sequences_that_disagree_make_theta_inconclusive():
    # Each sequence's rows sit at 0.9 ± 0.05: the median is near the threshold and resampling sequences moves it
    # to either side.
    data = _data(_rows(p_max={0: 1 / 3, 100: 1 / 3}, theta={0: 0.97, 100: 0.9}, spread=0.05, seeds=(0,)))
    theta = _find(data, "theta", threshold=NEAR_ONE)
    assert theta.verdict == "inconclusive"
    assert theta.ci_low < NEAR_ONE <= theta.ci_high
    # The same rows with the spread inside each sequence instead are many independent rows, but one unit each:
    # the interval counts sequences, and 8 identical sequences give a point.
    assert theta.n_sequences == 8


def test_a_low_head_is_listed_though_its_layer_agrees():
    rows = _rows(p_max={0: 1 / 3, 100: 1 / 3}, theta={0: 0.97, 100: 0.97}, outlier=(1, 2, 0.8, 0.0), heads=5)
    theta = _find(_data(rows), "theta", threshold=NEAR_ONE)
    assert theta.verdict == "agrees"  # 1 head of 5 does not move the layer's median
    heads = theta.details["heads"]
    assert heads["n_heads"] == 10 and heads["n_below"] == 1
    (head,) = heads["below"]
    assert (head["layer"], head["head"]) == (1, 2) and head["statistic"] == pytest.approx(0.64)
    assert "L1H2 0.640 (E 0.640)" in theta.measured


def test_theta_intervals_widen_with_disagreeing_seeds():
    one = _find(
        _data(_rows(p_max={0: 1 / 3, 100: 1 / 3}, theta={0: 0.97, 100: 0.95}, spread=0.02, seeds=(0,))),
        "theta",
        threshold=NEAR_ONE,
    )
    rows = pd.concat(
        [
            _rows(p_max={0: 1 / 3, 100: 1 / 3}, theta={0: 0.97, 100: 0.95}, spread=0.02, seeds=(0,)),
            _rows(p_max={0: 1 / 3, 100: 1 / 3}, theta={0: 0.97, 100: 0.91}, spread=0.02, seeds=(1,)),
        ]
    )
    two = _find(_data(rows), "theta", threshold=NEAR_ONE)
    assert set(two.details["seed_statistics"]) == {"0", "1"}
    assert two.ci_high - two.ci_low > one.ci_high - one.ci_low


# Concentration.


def test_concentration_is_judged_after_warmup_not_from_a_uniform_start():
    # Uniform at step 0, concentrated by the end of warmup (step 60) and no further: from step 0 it grows 6×.
    rows = _rows(steps=(0, 60, 200), p_max={0: 1 / N_KEYS, 60: 0.1, 200: 0.1})
    manifest = {"config": {"name": "tiny", "train": {"warmup_steps": 60}}}
    finding = _find(_data(rows, manifest=manifest), "concentration")
    assert finding.details["from_step"] == 60 and "end of warmup" in finding.details["from_step_reason"]
    assert finding.verdict == "not observed"
    assert finding.details["from_first_checkpoint"]["growth"]["statistic"] == pytest.approx(6.4)


def test_concentration_after_warmup_agrees():
    rows = _rows(steps=(0, 60, 200), p_max={0: 1 / N_KEYS, 60: 0.03, 200: 0.3})
    finding = _find(_data(rows, manifest={"config": {"train": {"warmup_steps": 60}}}), "concentration")
    assert finding.verdict == "agrees" and finding.ci_low >= 2
    assert finding.details["heads_concentrating"] == finding.details["n_heads"] == 8


def test_the_warm_checkpoint_waits_for_the_eval_loss_to_beat_the_unigram():
    rows = _rows(steps=(0, 60, 120, 200), p_max={0: 0.02, 60: 0.03, 120: 0.05, 200: 0.3})
    training = pd.DataFrame({"run_id": "run", "seed": 0, "step": [60, 120, 200], "eval_loss": [5.6, 5.2, 4.0]})
    baselines = pd.DataFrame({"run_id": "tiny", "name": ["unigram", "bigram"], "eval_loss": [5.5, 4.2]})
    data = _data(rows, manifest={"config": {"train": {"warmup_steps": 60}}}, training=training, baselines=baselines)
    finding = _find(data, "concentration")
    assert finding.details["from_step"] == 120
    assert "eval loss 5.20 below the unigram's 5.50" in finding.details["from_step_reason"]


def test_spreading_attention_disagrees():
    rows = _rows(steps=(0, 60, 200), p_max={0: 0.3, 60: 0.3, 200: 0.03})
    assert _find(_data(rows), "concentration").verdict == "disagrees"


def test_a_pretrained_model_has_no_trajectory():
    rows = _rows(steps=(0,), p_max={0: 0.3}, seeds=(0,), run_id="ref")
    finding = _find(_data(rows, kinds={"ref": "pretrained"}), "concentration", run_id="ref")
    assert finding.verdict == "not measured" and "pretrained" in finding.measured


# Dominant atoms.


def test_a_dominant_minority_agrees_and_the_closed_form_is_a_consistency_check():
    rows = _rows(p_max={0: 0.05, 100: 0.05}, dominant_share={100: 0.3})
    finding = _find(_data(rows), "dominant")
    assert finding.verdict == "agrees" and finding.ci_high < MAJORITY
    assert "Consistency check" in finding.measured


def test_a_majority_near_one_half_is_inconclusive_not_disagrees():
    rows = _rows(p_max={0: 0.05, 100: 0.05}, dominant_share={100: 0.5}, seeds=(0,), per_sequence=10)
    finding = _find(_data(rows), "dominant")
    assert finding.verdict == "inconclusive"
    assert finding.ci_low < MAJORITY <= finding.ci_high


def test_a_clear_majority_disagrees_and_none_is_not_observed():
    rows = _rows(p_max={0: 0.05, 100: 0.05}, dominant_share={100: 0.85})
    assert _find(_data(rows), "dominant").verdict == "disagrees"
    assert _find(_data(_rows(p_max={0: 0.05, 100: 0.05})), "dominant").verdict == "not observed"


# Records.


def test_records_carry_every_documented_key_and_are_strict_json():
    rows = _rows(p_max={0: 1 / 3, 100: 1 / 3}, theta={100: 0.95}, dominant_share={100: 0.2})
    rows.loc[rows["layer"] == 1, "core"] = False
    records = findings_records(evaluate_findings(_data(rows)))
    keys = {
        "run_id",
        "finding",
        "subset",
        "verdict",
        "threshold",
        "statistic",
        "ci_low",
        "ci_high",
        "n_rows",
        "n_sequences",
    }
    for record in records:
        assert keys <= set(record)
        assert record["verdict"] in {
            "agrees",
            "disagrees",
            "inconclusive",
            "implied by p_max",
            "not observed",
            "not measured",
        }
    json.dumps(records, allow_nan=False)
    assert {(r["finding"], r["subset"]) for r in records} >= {
        ("theta", "all"),
        ("theta", "core"),
        ("concentration", "all"),
        ("dominant", "core"),
    }
    core = [r for r in records if r["subset"] == "core" and r["finding"] == "theta"]
    assert all(r["n_rows"] == len(rows) // 2 for r in core)
