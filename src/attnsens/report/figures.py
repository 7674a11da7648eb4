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
    require_columns,
    series,
    step_axis,
    styled,
)
from attnsens.store.summary import ALL_HEADS

_LAYER_COLUMNS = ("step", "seed", "layer", "head")


def layer_records(summary: pd.DataFrame, what: str) -> pd.DataFrame:
    """The per-layer records (head = -1, all heads pooled) of a summary table."""
    frame = require_columns(summary, _LAYER_COLUMNS, what)
    pooled = frame[frame["head"] == ALL_HEADS]
    if pooled.empty:
        raise InputError(
            f"{what} needs per-layer summary records (head = -1); build them with summarize_rows(rows, level='both')"
        )
    return pooled


@styled
def theta_lower_by_step_figure(summary: pd.DataFrame) -> Figure:
    """Median θ lower bound per layer vs checkpoint step: median line and 25–75 % band, one line per seed.

    With a single checkpoint the x axis is the layer instead (one point per layer, bars = interquartile range).
    """
    pooled = layer_records(summary, "theta_lower_by_step_figure")
    require_columns(pooled, ("theta_lower_median", "theta_lower_q25", "theta_lower_q75"), "theta figure")
    steps = sorted(pooled["step"].unique())
    low = float(min(pooled["theta_lower_q25"].min(), pooled["theta_lower_median"].min()))
    y_min = max(0.0, min(0.9, low - 0.05))
    if len(steps) == 1:
        fig = Figure(figsize=(8.5, 3.4), layout="constrained")
        ax = fig.add_subplot()
        for label, color, part in series(pooled):
            part = part.sort_values("layer")
            err = np.vstack(
                [
                    part["theta_lower_median"] - part["theta_lower_q25"],
                    part["theta_lower_q75"] - part["theta_lower_median"],
                ]
            )
            ax.errorbar(
                part["layer"],
                part["theta_lower_median"],
                yerr=err,
                marker="o",
                ms=4,
                capsize=2,
                color=color,
                label=label,
            )
        layer_axis(ax)
        ax.set_ylabel("median θ lower bound")
        ax.set_ylim(y_min, 1.02)
        ax.axhline(1.0, color=MUTED, lw=0.8, ls=":")
        ax.legend(loc="lower left")
        return finish(fig, f"θ lower bound per layer (checkpoint {steps[0]:,})")
    layers = sorted(pooled["layer"].unique())
    ncols = min(len(layers), 4 if len(layers) <= 16 else 6)
    nrows = -(-len(layers) // ncols)
    fig = Figure(figsize=(10.5, 0.6 + 2.0 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
    for ax in axes.flat[len(layers) :]:
        ax.set_visible(False)
    for ax, layer in zip(axes.flat, layers, strict=False):
        for label, color, part in series(pooled[pooled["layer"] == layer]):
            part = part.sort_values("step")
            ax.fill_between(
                part["step"], part["theta_lower_q25"], part["theta_lower_q75"], color=color, alpha=0.18, lw=0
            )
            ax.plot(part["step"], part["theta_lower_median"], color=color, marker="o", ms=2.5, label=label)
        ax.axhline(1.0, color=MUTED, lw=0.8, ls=":")
        ax.set_title(f"layer {layer}", loc="left")
        step_axis(ax, steps, max_labels=4 if ncols > 4 else 5)
        ax.set_ylim(y_min, 1.02)
        if not ax.get_subplotspec().is_last_row():
            ax.set_xlabel("")
    for ax in axes[:, 0]:
        ax.set_ylabel("θ lower bound")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper right", ncols=max(1, len(labels)))
    return fig


def _trend(ax, pooled: pd.DataFrame, column: str, ylabel: str) -> None:
    """One line per layer (mean over seeds) against checkpoint step."""
    colors = layer_colors(pooled["layer"].unique())
    means = pooled.groupby(["layer", "step"], as_index=False)[column].mean()
    for layer, part in means.groupby("layer"):
        ax.plot(part["step"], part[column], color=colors[int(layer)], marker="o", ms=2.5)
    step_axis(ax, pooled["step"].unique())
    ax.set_ylabel(ylabel)


def _per_layer(ax, pooled: pd.DataFrame, column: str, ylabel: str) -> None:
    for label, color, part in series(pooled):
        part = part.sort_values("layer")
        ax.plot(part["layer"], part[column], color=color, marker="o", ms=3.5, label=label)
    layer_axis(ax)
    ax.set_ylabel(ylabel)


@styled
def concentration_figure(summary: pd.DataFrame) -> Figure:
    """Median p_max and mean entropy (nats) per layer vs checkpoint step; concentration = p_max up, entropy down."""
    pooled = layer_records(summary, "concentration_figure")
    require_columns(pooled, ("p_max_median", "entropy_mean"), "concentration_figure")
    fig = Figure(figsize=(10.5, 3.3), layout="constrained")
    axes = fig.subplots(1, 2)
    if pooled["step"].nunique() == 1:
        _per_layer(axes[0], pooled, "p_max_median", "median p_max")
        _per_layer(axes[1], pooled, "entropy_mean", "mean entropy (nats)")
        axes[0].legend()
    else:
        _trend(axes[0], pooled, "p_max_median", "median p_max")
        _trend(axes[1], pooled, "entropy_mean", "mean entropy (nats)")
        add_layer_colorbar(fig, axes, pooled["layer"].unique())
    axes[0].set_title("largest weight p_max", loc="left")
    axes[1].set_title("entropy", loc="left")
    return fig


@styled
def dominant_fraction_figure(summary: pd.DataFrame) -> Figure:
    """Fraction of dominant-atom rows (p_max ≥ 1/2) per layer vs checkpoint step."""
    pooled = layer_records(summary, "dominant_fraction_figure")
    require_columns(pooled, ("fraction_dominant",), "dominant_fraction_figure")
    fig = Figure(figsize=(8.5, 3.3), layout="constrained")
    ax = fig.add_subplot()
    if pooled["step"].nunique() == 1:
        _per_layer(ax, pooled, "fraction_dominant", "fraction of dominant rows")
        ax.legend()
    else:
        _trend(ax, pooled, "fraction_dominant", "fraction of dominant rows")
        add_layer_colorbar(fig, ax, pooled["layer"].unique())
    ax.set_ylim(0, max(0.55, float(pooled["fraction_dominant"].max()) * 1.1))
    ax.axhline(0.5, color=MUTED, lw=0.8, ls=":")
    return fig


def theta_envelope_lower_bound(m: np.ndarray) -> np.ndarray:
    """g(m) = max(4m(1 − m), 1 − m²): the lower bound of θ(p) given p_max = m (docs/math.md T2(b))."""
    return np.maximum(4 * m * (1 - m), 1 - m**2)


@styled
def theta_vs_pmax_figure(rows: pd.DataFrame, *, max_points: int = 20_000, seed: int = 0) -> Figure:
    """θ lower bound vs p_max for sampled rows, with the envelope g(m) and the exact curve 4m(1 − m) on m ≥ 1/2.

    Tests two facts: a certificate is at least the floor g(p_max) (A2 takes the best of subsets that attain it), so
    no point may fall below the dashed curve; dominant rows (m ≥ 1/2) must lie on 4m(1 − m) exactly (T2(a)).
    """
    frame = require_columns(rows, ("p_max", "theta_lower", "dominant"), "theta_vs_pmax_figure")
    if len(frame) > max_points:
        frame = frame.sample(n=max_points, random_state=seed)
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
        label=f"dominant rows ({dominant.sum():,})",
        rasterized=True,
    )
    ax.set_xlim(0, 1.0)
    ax.set_ylim(-0.02, 1.04)
    ax.set_xlabel("p_max = m")
    ax.set_ylabel("θ lower bound")
    ax.legend(loc="lower left")
    return fig


@styled
def layer_head_heatmap_figure(summary: pd.DataFrame, *, step: int | None = None) -> Figure:
    """Layer × head heatmaps of median θ lower bound and median p_max at one checkpoint (default: the last)."""
    frame = require_columns(summary, (*_LAYER_COLUMNS, "theta_lower_median", "p_max_median"), "heatmap")
    heads = frame[frame["head"] != ALL_HEADS]
    if heads.empty:
        raise InputError(
            "layer_head_heatmap_figure needs per-head summary records (head ≥ 0); build them with summarize_rows"
        )
    step = int(heads["step"].max()) if step is None else step
    at = heads[heads["step"] == step]
    n_layers, n_heads = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
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
    return finish(fig, f"Per head at checkpoint {step:,}")
