"""Findings are computed from the data: each verdict rule fires on a table made to show its case."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsens.report.cells import EARLY_KEYS, layer_cells_of
from attnsens.report.data import DominantCheck, RunData
from attnsens.report.findings import (
    CONCENTRATION_FACTOR,
    DOMINANT_MIN_FRACTION,
    NEAR_ONE,
    TRIVIAL_P_MAX,
    evaluate_findings,
)
from tests.unit.store.synthetic import rows_frame


def _rows(
    *,
    steps: tuple[int, ...] = (0, 100),
    p_max: dict[int, float],
    theta: dict[int, float] | None = None,
    seeds: tuple[int, ...] = (0, 1),
    layers: int = 3,
    n_keys: int = 64,
    n_rows: int = 40,
    dominant_rows: dict[int, int] | None = None,
    sink: bool = False,
    run_id: str = "run",
) -> pd.DataFrame:
    """Rows whose statistics are set per step: p_max, θ lower bound, and how many rows are dominant.

    Normalized entropy and n_eff follow p_max as for a row with one heavy key and a uniform rest.
    """
    records = []
    for step in steps:
        m = p_max[step]
        rest = (1 - m) / (n_keys - 1)
        entropy = -(m * np.log(m) + (n_keys - 1) * rest * np.log(rest))
        for seed in seeds:
            for layer in range(layers):
                for index in range(n_rows):
                    dominant = index < (dominant_rows or {}).get(step, 0)
                    row_max = 0.7 if dominant else m
                    value = (theta or {}).get(step, max(1 - m**2, 0.0))
                    records.append(
                        {
                            "run_id": run_id,
                            "model": "m",
                            "step": step,
                            "seed": seed,
                            "layer": layer,
                            "head": index % 2,
                            "batch": 0,
                            "query": index,
                            "n_keys": n_keys,
                            "row_sum": 1.0,
                            "p_max": row_max,
                            "argmax": 0 if sink and dominant else 5,
                            "entropy": entropy,
                            "normalized_entropy": entropy / np.log(n_keys),
                            "n_eff": 1 / (m**2 + (n_keys - 1) * rest**2),
                            "theta_lower": 4 * row_max * (1 - row_max) if dominant else value,
                            "theta_upper": 4 * row_max * (1 - row_max) if dominant else value,
                            "theta_exact": True,
                            "theta_method": 1,
                            "dominant": dominant,
                        }
                    )
    return pd.DataFrame(records)


def _data(rows: pd.DataFrame, *, deviation: float = 0.0, kinds: dict[str, str] | None = None) -> RunData:
    checks = {
        str(run): DominantCheck(
            n_rows=len(part),
            n_dominant=int(part["dominant"].sum()),
            fraction_exact_among_dominant=1.0,
            max_abs_deviation_lower=deviation,
            max_abs_deviation_upper=deviation,
        )
        for run, part in rows.groupby("run_id")
    }
    cells = layer_cells_of(rows)
    return RunData(
        run_dir=".",
        tables=("rows",),
        manifest=None,
        summary=None,
        rows_sample=rows,
        training=None,
        grad_norms=None,
        bounds=None,
        influence=None,
        cells=cells,
        dominant_checks=checks,
        run_kinds=kinds or {str(run): "training" for run in rows["run_id"].unique()},
    )


def _by_key(data: RunData, run_id: str = "run") -> dict:
    return {f.key: f for f in evaluate_findings(data) if f.run_id == run_id}


def test_near_uniform_attention_makes_theta_near_one_trivially_implied():
    findings = _by_key(_data(_rows(p_max={0: 0.02, 100: 0.06})))
    theta = findings["theta"]
    assert theta.status == "trivially implied"
    assert f"≥ {NEAR_ONE}" in theta.measured and f"{TRIVIAL_P_MAX:.3f}" in theta.measured
    # p_max·n grows 3.84 / 1.28 = 3×, but entropy barely moves: below the entropy threshold
    assert findings["concentration"].status == "not observed"
    assert findings["dominant"].status == "not observed" and "no dominant rows" in findings["dominant"].measured


def test_concentrated_attention_with_theta_near_one_agrees():
    rows = _rows(p_max={0: 0.02, 100: 0.4}, theta={100: 0.93}, dominant_rows={100: 4})
    findings = _by_key(_data(rows))
    assert findings["theta"].status == "agrees" and "property of the model" in findings["theta"].measured
    concentration = findings["concentration"]
    assert concentration.status == "agrees"
    assert f"≥ {CONCENTRATION_FACTOR:g}×" in concentration.measured and "L0 20.0×" in concentration.measured
    dominant = findings["dominant"]
    assert dominant.status == "agrees" and "10.0 % at checkpoint 100" in dominant.measured


def test_low_theta_disagrees_and_says_whether_sinks_explain_it():
    rows = _rows(p_max={0: 0.02, 100: 0.4}, theta={100: 0.5})
    theta = _by_key(_data(rows))["theta"]
    assert theta.status == "disagrees" and "6 of 12 cells fall below" in theta.measured
    assert "still below" in theta.measured

    # The low rows are dominant sink rows (θ = 4·0.7·0.3 = 0.84): the core rows are near uniform.
    low = _rows(p_max={0: 0.02, 100: 0.05}, dominant_rows={100: 30}, sink=True)
    theta = _by_key(_data(low))["theta"]
    assert theta.status == "disagrees" and "come from those rows" in theta.measured


def test_reversed_training_disagrees_and_a_negligible_change_is_not_observed():
    reversed_rows = _rows(p_max={0: 0.4, 100: 0.02})
    assert _by_key(_data(reversed_rows))["concentration"].status == "disagrees"
    nudged = _rows(p_max={0: 0.30, 100: 0.31})
    assert _by_key(_data(nudged))["concentration"].status == "not observed"


def test_a_trace_of_dominant_rows_is_not_observed_and_a_majority_disagrees():
    # one dominant row in 200 at the last checkpoint: 0.5 % < 1 %
    rows = _rows(p_max={0: 0.02, 100: 0.05}, dominant_rows={100: 1}, layers=1, seeds=(0,), n_rows=200)
    dominant = _by_key(_data(rows))["dominant"]
    assert dominant.status == "not observed" and f"{DOMINANT_MIN_FRACTION:.0%} threshold" in dominant.measured
    assert "1 of 400 (0.25 %) overall, 0.5 % at checkpoint 100" in dominant.measured  # never "0.0 %"

    majority = _by_key(_data(_rows(p_max={0: 0.02, 100: 0.05}, dominant_rows={100: 30}, sink=True)))["dominant"]
    assert majority.status == "disagrees" and "majority in 6 of 12 cells" in majority.measured
    assert "180 of 180 (100.0 %) of those rows are sink rows" in majority.measured


def test_dominant_rows_off_the_closed_form_disagree():
    rows = _rows(p_max={0: 0.02, 100: 0.4}, dominant_rows={100: 4})
    finding = _by_key(_data(rows, deviation=0.03))["dominant"]
    assert finding.status == "disagrees" and "3.00e-02" in finding.measured


def test_pretrained_runs_have_no_trajectory_and_are_judged_separately():
    trained = _rows(p_max={0: 0.02, 100: 0.4}, theta={100: 0.95})
    reference = _rows(steps=(0,), p_max={0: 0.5}, theta={0: 0.6}, seeds=(0,), run_id="reference", n_keys=90)
    data = _data(pd.concat([trained, reference]), kinds={"run": "training", "reference": "pretrained"})
    assert _by_key(data)["theta"].status == "agrees"
    pretrained = _by_key(data, "reference")
    assert pretrained["concentration"].status == "not measured" and "pretrained" in pretrained["concentration"].measured
    assert "median p_max·n 45.00" in pretrained["concentration"].measured
    assert pretrained["theta"].status == "disagrees"
    assert list(pretrained["dominant"].table.columns) == ["layer", "pretrained"]  # not "step 0"
    for finding in pretrained.values():  # a pretrained model has no checkpoints and no seeds
        assert not any(word in finding.measured for word in ("step 0", "checkpoint 0", "seed 0")), finding.measured
    assert "in each of 3 layers" in pretrained["theta"].measured
    # Its table has one value a cell, and the caption says no more than that.
    assert pretrained["theta"].table_caption == (
        "Per layer: median θ lower bound, all rows and core rows (no sinks, no early rows)."
    )
    assert _by_key(data)["theta"].table_caption == (
        "Per layer: median θ lower bound, first → last checkpoint (means over seeds; [min, max] over seeds at the "
        "last), all rows and core rows (no sinks, no early rows)."
    )
    one_seed = _by_key(_data(_rows(p_max={0: 0.02, 100: 0.4}, seeds=(3,))))
    assert "first → last checkpoint, all rows" in one_seed["theta"].table_caption
    assert one_seed["concentration"].table_caption.endswith("(uniform attention has 1 for all three).")


def test_cells_leave_sink_and_early_rows_out_of_the_core():
    rows = rows_frame()
    cells = layer_cells_of(rows)
    every = cells[cells["subset"] == "all"].set_index(["run_id", "step", "seed", "layer"])
    core = cells[cells["subset"] == "core"].set_index(["run_id", "step", "seed", "layer"])
    kept = rows[(rows["argmax"] != 0) & (rows["n_keys"] >= EARLY_KEYS)]
    assert core["n_rows"].sum() == len(kept) and every["n_rows"].sum() == len(rows)
    key = (rows["run_id"].iloc[0], 100, 1, 2)
    part = rows[(rows["step"] == 100) & (rows["seed"] == 1) & (rows["layer"] == 2)]
    assert every.loc[key, "n_sink"] == (part["argmax"] == 0).sum()
    assert every.loc[key, "p_max_n_median"] == pytest.approx((part["p_max"] * part["n_keys"]).median())
    assert every.loc[key, "trivial_lower_median"] == pytest.approx((part["row_sum"] - part["p_max"] ** 2).median())
    # θ ≥ s − p_max² for every row: the exact θ of the synthetic rows never falls below it
    assert (rows["theta_lower"] >= rows["row_sum"] - rows["p_max"] ** 2 - 1e-12).all()


def test_rows_certified_by_the_theta_engine_sit_on_the_closed_form(tmp_path):
    """Real certificates (attnsens.theta.certify on float32 softmax rows) pass the dominant-row check."""
    import torch

    import attnsens
    from attnsens.report.data import load_run
    from attnsens.store import write_parquet

    generator = torch.Generator().manual_seed(5)
    n_rows, n_keys = 211, 37
    scale = torch.linspace(0.2, 6.0, n_rows, dtype=torch.float64)[:, None]
    p = torch.softmax(torch.randn(n_rows, n_keys, generator=generator, dtype=torch.float64) * scale, -1).float()
    certificate = attnsens.theta.certify(p)
    p64 = p.double()
    entropy = -(p64 * torch.log(p64)).sum(-1)
    rows = pd.DataFrame(
        {
            "run_id": "r",
            "model": "m",
            "step": 0,
            "seed": 0,
            "layer": np.arange(n_rows) % 3,
            "head": np.arange(n_rows) % 2,
            "batch": 0,
            "query": np.arange(n_rows),
            "n_keys": n_keys,
            "row_sum": certificate.row_sum.numpy(),
            "p_max": certificate.p_max.numpy(),
            "argmax": p.argmax(-1).numpy(),
            "entropy": entropy.numpy(),
            "normalized_entropy": (entropy / np.log(n_keys)).numpy(),
            "n_eff": (1 / (p64**2).sum(-1)).numpy(),
            "theta_lower": certificate.lower.numpy(),
            "theta_upper": certificate.upper.numpy(),
            "theta_exact": certificate.exact.numpy(),
            "theta_method": certificate.method.numpy(),
            "dominant": (certificate.p_max >= certificate.row_sum / 2).numpy(),
        }
    )
    write_parquet(rows, tmp_path / "rows" / "part.parquet", schema="rows")
    data = load_run(tmp_path)
    assert 0 < data.dominant_checks["r"].n_dominant < n_rows
    assert data.dominant_checks["r"].max_abs_deviation_lower < 1e-9
    assert data.run_kinds == {"r": "pretrained"}
    finding = _by_key(data, "r")["dominant"]
    assert "departs" not in finding.measured


def test_dominant_table_prints_every_share_in_one_format() -> None:
    """Shares as percentages throughout (the table once mixed 9.766e-04 with 0.0020)."""
    rows = _rows(p_max={0: 0.02, 100: 0.05}, dominant_rows={100: 1}, layers=1, seeds=(0,), n_rows=200)
    table = _by_key(_data(rows))["dominant"].table
    assert table is not None
    assert table.drop(columns="checkpoint").to_numpy().tolist() == [["0 %"], ["0.5 %"]]


def test_dominant_table_puts_the_longer_of_layers_and_checkpoints_down_the_page() -> None:
    """Thirteen checkpoints of four layers are thirteen rows (the table fits an 800 px page); two checkpoints of
    three layers stay one row per layer."""
    steps = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1200)
    rows = _rows(
        steps=steps, p_max=dict.fromkeys(steps, 0.05), dominant_rows={1200: 1}, layers=4, seeds=(0,), n_rows=20
    )
    table = _by_key(_data(rows))["dominant"].table
    assert table is not None
    assert list(table.columns) == ["checkpoint", "layer 0", "layer 1", "layer 2", "layer 3"]
    assert table["checkpoint"].tolist() == [f"step {step:,}" for step in steps]
    rows = _rows(p_max={0: 0.02, 100: 0.05}, dominant_rows={100: 1}, layers=3, seeds=(0,), n_rows=200)
    table = _by_key(_data(rows))["dominant"].table
    assert table is not None and list(table.columns) == ["layer", "step 0", "step 100"]
