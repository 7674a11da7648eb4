"""Every figure function returns a Figure that actually shows the data it was given."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from attnsens.errors import InputError
from attnsens.report import (
    bounds_figure,
    concentration_figure,
    dominant_fraction_figure,
    grad_norms_figure,
    influence_figure,
    layer_head_heatmap_figure,
    ln_condition_figure,
    norm_products_figure,
    theta_lower_by_step_figure,
    theta_vs_pmax_figure,
    training_figure,
)
from attnsens.report.cells import layer_cells_of
from attnsens.report.figures import theta_envelope_lower_bound
from attnsens.report.figures_bounds import loglog_slope
from attnsens.store import summarize_rows
from tests.unit.store.synthetic import N_LAYERS, bounds_frame, influence_frame, rows_frame, training_frames


@pytest.fixture(scope="module")
def frames():
    rows = rows_frame()
    training, grad_norms = training_frames()
    return {
        "rows": rows,
        "summary": summarize_rows(rows),
        "cells": layer_cells_of(rows),
        "training": training,
        "grad_norms": grad_norms,
        "bounds": bounds_frame(),
        "influence": influence_frame(),
    }


def _plotted_points(fig: Figure) -> int:
    """Number of data points drawn: line vertices, scatter offsets, bars and image pixels."""
    count = 0
    for ax in fig.axes:
        count += sum(len(line.get_xdata()) for line in ax.get_lines())
        count += sum(len(c.get_offsets()) for c in ax.collections)
        count += len(ax.patches)
        count += sum(np.isfinite(np.asarray(im.get_array(), dtype=float)).sum() for im in ax.images)
    return count


CASES = [
    (theta_lower_by_step_figure, "cells"),
    (concentration_figure, "cells"),
    (dominant_fraction_figure, "cells"),
    (theta_vs_pmax_figure, "rows"),
    (layer_head_heatmap_figure, "summary"),
    (training_figure, "training"),
    (grad_norms_figure, "grad_norms"),
    (bounds_figure, "bounds"),
    (norm_products_figure, "bounds"),
    (ln_condition_figure, "bounds"),
    (influence_figure, "influence"),
]


@pytest.mark.parametrize(("function", "table"), CASES, ids=[f.__name__ for f, _ in CASES])
def test_figure_shows_data(frames, function, table):
    fig = function(frames[table])
    assert isinstance(fig, Figure)
    assert _plotted_points(fig) >= 10


@pytest.mark.parametrize(
    ("function", "table"),
    [
        (theta_lower_by_step_figure, "cells"),
        (concentration_figure, "cells"),
        (dominant_fraction_figure, "cells"),
        (bounds_figure, "bounds"),
        (ln_condition_figure, "bounds"),
    ],
)
def test_single_checkpoint_is_drawn_per_layer(frames, function, table):
    frame = frames[table]
    fig = function(frame[frame["step"] == 0])
    assert _plotted_points(fig) >= N_LAYERS
    assert any(ax.get_xlabel() == "layer" for ax in fig.axes)


def test_theta_figure_has_one_panel_per_run_and_a_seed_band_per_layer(frames):
    cells = frames["cells"]
    two_runs = pd.concat([cells, cells.assign(run_id="run-b")], ignore_index=True)
    fig = theta_lower_by_step_figure(two_runs)
    panels = [ax for ax in fig.axes if ax.get_title(loc="left") in ("run-a", "run-b")]
    assert len(panels) == 2
    assert all(len(ax.get_lines()) == N_LAYERS + 1 for ax in panels)  # one line per layer and θ = 1
    assert all(len(ax.collections) == N_LAYERS for ax in panels)  # a band over the two seeds per layer
    # each line is the mean over seeds of the layer's median, the band spans the seeds
    layer0 = cells.query("layer == 0 and subset == 'all'").groupby("step")["theta_lower_median"]
    np.testing.assert_allclose(panels[0].get_lines()[0].get_ydata(), layer0.mean())
    band = panels[0].collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(layer0.min().min()) and band.max() == pytest.approx(layer0.max().max())


def test_log_axes_label_ticks_in_plain_text(frames):
    for fig in (training_figure(frames["training"]), concentration_figure(frames["cells"])):
        fig.canvas.draw()
        labels = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels() + ax.get_xticklabels()]
        assert labels and not any("$" in label or "mathdefault" in label for label in labels)


def test_scatter_keeps_every_dominant_row(frames):
    rows = frames["rows"]
    fig = theta_vs_pmax_figure(rows, max_points=50)
    dominant = next(c for c in fig.axes[0].collections if "dominant" in c.get_label())
    assert len(dominant.get_offsets()) == int(rows["dominant"].sum()) > 50


def test_scatter_reference_curves_are_the_envelope_and_the_exact_form(frames):
    fig = theta_vs_pmax_figure(frames["rows"])
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    exact = next(line for label, line in lines.items() if label.startswith("exact"))
    m = np.asarray(exact.get_xdata())
    assert m.min() == pytest.approx(0.5)
    np.testing.assert_allclose(exact.get_ydata(), 4 * m * (1 - m))
    # the envelope meets 8/9 at m = 1/3 and is 1 − m² below it
    np.testing.assert_allclose(theta_envelope_lower_bound(np.array([0.1, 1 / 3, 0.6])), [0.99, 8 / 9, 0.96])


def test_scatter_subsamples_deterministically(frames):
    first = theta_vs_pmax_figure(frames["rows"], max_points=500)
    second = theta_vs_pmax_figure(frames["rows"], max_points=500)
    assert len(first.axes[0].collections[0].get_offsets()) == 500
    np.testing.assert_array_equal(
        first.axes[0].collections[0].get_offsets(), second.axes[0].collections[0].get_offsets()
    )


def test_heatmap_cells_are_per_head_medians(frames):
    fig = layer_head_heatmap_figure(frames["summary"], step=100)
    grid = np.asarray(fig.axes[0].images[0].get_array())
    expected = frames["summary"].query("step == 100 and head == 3 and layer == 1")["theta_lower_median"].mean()
    assert grid[1, 3] == pytest.approx(expected)


def test_heatmap_title_names_its_checkpoint_unless_it_is_one_audit(frames):
    """A pretrained model's audit (one record step, 0) has no checkpoint to name."""
    assert layer_head_heatmap_figure(frames["summary"], step=100)._suptitle.get_text() == "Per head at checkpoint 100"
    one_audit = frames["summary"].query("step == 0")
    assert layer_head_heatmap_figure(one_audit)._suptitle.get_text() == "Per head"
    named = layer_head_heatmap_figure(one_audit, run="audit")._suptitle.get_text()
    assert named == "Per head — audit"


