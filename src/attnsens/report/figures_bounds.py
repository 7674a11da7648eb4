"""Figures of training logs, weight-based bounds, the LayerNorm condition and inverse-length influence.

DataFrame in, matplotlib Figure out, no files written; frames have the store's columns (attnsens.store.schema).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from attnsens.errors import InputError
from attnsens.report.style import (
    ACCENT,
    MUTED,
    SEED_COLORS,
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

_BOUND_LINES = (
    ("mha_lipschitz_upper_bound", "certified Lipschitz bound (θ̃ = 1)", MUTED, "--"),
    ("mha_local_jacobian_upper_bound", "certified local bound (measured θ̃)", ACCENT, "-"),
    ("mha_jacobian_estimate", "empirical Jacobian norm (lower estimate)", "#1f5fa8", "-"),
)


@styled
def training_figure(training: pd.DataFrame, baselines: pd.DataFrame | None = None) -> Figure:
    """Loss (training, and eval at checkpoints beside the n-gram baselines), global gradient ℓ2 norm before
    clipping (log) and learning rate against step, per run, with the band spanning the seeds.

    Args:
        training: the store's training table.
        baselines: optional baselines table (eval loss of unigram / bigram models, parameter counts).
    """
    frame = require_columns(training, ("run_id", "step", "seed", "loss", "grad_norm_global", "lr"), "training_figure")
    fig = Figure(figsize=(10.5, 3.3), layout="constrained")
    axes = fig.subplots(1, 3)
    colors = run_colors(frame["run_id"].unique())
    sizes = {}
    if baselines is not None and "n_parameters" in baselines:
        sizes = {r.run_id: int(r.n_parameters) for r in baselines.dropna(subset=["n_parameters"]).itertuples()}
    for run, part in frame.groupby("run_id"):
        color = colors[str(run)]
        size = f", {sizes[run] / 1e6:.2f}M params" if run in sizes else ""
        seed_band(axes[0], part, "step", "loss", color=color, label=f"{run} train{size}", marker=None, lw=1.1)
        evaluated = part.dropna(subset=["eval_loss"]) if "eval_loss" in part else part.iloc[:0]
        if not evaluated.empty:
            seed_band(axes[0], evaluated, "step", "eval_loss", color=color, label=f"{run} eval", ls=":", ms=3)
        seed_band(axes[1], part, "step", "grad_norm_global", color=color, label=str(run), marker=None, lw=1.1)
        seed_band(axes[2], part, "step", "lr", color=color, label=str(run), marker=None, lw=1.1)
    if baselines is not None and "eval_loss" in baselines:
        for record in baselines.dropna(subset=["eval_loss"]).itertuples():
            axes[0].axhline(record.eval_loss, color=MUTED, lw=0.9, ls="--")
            axes[0].annotate(
                f"{record.name} {record.eval_loss:.2f}",
                (1.0, record.eval_loss),
                xycoords=("axes fraction", "data"),
                ha="right",
                va="bottom",
                fontsize=7.5,
                color=MUTED,
            )
    log_scale(axes[1])
    tokens = frame.groupby("step")["tokens_seen"].max() if "tokens_seen" in frame else None
    for ax, title in zip(axes, ("loss (nats/token)", "gradient ℓ2 norm", "learning rate"), strict=True):
        ax.set_title(title, loc="left")
        ax.set_xlabel("step")
    if tokens is not None and not tokens.empty and tokens.index.max() > 0:
        per_step = float(tokens.iloc[-1]) / float(tokens.index.max())
        axes[0].set_xlabel(f"step ({per_step:,.0f} tokens each; {tokens.iloc[-1]:,.0f} seen in all)")
    axes[0].legend(fontsize=7.5)
    return fig


@styled
def grad_norms_figure(grad_norms: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Per-group gradient ℓ2 norms vs step: one panel per parameter group, one line per layer (mean over seeds;
    pass one run's records, as the report does)."""
    frame = require_columns(grad_norms, ("step", "layer", "group", "grad_norm"), "grad_norms_figure")
    groups = sorted(frame["group"].unique())
    ncols = min(len(groups), 4)
    nrows = -(-len(groups) // ncols)
    fig = Figure(figsize=(10.5, 0.4 + 2.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharex=True, squeeze=False)
    for ax in axes.flat[len(groups) :]:
        ax.set_visible(False)
    colors = layer_colors(frame["layer"].unique())
    means = frame.groupby(["group", "layer", "step"], as_index=False)["grad_norm"].mean()
    for ax, group in zip(axes.flat, groups, strict=False):
        for layer, part in means[means["group"] == group].groupby("layer"):
            ax.plot(part["step"], part["grad_norm"], color=colors[int(layer)], lw=1.1)
        log_scale(ax)
        ax.set_title(str(group), loc="left")
        ax.set_xlabel("step")
    add_layer_colorbar(fig, axes, frame["layer"].unique())
    return finish(fig, title)


def _layer_level(bounds: pd.DataFrame, step: int | None) -> tuple[pd.DataFrame, int]:
    """Layer-level bound records (head = -1) at ``step`` (default: the last), averaged over seeds."""
    frame = require_columns(bounds, ("step", "seed", "layer", "head"), "bounds figure")
    layer = frame[frame["head"] == ALL_HEADS]
    if layer.empty:
        raise InputError("bounds figures need layer-level records (head = -1); the geometry stage writes them")
    step = int(layer["step"].max()) if step is None else step
    numeric = layer[layer["step"] == step].select_dtypes("number").drop(columns=["step", "seed", "head"])
    return numeric.groupby("layer", as_index=False).mean(), step


@styled
def bounds_figure(bounds: pd.DataFrame, *, step: int | None = None, run: str | None = None) -> Figure:
    """Per layer: certified MHA bounds beside the empirical Jacobian norm (log scale), and their tightness ratio
    (mean over seeds; pass one run's records, as the report does, and name it with ``run``)."""
    per_layer, step = _layer_level(bounds, step)
    present = [line for line in _BOUND_LINES if line[0] in per_layer and per_layer[line[0]].notna().any()]
    if not present:
        raise InputError("bounds_figure needs at least one of " + ", ".join(line[0] for line in _BOUND_LINES))
    fig = Figure(figsize=(10.5, 3.4), layout="constrained")
    axes = fig.subplots(1, 2)
    for column, label, color, style in present:
        axes[0].plot(per_layer["layer"], per_layer[column], color=color, ls=style, marker="o", ms=3.5, label=label)
    log_scale(axes[0])
    layer_axis(axes[0])
    axes[0].set_ylabel("operator norm (block norm)")
    axes[0].set_title("attention Jacobian: bounds vs measurement", loc="left")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(present))
    ratio = per_layer.get("tightness_ratio")
    if ratio is not None and ratio.notna().any():
        axes[1].bar(per_layer["layer"], ratio, color="#2a9d8f", width=0.7)
        axes[1].axhline(1.0, color=MUTED, lw=0.8, ls=":")
        axes[1].set_ylim(0, max(1.1, float(ratio.max()) * 1.1))
    else:
        axes[1].text(0.5, 0.5, "no tightness ratio recorded", ha="center", va="center", transform=axes[1].transAxes)
    layer_axis(axes[1])
    axes[1].set_ylabel("certified local bound / estimate")
    axes[1].set_title("tightness ratio (1 = tight)", loc="left")
    return finish(fig, f"Certified bounds at checkpoint {step:,}" + ("" if run is None else f" — {run}"))


@styled
def norm_products_figure(bounds: pd.DataFrame) -> Figure:
    """Largest quartic projection-norm product ‖W_O‖‖W_Q^h‖‖W_K^h‖‖W_V^h‖ over heads, per layer vs step."""
    frame = require_columns(bounds, ("step", "layer", "head", "quartic_norm_product"), "norm_products_figure")
    heads = frame[(frame["head"] != ALL_HEADS) & frame["quartic_norm_product"].notna()]
    if heads.empty:
        raise InputError("norm_products_figure needs per-head quartic_norm_product values")
    worst = heads.groupby(["layer", "step"], as_index=False)["quartic_norm_product"].max()
    fig = Figure(figsize=(8.5, 3.2), layout="constrained")
    ax = fig.add_subplot()
    colors = layer_colors(worst["layer"].unique())
    for layer, part in worst.groupby("layer"):
        ax.plot(part["step"], part["quartic_norm_product"], color=colors[int(layer)], marker="o", ms=2.5)
    if worst["step"].nunique() > 1:
        step_axis(ax, worst["step"].unique())
    log_scale(ax)
    ax.set_ylabel("max over heads")
    add_layer_colorbar(fig, ax, worst["layer"].unique())
    return fig


@styled
def ln_condition_figure(bounds: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Fraction of tokens meeting the LayerNorm contraction condition (T6), and the median ratio ‖γ‖_∞/σ (mean over
    seeds; pass one run's records, as the report does)."""
    frame = require_columns(bounds, ("step", "layer", "head", "ln_condition_fraction"), "ln_condition_figure")
    layer = frame[(frame["head"] == ALL_HEADS) & frame["ln_condition_fraction"].notna()]
    if layer.empty:
        raise InputError("ln_condition_figure needs layer-level ln_condition_fraction values")
    fig = Figure(figsize=(10.5, 3.2), layout="constrained")
    axes = fig.subplots(1, 2)
    panels = (
        ("ln_condition_fraction", "fraction of tokens meeting the condition"),
        ("ln_contraction_ratio_median", "median ‖γ‖∞ / σ"),
    )
    multi_step = layer["step"].nunique() > 1
    for ax, (column, label) in zip(axes, panels, strict=True):
        if column not in layer or layer[column].isna().all():
            ax.text(0.5, 0.5, f"no {column} recorded", ha="center", va="center", transform=ax.transAxes)
            continue
        means = layer.groupby(["layer", "step"], as_index=False)[column].mean()
        if multi_step:
            colors = layer_colors(means["layer"].unique())
            for index, part in means.groupby("layer"):
                ax.plot(part["step"], part[column], color=colors[int(index)], marker="o", ms=2.5)
            step_axis(ax, means["step"].unique())
        else:
            ax.bar(means["layer"], means[column], color="#2a9d8f", width=0.7)
            layer_axis(ax)
        ax.set_title(label, loc="left")
    axes[0].set_ylim(0, 1.05)
    if multi_step:
        add_layer_colorbar(fig, axes, layer["layer"].unique())
    return finish(fig, title)


def loglog_slope(n: np.ndarray, values: np.ndarray) -> float:
    """Least-squares slope of log(values) against log(n); −1 means values ∝ 1/n."""
    keep = (n > 0) & (values > 0)
    if keep.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(n[keep]), np.log(values[keep]), 1)[0])


@styled
def influence_figure(influence: pd.DataFrame) -> Figure:
    """Measured influence of a nonfinal token vs length n beside the certified C/n (log–log), and n·influence."""
    frame = require_columns(
        influence, ("model", "n", "position_kind", "influence_max", "influence_median"), "influence_figure"
    )
    fig = Figure(figsize=(10.5, 3.8), layout="constrained")
    axes = fig.subplots(1, 2)
    groups = list(frame.groupby(["model", "position_kind"], sort=True))
    for index, ((model, kind), part) in enumerate(groups):
        part = part.sort_values("n")
        color = SEED_COLORS[index % len(SEED_COLORS)]
        n = part["n"].to_numpy(dtype=float)
        measured = part["influence_max"].to_numpy(dtype=float)
        name = f"{model} · {kind}" if frame["model"].nunique() > 1 else str(kind)
        slope = loglog_slope(n, measured)
        axes[0].plot(n, measured, color=color, marker="o", ms=3.5, label=f"measured max, {name} (slope {slope:.2f})")
        bound = part.get("influence_upper_bound")
        if bound is not None and bound.notna().any():
            axes[0].plot(n, bound, color=color, ls="--", lw=1.2, label=f"certified C/n, {name}")
        axes[1].plot(n, n * measured, color=color, marker="o", ms=3.5, label=f"max, {name}")
        axes[1].plot(n, n * part["influence_median"], color=color, ls=":", lw=1.2, label=f"median, {name}")
    for ax in axes:
        log_scale(ax, "x", base=2)
        ax.set_xlabel("sequence length n")
    log_scale(axes[0])
    axes[0].set_ylabel("‖Δy_n‖₂")
    axes[0].set_title("influence vs length", loc="left")
    axes[0].legend(fontsize=7.5)
    log_scale(axes[1])
    axes[1].set_ylabel("n · ‖Δy_n‖₂")
    axes[1].set_title("n · influence (flat = Θ(1/n))", loc="left")
    axes[1].legend(fontsize=7.5)
    return fig


_BOUND_CHAIN = (
    ("mha_length_dependent_upper_bound", "length-dependent (θ → n/2)", MUTED, ":"),
    ("mha_lipschitz_upper_bound", "length-independent (θ̃ = 1)", MUTED, "--"),
    ("mha_local_paper_form_upper_bound", "paper form with measured θ̃ (gain from θ)", "#e9a03b", "-"),
    ("mha_local_jacobian_upper_bound", "key-sum form with measured θ̃ (gain from key sums)", ACCENT, "-"),
    ("mha_jacobian_estimate", "empirical Jacobian norm (lower estimate)", "#1f5fa8", "-"),
)


@styled
def bounds_by_step_figure(bounds: pd.DataFrame) -> Figure:
    """The chain of attention bounds against checkpoint step, one panel per run: each certified form (median over
    layers, mean over seeds) beside the empirical Jacobian norm, so each form's gain over the previous one shows.
    """
    frame = require_columns(bounds, ("run_id", "step", "seed", "layer", "head"), "bounds_by_step_figure")
    layer = frame[frame["head"] == ALL_HEADS]
    present = [line for line in _BOUND_CHAIN if line[0] in layer and layer[line[0]].notna().any()]
    if layer.empty or not present or layer["step"].nunique() < 2:
        raise InputError("bounds_by_step_figure needs layer-level bound records at two or more checkpoints")
    runs = sorted(layer["run_id"].unique())
    fig = Figure(figsize=(10.5, 3.6), layout="constrained")
    axes = fig.subplots(1, len(runs), squeeze=False, sharey=True)[0]
    for ax, run in zip(axes, runs, strict=True):
        part = layer[layer["run_id"] == run]
        per_seed = part.groupby(["step", "seed"])[[line[0] for line in present]].median().reset_index()
        for column, label, color, style in present:
            seed_band(ax, per_seed, "step", column, color=color, label=label, ls=style)
        step_axis(ax, part["step"].unique(), max_labels=5)
        log_scale(ax)
        ax.set_title(str(run), loc="left")
    axes[0].set_ylabel("operator norm, median over layers")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=7.5)
    return fig


