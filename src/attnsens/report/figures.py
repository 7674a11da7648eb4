"""Figures of the attention-row statistics: DataFrame in, matplotlib Figure out, no files written.

Every function takes frames with the columns of the store's tables (attnsens.store.schema) and raises
InputError when a needed column is missing. Figures of checkpoint trends fall back to a per-layer view when the
run has a single checkpoint (a static model).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from attnsens.errors import InputError
from attnsens.report.style import (
    ACCENT,
    MUTED,
    add_layer_colorbar,
    finish,
    layer_axis,
    layer_colors,
    log_scale,
    require_columns,
    run_colors,
    seed_band,
    step_axis,
    styled,
)
from attnsens.store.summary import ALL_HEADS

_LAYER_COLUMNS = ("step", "seed", "layer", "head")


_CELL_COLUMNS = ("run_id", "step", "seed", "layer", "subset")


def _all_rows(cells: pd.DataFrame, columns: tuple[str, ...], what: str) -> pd.DataFrame:
    """The ``subset == "all"`` cells of a layer_cells frame, with ``columns`` present."""
    frame = require_columns(cells, (*_CELL_COLUMNS, *columns), what)
    return frame[frame["subset"] == "all"]


def _cell_figure(
    cells: pd.DataFrame,
    metrics: tuple[tuple[str, str, str], ...],
    what: str,
    *,
    ylim: tuple[float, float] | None = None,
    hline: float | None = None,
) -> Figure:
    """Layer cells drawn per metric: over checkpoints (one panel per metric and run, one line per layer with
    its seed band), or, with a single checkpoint per run, against the layer (one line per run).

    ``metrics``: (column, axis label, scale) with scale "linear", "log" or "count" (symlog, zero shown).
    """
    frame = _all_rows(cells, tuple(m[0] for m in metrics), what)
    runs = sorted(frame["run_id"].unique())
    trend = frame.groupby("run_id")["step"].nunique().max() > 1
    columns = runs if trend else [None]
    fig = Figure(figsize=(10.5, 0.5 + 2.6 * len(metrics)), layout="constrained")
    axes = fig.subplots(len(metrics), len(columns), squeeze=False, sharex="col" if trend else "all")
    colors = layer_colors(frame["layer"].unique())
    by_run = run_colors(runs)
    for row, (column, label, scale) in enumerate(metrics):
        for col, run in enumerate(columns):
            ax = axes[row, col]
            if trend:
                part = frame[frame["run_id"] == run]
                for layer, lines in part.groupby("layer"):
                    seed_band(ax, lines, "step", column, color=colors[int(layer)], label=f"layer {int(layer)}")
                step_axis(ax, part["step"].unique(), max_labels=5)
                ax.set_title(f"{run}", loc="left")
            else:
                for name, part in frame.groupby("run_id"):
                    seed_band(ax, part, "layer", column, color=by_run[str(name)], label=str(name), ms=3.5)
                layer_axis(ax)
            if scale == "log":
                log_scale(ax)
            elif scale == "count":
                log_scale(ax, linthresh=1.0)
                ax.set_ylim(0, max(2.0, float(frame[column].max()) * 1.5))
            if ylim is not None:
                ax.set_ylim(*ylim)
            if hline is not None:
                ax.axhline(hline, color=MUTED, lw=0.8, ls=":")
            if col == 0:
                ax.set_ylabel(label)
            if row < len(metrics) - 1:
                ax.set_xlabel("")
    if trend:
        add_layer_colorbar(fig, axes, frame["layer"].unique())
    else:
        axes[0, 0].legend(loc="best")
    return fig


@styled
def theta_lower_by_step_figure(cells: pd.DataFrame) -> Figure:
    """Median θ lower bound per layer (all heads pooled) against checkpoint step, per run, with seed bands.

    Args:
        cells: attnsens.report.cells.layer_cells frame. With one checkpoint per run the x axis is the layer.
    """
    frame = _all_rows(cells, ("theta_lower_median",), "theta_lower_by_step_figure")
    low = max(0.0, min(0.9, float(frame["theta_lower_median"].min()) - 0.05))
    metrics = (("theta_lower_median", "median θ lower bound", "linear"),)
    return _cell_figure(frame, metrics, "theta figure", ylim=(low, 1.01), hline=1.0)


@styled
def concentration_figure(cells: pd.DataFrame) -> Figure:
    """Concentration relative to uniform attention: median p_max·n (log) and mean normalized entropy per layer."""
    metrics = (
        ("p_max_n_median", "median p_max·n (uniform = 1)", "log"),
        ("normalized_entropy_mean", "mean normalized entropy", "linear"),
    )
    return _cell_figure(cells, metrics, "concentration_figure")


@styled
def dominant_fraction_figure(cells: pd.DataFrame) -> Figure:
    """Number of dominant-atom rows (p_max ≥ s/2) per layer cell on a symmetric-log count axis (zero visible)."""
    frame = _all_rows(cells, ("n_dominant", "n_rows"), "dominant_fraction_figure")
    per_cell = int(frame["n_rows"].max())
    metrics = (("n_dominant", f"dominant rows (of ≤ {per_cell:,} per cell)", "count"),)
    return _cell_figure(frame, metrics, "dominant_fraction_figure")


def theta_envelope_lower_bound(m: np.ndarray) -> np.ndarray:
    """g(m) = max(4m(1 − m), 1 − m²): the lower bound of θ(p) given p_max = m (docs/math.md T2(b))."""
    return np.maximum(4 * m * (1 - m), 1 - m**2)


@styled
def theta_vs_pmax_figure(rows: pd.DataFrame, *, max_points: int = 20_000, seed: int = 0) -> Figure:
    """θ lower bound vs p_max: every dominant row and up to ``max_points`` others, with the envelope g(m) and the
    exact curve 4m(1 − m) on m ≥ 1/2, zoomed to the range of the rows.

    Tests two facts: a certificate is at least the floor g(p_max) (A2 takes the best of subsets that attain it), so
    no point may fall below the dashed curve; dominant rows (m ≥ 1/2) must lie on 4m(1 − m) exactly (T2(a)).
    """
    frame = require_columns(rows, ("p_max", "theta_lower", "dominant"), "theta_vs_pmax_figure")
    dominant_rows = frame["dominant"].astype(bool)
    others = frame[~dominant_rows]
    if len(others) > max_points:  # every dominant row is kept; the others are thinned
        frame = pd.concat([others.sample(n=max_points, random_state=seed), frame[dominant_rows]])
    fig = Figure(figsize=(6.8, 4.6), layout="constrained")
    ax = fig.add_subplot()
    dominant = frame["dominant"].astype(bool).to_numpy()
    size = 10 if len(frame) < 3000 else 6
    m = np.linspace(1e-3, 1, 600)
    ax.plot(
        m, theta_envelope_lower_bound(m), color=MUTED, ls="--", lw=1.1, zorder=3, label="envelope max(4m(1−m), 1−m²)"
    )
    m_dom = np.linspace(0.5, 1, 300)
    ax.plot(
        m_dom, 4 * m_dom * (1 - m_dom), color=ACCENT, lw=3.5, alpha=0.35, zorder=1, label="exact θ = 4m(1−m), m ≥ 1/2"
    )
    ax.scatter(
        frame["p_max"][~dominant],
        frame["theta_lower"][~dominant],
        s=size,
        alpha=0.4,
        lw=0,
        zorder=2,
        color="#1f5fa8",
        label=f"rows with p_max < 1/2 ({(~dominant).sum():,})",
        rasterized=True,
    )
    ax.scatter(
        frame["p_max"][dominant],
        frame["theta_lower"][dominant],
        s=size,
        alpha=0.7,
        lw=0,
        zorder=2,
        color="#b8610a",
        label=f"dominant rows (all {dominant.sum():,})",
        rasterized=True,
    )
    # Zoomed to the rows: near-uniform attention lives at small m and θ close to 1.
    right = min(1.0, max(0.05, float(frame["p_max"].max()) * 1.08))
    bottom = max(-0.02, min(0.9, float(frame["theta_lower"].min()) - 0.03))
    ax.set_xlim(0, right)
    ax.set_ylim(bottom, 1.0 + 0.06 * (1.0 - bottom))
    ax.set_xlabel("p_max = m")
    ax.set_ylabel("θ lower bound")
    ax.legend(loc="lower left")
    return fig


@styled
def layer_head_heatmap_figure(summary: pd.DataFrame, *, step: int | None = None, run: str | None = None) -> Figure:
    """Layer × head heatmaps of median θ lower bound and median p_max at one checkpoint (default: the last), of
    one run (``run`` names it in the title) or of every run at that checkpoint pooled."""
    frame = require_columns(summary, (*_LAYER_COLUMNS, "theta_lower_median", "p_max_median"), "heatmap")
    heads = frame[frame["head"] != ALL_HEADS]
    if heads.empty:
        raise InputError(
            "layer_head_heatmap_figure needs per-head summary records (head ≥ 0); build them with summarize_rows"
        )
    step = int(heads["step"].max()) if step is None else step
    at = heads[heads["step"] == step]
    # Sized by the runs audited at that checkpoint (a pretrained reference of another shape is not at it).
    n_layers, n_heads = int(at["layer"].max()) + 1, int(at["head"].max()) + 1
    width = min(12.0, 2.2 + 0.42 * n_heads * 2)
    fig = Figure(figsize=(width, 0.9 + min(0.32 * n_layers, 9.0)), layout="constrained")
    axes = fig.subplots(1, 2)
    panels = (("theta_lower_median", "median θ lower bound", "viridis"), ("p_max_median", "median p_max", "magma_r"))
    for ax, (column, label, cmap) in zip(axes, panels, strict=True):
        grid = np.full((n_layers, n_heads), np.nan)
        means = at.groupby(["layer", "head"])[column].mean()
        for (layer, head), value in means.items():
            grid[int(layer), int(head)] = value
        image = ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        ax.grid(False)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(label, loc="left")
        if n_layers * n_heads <= 144:
            for (layer, head), value in np.ndenumerate(grid):
                if np.isfinite(value):
                    ax.text(
                        head,
                        layer,
                        f"{value:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if (value < 0.6) == (cmap == "viridis") else "black",
                    )
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02).outline.set_visible(False)
    single_audit = step == 0 and heads["step"].nunique() == 1  # of a pretrained model: no checkpoint to name
    title = "Per head" if single_audit else f"Per head at checkpoint {step:,}"
    return finish(fig, title if run is None else f"{title} — {run}")