def test_loglog_slope_recovers_a_power_law():
    n = np.array([16.0, 64.0, 256.0, 1024.0])
    assert loglog_slope(n, 3.0 / n) == pytest.approx(-1.0)
    assert np.isnan(loglog_slope(n[:1], n[:1]))


def test_missing_columns_and_missing_levels_are_named(frames):
    with pytest.raises(InputError, match="theta_lower"):
        theta_vs_pmax_figure(frames["rows"].drop(columns=["theta_lower"]))
    with pytest.raises(InputError, match="subset"):
        theta_lower_by_step_figure(frames["summary"])
    with pytest.raises(InputError, match="non-empty"):
        training_figure(frames["training"].iloc[:0])


def test_figures_write_no_files_and_keep_global_style(frames, tmp_path, monkeypatch):
    import matplotlib

    monkeypatch.chdir(tmp_path)
    before = matplotlib.rcParams["font.size"]
    for function, table in CASES:
        function(frames[table])
    assert matplotlib.rcParams["font.size"] == before
    assert list(tmp_path.iterdir()) == []


def test_names_with_markup_and_dollars_are_drawn_literally(frames):
    import io

    cells = frames["cells"].query("step == 0")
    odd = cells.assign(run_id='gpt $\\undefined{$ <b>"odd"</b>')
    fig = theta_lower_by_step_figure(pd.concat([cells, odd], ignore_index=True))
    labels = fig.axes[0].get_legend().get_texts()
    assert any('$\\undefined{$ <b>"odd"</b>' in t.get_text() for t in labels)
    fig.savefig(io.BytesIO(), format="svg")
