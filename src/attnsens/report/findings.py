"""The paper's three findings (docs/math.md §9.1, §9.6), each evaluated on the measured data of a run.

Nothing here assumes an outcome: every sentence is built from the numbers, and a finding the data contradict
is reported as "disagrees" with the numbers that contradict it. The thresholds that turn numbers into a
verdict are the constants below and are printed with each finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pandas as pd

from attnsens.report.data import RunData
from attnsens.store.summary import ALL_HEADS

NEAR_ONE = 0.9
"""A median θ lower bound at or above this counts as "near 1" (‖J‖∞→1 within 10 % of its maximum 1/τ)."""

CLOSED_FORM_TOLERANCE = 1e-6
"""Largest |θ − 4m(s − m) − s(1 − s)| accepted for dominant rows (float64 rounding of stored rows)."""

CONCENTRATION_MIN_RISE = 0.05
"""Smallest relative rise of the median p_max (first → last checkpoint) that counts as concentration."""

Status = Literal["agrees", "disagrees", "not measured"]


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One claim of the paper, the verdict of the data, and what was measured (plain text, not yet escaped)."""

    key: str
    claim: str
    status: Status
    measured: str
    table: pd.DataFrame | None = None
    table_caption: str | None = None


def evaluate_findings(data: RunData) -> list[Finding]:
    """The three findings for ``data``: θ near 1, concentration increases, dominant rows are a minority on 4m(1−m)."""
    layer = _layer_records(data.summary)
    return [_theta_near_one(layer), _concentration(layer), _dominant(layer, data)]


def _layer_records(summary: pd.DataFrame | None) -> pd.DataFrame | None:
    if summary is None or summary.empty:
        return None
    pooled = summary[summary["head"] == ALL_HEADS]
    return pooled if not pooled.empty else None


def _theta_near_one(layer: pd.DataFrame | None) -> Finding:
    claim = "The median θ lower-bound certificate is near 1 in every layer and at every checkpoint."
    if layer is None:
        return Finding(key="theta", claim=claim, status="not measured", measured="This run has no audited rows.")
    worst = layer.loc[layer["theta_lower_median"].idxmin()]
    below = layer[layer["theta_lower_median"] < NEAR_ONE]
    cells = len(layer)
    where = f"layer {int(worst['layer'])}, checkpoint {int(worst['step']):,}, seed {int(worst['seed'])}"
    measured = (
        f"Lowest median θ lower bound over {cells} (layer, checkpoint, seed) cells: "
        f"{worst['theta_lower_median']:.4f} ({where}); overall median of the medians "
        f"{layer['theta_lower_median'].median():.4f}. "
    )
    if below.empty:
        status: Status = "agrees"
        measured += f"Every cell is ≥ {NEAR_ONE}, so in each at least half the rows certify θ ≥ {NEAR_ONE} (T2(f))."
    else:
        status = "disagrees"
        layers = sorted(int(x) for x in below["layer"].unique())
        measured += (
            f"{len(below)} of {cells} cells fall below {NEAR_ONE} (layers {_compact(layers)}); "
            "the measurement does not support 'near 1 everywhere'."
        )
    table = layer.pivot_table(index="layer", columns="step", values="theta_lower_median", aggfunc="min")
    table.columns = [f"step {int(c):,}" for c in table.columns]
    return Finding(
        key="theta",
        claim=claim,
        status=status,
        measured=measured,
        table=table.reset_index(),
        table_caption="Median θ lower bound per layer and checkpoint (worst seed).",
    )