@styled
def residual_jacobian_figure(bounds: pd.DataFrame) -> Figure:
    """Residual-stream Jacobian per layer at the last checkpoint, one line per run (placement): the certified
    bound (dashed) and the empirical estimate (solid); pre-LN carries the identity, so its norm stays near ≥ 1."""
    frame = require_columns(
        bounds,
        ("run_id", "step", "layer", "head", "residual_jacobian_upper_bound", "residual_jacobian_estimate"),
        "residual_jacobian_figure",
    )
    layer = frame[(frame["head"] == ALL_HEADS) & frame["residual_jacobian_estimate"].notna()]
    if layer.empty:
        raise InputError("residual_jacobian_figure needs layer-level residual Jacobian records")
    fig = Figure(figsize=(8.5, 3.4), layout="constrained")
    ax = fig.add_subplot()
    colors = run_colors(layer["run_id"].unique())
    for run, part in layer.groupby("run_id"):
        last = part[part["step"] == part["step"].max()]
        color = colors[str(run)]
        step = int(part["step"].max())
        seed_band(ax, last, "layer", "residual_jacobian_estimate", color=color, label=f"{run} estimate (step {step:,})")
        seed_band(ax, last, "layer", "residual_jacobian_upper_bound", color=color, label=f"{run} bound", ls="--")
    ax.axhline(1.0, color=MUTED, lw=0.8, ls=":")
    log_scale(ax)
    layer_axis(ax)
    ax.set_ylabel("‖∂X_{k+1}/∂X_k‖ (block norm)")
    ax.legend(fontsize=7.5)
    return fig
