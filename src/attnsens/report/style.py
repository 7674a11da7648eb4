"""Shared look of every report figure: matplotlib style, checkpoint-step axis, series labels, layer colours.

Figures are built with ``matplotlib.figure.Figure`` directly (never pyplot), so no global state and no GUI
backend are involved; rendering to PNG/SVG uses the Agg-based canvases.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from attnsens.errors import InputError

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

matplotlib.use("Agg")

STYLE: dict[RcKeyType, Any] = {
    "font.family": "DejaVu Sans",
    "font.size": 9.5,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e4e4e4",
    "grid.linewidth": 0.6,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "lines.linewidth": 1.6,
    "axes.formatter.useoffset": False,
    "svg.hashsalt": "attnsens",
    "svg.fonttype": "path",
    # Labels carry model and run names; a "$" in them must not be read as mathtext.
    "text.parse_math": False,
}

SEED_COLORS = ("#1f5fa8", "#d1495b", "#2a9d8f", "#e9a03b", "#6c4ba0", "#7f7f7f")
ACCENT = "#d1495b"
MUTED = "#4d4d4d"

F = TypeVar("F", bound=Callable[..., Figure])


def styled(func: F) -> F:
    """Build the figure under the report style; the style does not leak into the caller's matplotlib state."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with matplotlib.rc_context(STYLE):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def require_columns(frame: pd.DataFrame | None, columns: Sequence[str], what: str) -> pd.DataFrame:
    """``frame`` if it is non-empty and has ``columns``; InputError naming what is missing otherwise."""
    if frame is None or frame.empty:
        raise InputError(f"{what} needs a non-empty table; none was given")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputError(f"{what} needs columns {missing}; give a frame with the store's schema")
    return frame


def series(frame: pd.DataFrame) -> Iterator[tuple[str, str, pd.DataFrame]]:
    """(label, colour, part) for every (run_id, model, seed) present; labels name only what varies."""
    keys = [k for k in ("run_id", "model", "seed") if k in frame.columns]
    varying = [k for k in keys if frame[k].nunique() > 1]
    if "seed" in keys and "seed" not in varying:
        varying.append("seed")
    for index, (values, part) in enumerate(frame.groupby(keys, sort=True)):
        named = dict(zip(keys, values if isinstance(values, tuple) else (values,), strict=True))
        label = " · ".join(f"seed {named[k]}" if k == "seed" else str(named[k]) for k in varying)
        yield label, SEED_COLORS[index % len(SEED_COLORS)], part


def layer_colors(layers: Sequence[int]) -> dict[int, Any]:
    """Depth colours: early layers light, deep layers dark (viridis)."""
    cmap = matplotlib.colormaps["viridis"]
    ordered = sorted(set(int(x) for x in layers))
    span = max(len(ordered) - 1, 1)
    return {layer: cmap(0.92 - 0.85 * i / span) for i, layer in enumerate(ordered)}


def add_layer_colorbar(fig: Figure, axes: Any, layers: Sequence[int]) -> None:
    """A discrete colourbar keyed to layer_colors, so many layers need no legend."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm, ListedColormap

    colors = layer_colors(layers)
    ordered = sorted(colors)
    cmap = ListedColormap([colors[layer] for layer in ordered])
    norm = BoundaryNorm(np.arange(len(ordered) + 1) - 0.5, len(ordered))
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, fraction=0.03, pad=0.02)
    ticks = [int(t) for t in np.linspace(0, len(ordered) - 1, min(len(ordered), 6)).round()]
    bar.set_ticks(ticks, labels=[str(ordered[t]) for t in ticks])
    bar.set_label("layer")
    bar.outline.set_visible(False)


def step_axis(ax: Axes, steps: Sequence[int], *, max_labels: int = 8) -> None:
    """Checkpoint steps on a symmetric-log x axis (linear near 0, so step 0 is shown) with the steps as ticks.

    Every checkpoint gets a tick; at most ``max_labels`` of them, spread evenly along the drawn axis, are labelled.
    """
    unique = sorted(set(int(s) for s in steps))
    positive = [s for s in unique if s > 0]
    symlog = bool(positive) and max(positive) / min(positive) >= 20
    if symlog:
        ax.set_xscale("symlog", linthresh=min(positive), linscale=0.6)
    ax.set_xlabel("checkpoint step")
    if len(unique) > 12:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:,.0f}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        return
    where = np.array([_symlog(s, min(positive)) if symlog else float(s) for s in unique])
    gap = (where[-1] - where[0]) / max(max_labels - 1, 1)
    # Both ends first, then every checkpoint far enough from those already labelled.
    labelled: set[int] = set()
    for index in sorted(range(len(unique)), key=lambda i: (i not in (0, len(unique) - 1), i)):
        if all(abs(where[index] - where[j]) >= 0.999 * gap for j in labelled):
            labelled.add(index)
    ax.set_xticks(unique, labels=[f"{s:,}" if i in labelled else "" for i, s in enumerate(unique)])
    ax.minorticks_off()


def _symlog(value: float, linthresh: float) -> float:
    """Position of ``value`` on a symlog axis (linear below linthresh, logarithmic above), up to scale."""
    return value / linthresh if value <= linthresh else 1.0 + np.log10(value / linthresh)


def log_scale(ax: Axes, axis: str = "y", *, base: float = 10, linthresh: float | None = None) -> None:
    """A log (or, with ``linthresh``, symmetric-log) axis whose tick labels are plain text such as 0.02 or 1e+04.

    Call it after plotting: data spanning less than a factor of 10 stay on a linear axis, where a log axis would
    label a single tick. The report style turns mathtext off (run names may contain "$"), so matplotlib's default
    log labels would print as raw mathtext source; minor ticks stay unlabelled.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    limits = ax.dataLim.intervaly if axis == "y" else ax.dataLim.intervalx
    low, high = (float(v) for v in limits)
    narrow = linthresh is None and (low <= 0 or not np.isfinite(low) or high / low < 10)
    if narrow and low > 0:
        target.set_major_locator(MaxNLocator(nbins=5))
        target.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:.4g}"))
        return
    scale = {"base": base} if linthresh is None else {"base": base, "linthresh": linthresh, "linscale": 0.5}
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log" if linthresh is None else "symlog", **scale)
    if base == 10 and linthresh is None:
        target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if high / low < 1e3 else (1.0,)))
    target.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:g}"))
    target.set_minor_formatter(NullFormatter())


def run_colors(runs: Sequence[str]) -> dict[str, str]:
    """One colour per run_id (placement or reference), stable in sorted order."""
    return {run: SEED_COLORS[i % len(SEED_COLORS)] for i, run in enumerate(sorted(set(runs)))}


def seed_band(ax: Axes, frame: pd.DataFrame, x: str, y: str, *, color: str, label: str, **line: Any) -> None:
    """Mean over seeds of ``y`` against ``x`` as a line, with the band from the smallest to the largest seed."""
    stats = frame.groupby(x)[y].agg(["mean", "min", "max"]).sort_index()
    if "seed" in frame and frame["seed"].nunique() > 1:
        ax.fill_between(stats.index, stats["min"], stats["max"], color=color, alpha=0.18, lw=0)
    ax.plot(stats.index, stats["mean"], color=color, label=label, **{"marker": "o", "ms": 2.5, **line})


def layer_axis(ax: Axes) -> None:
    """Integer layer ticks on the x axis."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer")


def finish(fig: Figure, title: str | None = None) -> Figure:
    if title:
        fig.suptitle(title, fontsize=11, fontweight="bold", x=0.01, ha="left")
    return fig
