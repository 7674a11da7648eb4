"""Findings are computed from the data: changing the data changes the verdict."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsens.report.data import DominantCheck, RunData
from attnsens.report.findings import NEAR_ONE, evaluate_findings
from attnsens.store import summarize_rows
from tests.unit.store.synthetic import rows_frame


def _data(rows: pd.DataFrame, *, deviation: float = 0.0) -> RunData:
    dominant = rows["dominant"].astype(bool)
    return RunData(
        run_dir=".",
        tables=("rows",),
        manifest=None,
        summary=summarize_rows(rows),
        rows_sample=rows,
        dominant=DominantCheck(
            n_rows=len(rows),
            n_dominant=int(dominant.sum()),
            fraction_exact_among_dominant=1.0,
            max_abs_deviation_lower=deviation,
            max_abs_deviation_upper=deviation,
        ),
        training=None,
        grad_norms=None,
        bounds=None,
        influence=None,
    )


@pytest.fixture(scope="module")
def rows():
    return rows_frame()


def _by_key(data: RunData) -> dict:
    return {f.key: f for f in evaluate_findings(data)}


def test_verdicts_follow_the_data(rows):
    findings = _by_key(_data(rows))
    assert findings["theta"].status == "disagrees"
    assert findings["concentration"].status == "agrees"
    # 69.8 % of rows are dominant at the last checkpoint: not a minority there
    assert (
        findings["dominant"].status == "disagrees" and "majority at checkpoint(s) 10" in findings["dominant"].measured
    )

    early = rows[rows["step"] == 0]
    findings = _by_key(_data(early))
    assert findings["theta"].status == "agrees"
    assert f"≥ {NEAR_ONE}" in findings["theta"].measured
    assert findings["concentration"].status == "not measured"
    assert findings["dominant"].status == "agrees"


def test_reversed_training_is_reported_as_disagreeing(rows):
    reversed_steps = rows.assign(step=rows["step"].map({0: 100, 10: 10, 100: 0}))
    finding = _by_key(_data(reversed_steps))["concentration"]
    assert finding.status == "disagrees"
    assert "p_max rose by less than 5%" in finding.measured and "entropy did not fall" in finding.measured


def test_a_negligible_change_is_not_called_concentration(rows):
    late = rows[rows["step"] == 100]
    # the same rows at two checkpoints, with p_max nudged up by 1 % and entropy down by 1 %
    nudged = late.assign(step=200, p_max=late["p_max"] * 1.01, entropy=late["entropy"] * 0.99)
    finding = _by_key(_data(pd.concat([late, nudged], ignore_index=True)))["concentration"]
    assert finding.status == "disagrees" and "(+1.0%)" in finding.measured


def test_dominant_rows_off_the_closed_form_are_reported(rows):
    early = rows[rows["step"] == 0]
    finding = _by_key(_data(early, deviation=0.03))["dominant"]
    assert finding.status == "disagrees" and "3.00e-02" in finding.measured


def test_theta_table_is_the_worst_seed_median(rows):
    finding = _by_key(_data(rows))["theta"]
    summary = summarize_rows(rows)
    cell = summary.query("layer == 2 and step == 100 and head == -1")["theta_lower_median"].min()
    assert finding.table.loc[finding.table["layer"] == 2, "step 100"].item() == pytest.approx(cell)
    assert np.isfinite(finding.table.drop(columns="layer").to_numpy()).all()


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
    assert 0 < data.dominant.n_dominant < n_rows
    assert data.dominant.max_abs_deviation_lower < 1e-9
    finding = _by_key(data)["dominant"]
    assert "departs" not in finding.measured