def _concentration(layer: pd.DataFrame | None) -> Finding:
    claim = (
        "Attention concentrates during training: p_max rises and entropy falls from the first to the last checkpoint."
    )
    if layer is None:
        return Finding(key="concentration", claim=claim, status="not measured", measured="No audited rows.")
    steps = sorted(int(s) for s in layer["step"].unique())
    if len(steps) < 2:
        return Finding(
            key="concentration",
            claim=claim,
            status="not measured",
            measured=f"Only one checkpoint (step {steps[0]:,}) was audited; a trend needs two or more.",
        )
    first, last = steps[0], steps[-1]
    means = layer.groupby(["step", "layer"])[["p_max_median", "entropy_mean"]].mean()
    start, end = means.loc[first], means.loc[last]
    p_start, p_end = start["p_max_median"].mean(), end["p_max_median"].mean()
    h_start, h_end = start["entropy_mean"].mean(), end["entropy_mean"].mean()
    both = ((end["p_max_median"] > start["p_max_median"]) & (end["entropy_mean"] < start["entropy_mean"])).sum()
    rise = (p_end - p_start) / p_start if p_start > 0 else float("inf")
    measured = (
        f"From checkpoint {first:,} to {last:,}, averaged over layers and seeds: median p_max "
        f"{p_start:.3f} → {p_end:.3f} ({rise:+.1%}), mean entropy {h_start:.3f} → {h_end:.3f} nats; "
        f"{both} of {len(end)} layers show both. "
    )
    problems = []
    if rise < CONCENTRATION_MIN_RISE:
        problems.append(f"median p_max rose by less than {CONCENTRATION_MIN_RISE:.0%}")
    if h_end >= h_start:
        problems.append("entropy did not fall")
    if 2 * both < len(end):
        problems.append("fewer than half the layers concentrated")
    if problems:
        status: Status = "disagrees"
        measured += "The measurement does not show concentration: " + "; ".join(problems) + "."
    else:
        status = "agrees"
        measured += "Attention concentrated."
    table = means.reset_index()
    table = table[table["step"].isin([first, last])].pivot(index="layer", columns="step")
    table.columns = [f"{'p_max' if c == 'p_max_median' else 'entropy'} @ {int(s):,}" for c, s in table.columns]
    return Finding(
        key="concentration",
        claim=claim,
        status=status,
        measured=measured,
        table=table.reset_index(),
        table_caption="Median p_max and mean entropy (nats) per layer, first and last checkpoint (mean over seeds).",
    )


def _dominant(layer: pd.DataFrame | None, data: RunData) -> Finding:
    claim = (
        "A minority of rows is in the dominant-atom regime (p_max ≥ 1/2), "
        "and those rows sit exactly on θ = 4p_max(1−p_max)."
    )
    check = data.dominant
    if check is None and layer is None:
        return Finding(key="dominant", claim=claim, status="not measured", measured="No audited rows.")
    if check is not None:
        fraction, n_text = check.fraction_dominant, f"{check.n_dominant:,} of {check.n_rows:,} rows"
    else:
        weights = layer["n_rows"]
        fraction = float((layer["fraction_dominant"] * weights).sum() / weights.sum())
        n_text = f"{int(weights.sum()):,} rows"
    measured = f"Dominant-atom rows: {fraction:.1%} ({n_text})"
    problems = []
    if fraction >= 0.5:
        problems.append("they are not a minority")
    table = None
    if layer is not None:
        per_step = layer.assign(weighted=layer["fraction_dominant"] * layer["n_rows"]).groupby("step")
        shares = per_step["weighted"].sum() / per_step["n_rows"].sum()
        if len(shares) > 1:
            measured += (
                f"; {shares.iloc[0]:.1%} at checkpoint {int(shares.index[0]):,}, "
                f"{shares.iloc[-1]:.1%} at {int(shares.index[-1]):,}"
            )
        majority = shares[shares >= 0.5]
        if fraction < 0.5 and not majority.empty:
            problems.append(f"they are a majority at checkpoint(s) {', '.join(f'{int(s):,}' for s in majority.index)}")
        table = layer.pivot_table(index="layer", columns="step", values="fraction_dominant", aggfunc="mean")
        table.columns = [f"step {int(c):,}" for c in table.columns]
        table = table.reset_index()
    measured += ". "
    if check is None:
        measured += "The closed form could not be checked: the run has no per-row table."
    elif check.n_dominant == 0:
        measured += "There are no dominant rows, so the closed form has nothing to check."
    else:
        deviation = check.max_abs_deviation_lower
        measured += (
            f"Largest |θ lower bound − 4m(s−m) − s(1−s)| over dominant rows (s = stored row sum; = 4m(1−m) for s = 1): "
            f"{deviation:.2e}; {check.fraction_exact_among_dominant:.1%} of them are certified exact."
        )
        if deviation > CLOSED_FORM_TOLERANCE:
            problems.append(f"their θ lower bound departs from 4m(1−m) by up to {deviation:.2e}")
    if problems:
        measured += " The measurement disagrees: " + "; ".join(problems) + "."
    status: Status = "disagrees" if problems else "agrees"
    return Finding(
        key="dominant",
        claim=claim,
        status=status,
        measured=measured,
        table=table,
        table_caption="Fraction of dominant-atom rows per layer and checkpoint (mean over seeds).",
    )


def _compact(values: list[int]) -> str:
    """'0–3, 7, 9–10' for [0, 1, 2, 3, 7, 9, 10]."""
    parts, start = [], None
    for index, value in enumerate(values):
        if start is None:
            start = value
        if index + 1 == len(values) or values[index + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}–{value}")
            start = None
    return ", ".join(parts)
