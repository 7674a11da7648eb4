"""summarize_rows (docs/math.md A3) against numpy on the synthetic rows, per head and pooled per layer."""

from __future__ import annotations

import numpy as np
import pytest

from attnsens.store import ALL_HEADS, get_schema, summarize_rows
from attnsens.store.parquet import conform
from tests.unit.store.synthetic import N_HEADS, rows_frame


@pytest.fixture(scope="module")
def rows():
    return rows_frame()


def test_summary_matches_numpy_per_head_and_pooled(rows):
    summary = summarize_rows(rows)
    conform(summary, "summary")
    assert list(summary.columns) == list(get_schema("summary").names)

    one = rows[(rows.step == 10) & (rows.seed == 1) & (rows.layer == 2) & (rows["head"] == 3)]
    record = summary[(summary.step == 10) & (summary.seed == 1) & (summary.layer == 2) & (summary["head"] == 3)]
    assert len(record) == 1
    record = record.iloc[0]
    assert record.n_rows == len(one)
    np.testing.assert_allclose(record.theta_lower_median, np.median(one.theta_lower))
    np.testing.assert_allclose(record.theta_lower_q10, np.quantile(one.theta_lower, 0.1))
    np.testing.assert_allclose(record.theta_lower_q90, np.quantile(one.theta_lower, 0.9))
    np.testing.assert_allclose(record.fraction_dominant, one.dominant.mean())
    np.testing.assert_allclose(record.p_max_median, np.median(one.p_max))
    np.testing.assert_allclose(record.n_eff_mean, one.n_eff.mean())

    layer = rows[(rows.step == 10) & (rows.seed == 1) & (rows.layer == 2)]
    pooled = summary[(summary.step == 10) & (summary.seed == 1) & (summary.layer == 2) & (summary["head"] == ALL_HEADS)]
    assert pooled.iloc[0].n_rows == len(layer) == N_HEADS * len(one)
    # a pooled median is a median over rows, not a median of per-head medians
    np.testing.assert_allclose(pooled.iloc[0].theta_lower_median, np.median(layer.theta_lower))


def test_levels_and_empty_input(rows):
    assert (summarize_rows(rows, level="layer")["head"] == ALL_HEADS).all()
    assert (summarize_rows(rows, level="head")["head"] >= 0).all()
    empty = summarize_rows(rows.iloc[:0])
    assert empty.empty and list(empty.columns) == list(get_schema("summary").names)
    with pytest.raises(ValueError, match="lacks columns"):
        summarize_rows(rows.drop(columns=["p_max"]))
