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


def _pandas_reference(rows, pooled: bool):
    """The aggregates by pandas' groupby (the oracle for the sort-based implementation)."""
    frame = rows.assign(head=ALL_HEADS) if pooled else rows
    keys = ["run_id", "model", "step", "seed", "layer", "head"]
    grouped = frame.groupby(keys, sort=True, observed=True, dropna=False)
    out = grouped.agg(
        n_rows=("theta_lower", "size"),
        theta_lower_median=("theta_lower", "median"),
        theta_upper_median=("theta_upper", "median"),
        fraction_exact=("theta_exact", "mean"),
        fraction_dominant=("dominant", "mean"),
        p_max_median=("p_max", "median"),
        p_max_mean=("p_max", "mean"),
        entropy_mean=("entropy", "mean"),
        normalized_entropy_mean=("normalized_entropy", "mean"),
        n_eff_mean=("n_eff", "mean"),
    )
    for q in (10, 25, 75, 90):
        out[f"theta_lower_q{q}"] = grouped["theta_lower"].quantile(q / 100)
    return out.reset_index()


@pytest.mark.parametrize("tiny_groups", [False, True], ids=["loop", "lexsort"])
def test_summary_equals_pandas_groupby_on_mixed_keys_and_missing_values(rows, tiny_groups):
    """Two runs and models (text keys that vary), a step range too wide for a lookup table, missing values in a
    median column and a mean column; with ``tiny_groups`` every group holds two rows (the lexicographic sort)."""
    import pandas as pd

    mixed = pd.concat([rows, rows.assign(run_id="run-b", model="other", step=rows.step * 10**9)], ignore_index=True)
    mixed["seed"] = mixed["seed"].astype("int64")
    rng = np.random.default_rng(3)
    mixed.loc[rng.random(len(mixed)) < 0.05, "theta_upper"] = np.nan
    mixed.loc[rng.random(len(mixed)) < 0.05, "entropy"] = np.nan
    if tiny_groups:
        mixed["head"] = (np.arange(len(mixed)) // 2).astype(mixed["head"].dtype)
    summary = summarize_rows(mixed)
    for pooled in (False, True):
        ours = summary[(summary["head"] == ALL_HEADS) == pooled].reset_index(drop=True)
        reference = _pandas_reference(mixed, pooled).sort_values(list(get_schema("summary").key), ignore_index=True)
        assert len(ours) == len(reference)
        for name in reference.columns:
            if reference[name].dtype.kind in "fc":
                np.testing.assert_allclose(ours[name].to_numpy(), reference[name].to_numpy(), rtol=1e-12, atol=0)
            else:
                assert (ours[name].to_numpy() == reference[name].to_numpy()).all(), name


def test_median_of_two_values_never_exceeds_the_upper_one(rows):
    """T2(f) reads a median lower bound as 'half the rows are at least this': with an even count the mean of the
    two middle values is used, never above the upper of them."""
    two = rows.iloc[:2].copy()
    two["theta_lower"] = [0.1, np.nextafter(0.1, 1.0)]
    median = summarize_rows(two, level="head")["theta_lower_median"].iloc[0]
    assert two["theta_lower"].min() <= median <= two["theta_lower"].max()


@pytest.mark.parametrize("with_missing", [False, True], ids=["complete", "missing values"])
def test_columns_summarize_as_the_frame_of_the_same_rows_bit_for_bit(rows, with_missing):
    """``summarize_columns`` on one step and seed's arrays gives exactly ``summarize_rows``'s records on the frame of
    those rows, per head and pooled, with missing values where a frame may hold them."""
    import pandas as pd

    from attnsens.store.summary import summarize_columns

    one = rows[(rows.step == 100) & (rows.seed == 1)].reset_index(drop=True)
    if with_missing:
        one = one.copy()
        rng = np.random.default_rng(5)
        one.loc[rng.random(len(one)) < 0.1, "theta_lower"] = np.nan
        one.loc[rng.random(len(one)) < 0.1, "n_eff"] = np.nan
    identity = {"run_id": one.run_id[0], "model": one.model[0], "step": int(one.step[0]), "seed": int(one.seed[0])}
    arrays = {name: one[name].to_numpy() for name in one.columns if name not in identity}
    summary = summarize_columns(arrays, **identity)
    pd.testing.assert_frame_equal(summary, summarize_rows(one), check_exact=True)
    conform(summary, "summary")

    empty = summarize_columns({name: values[:0] for name, values in arrays.items()}, **identity)
    pd.testing.assert_frame_equal(empty, summarize_rows(one.iloc[:0]))
    with pytest.raises(ValueError, match="columns lack"):
        summarize_columns({name: values for name, values in arrays.items() if name != "entropy"}, **identity)
