"""The paper's three findings (docs/math.md §9.1, §9.6), each judged on the measured data of every run.

Nothing here assumes an outcome: every sentence is built from the numbers. Each verdict states its threshold
and the effect size relative to uniform attention (p_max·n, normalized entropy, n_eff / n), with the spread
over seeds. A verdict is one of:

* ``agrees`` — the data show the claimed effect beyond its threshold;
* ``disagrees`` — the data contradict it (the numbers that do are named);
* ``not observed`` — the effect the claim describes is absent or below its threshold (e.g. no dominant rows);
* ``trivially implied`` — the claim holds, but follows from small p_max alone (θ ≥ s − p_max²), so it says
  nothing about the model;
* ``not measured`` — the run lacks the data.

Every finding is computed over all audited rows and again over the core rows (no attention sinks, no early
positions; attnsens.report.cells), and both are printed: a verdict driven by sinks says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import pandas as pd

from attnsens.report.cells import EARLY_KEYS
from attnsens.report.data import RunData

NEAR_ONE = 0.9
"""A median θ lower bound at or above this counts as "near 1" (‖J‖∞→1 within 10 % of its maximum 1/τ)."""

TRIVIAL_P_MAX = math.sqrt(1.0 - NEAR_ONE)
"""Below this median p_max, θ ≥ s − p_max² ≥ NEAR_ONE holds for any row: "near 1" is then trivially implied."""

CLOSED_FORM_TOLERANCE = 1e-6
"""Largest |θ − 4m(s − m) − s(1 − s)| accepted for dominant rows (float64 rounding of stored rows)."""

CONCENTRATION_FACTOR = 2.0
"""A layer concentrates when its median p_max·n grows at least this many times, first → last checkpoint …"""

ENTROPY_DROP = 0.05
"""… and its mean normalized entropy falls by at least this much (absolute; uniform attention has 1)."""

DOMINANT_MIN_FRACTION = 0.01
"""Dominant-atom rows "appear" when at least this fraction of the rows (last checkpoint) has p_max ≥ s/2."""

MAJORITY = 0.5
"""A (layer, checkpoint, seed) cell whose dominant fraction reaches this is a majority, not a minority."""

Status = Literal["agrees", "disagrees", "not observed", "trivially implied", "not measured"]


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One claim of the paper, the verdict of one run's data, and what was measured (plain text)."""

    key: str
    run_id: str
    claim: str
    status: Status
    measured: str
    table: pd.DataFrame | None = None
    table_caption: str | None = None


CLAIMS = {
    "theta": "The median θ lower-bound certificate stays near 1 in every layer and at every checkpoint.",
    "concentration": "Attention concentrates substantially during training (p_max rises, entropy falls).",
    "dominant": (
        "A minority of rows enters the dominant-atom regime (p_max ≥ 1/2), and those rows sit exactly on "
        "θ = 4p_max(1−p_max)."
    ),
}

SHORT_CLAIMS = {
    "theta": "median θ lower bound near 1",
    "concentration": "attention concentrates",
    "dominant": "dominant-atom minority on 4m(1−m)",
}


def evaluate_findings(data: RunData) -> list[Finding]:
    """The three findings for every run of ``data`` (one run_id each: a placement, a pretrained reference)."""
    cells = data.cells
    if cells is None or cells.empty:
        return [
            Finding(key=key, run_id="", claim=claim, status="not measured", measured="This run has no audited rows.")
            for key, claim in CLAIMS.items()
        ]
    findings = []
    for run_id, part in cells.groupby("run_id", sort=True):
        pretrained = data.run_kinds.get(str(run_id)) == "pretrained"
        findings += [
            theta_finding(part, run_id=str(run_id), pretrained=pretrained),
            concentration_finding(part, run_id=str(run_id), pretrained=pretrained),
            dominant_finding(part, data, run_id=str(run_id)),
        ]
    return findings


def _subset(cells: pd.DataFrame, name: str) -> pd.DataFrame:
    return cells[cells["subset"] == name]


def _where(cell: pd.Series, *, pretrained: bool = False) -> str:
    """Where a cell is: its layer, and for a training run its checkpoint and seed (a pretrained model has neither)."""
    if pretrained:
        return f"layer {int(cell['layer'])}"
    return f"layer {int(cell['layer'])}, step {int(cell['step']):,}, seed {int(cell['seed'])}"


def theta_finding(cells: pd.DataFrame, *, run_id: str, pretrained: bool = False) -> Finding:
    """θ near 1: every cell's median θ lower bound ≥ NEAR_ONE; trivially implied where median p_max is small."""
    every, core = _subset(cells, "all"), _subset(cells, "core")
    worst = every.loc[every["theta_lower_median"].idxmin()]
    below = every[every["theta_lower_median"] < NEAR_ONE]
    informative = every[every["p_max_median"] > TRIVIAL_P_MAX]
    n = len(every)
    measured = (
        f"Threshold: median θ lower bound ≥ {NEAR_ONE} in each of {n} "
        f"{'layers' if pretrained else '(layer, checkpoint, seed) cells'}. "
        f"Lowest: {worst['theta_lower_median']:.4f} ({_where(worst, pretrained=pretrained)}, "
        f"median p_max {worst['p_max_median']:.3f}, "
        f"p_max·n {worst['p_max_n_median']:.2f}). "
    )
    core_below = core[core["theta_lower_median"] < NEAR_ONE]
    if below.empty:
        if informative.empty:
            status: Status = "trivially implied"
            measured += (
                f"Every cell is ≥ {NEAR_ONE}, but in every cell the median p_max is ≤ {TRIVIAL_P_MAX:.3f}, where "
                f"θ ≥ s − p_max² ≥ {NEAR_ONE} holds for any row (largest median p_max "
                f"{every['p_max_median'].max():.3f}): the certificate adds nothing to what p_max alone implies."
            )
        else:
            status = "agrees"
            measured += (
                f"Every cell is ≥ {NEAR_ONE}; in {len(informative)} of {n} the median p_max exceeds "
                f"{TRIVIAL_P_MAX:.3f}, so there θ near 1 is a property of the model, not implied by small p_max "
                f"(largest median p_max {every['p_max_median'].max():.3f})."
            )
    else:
        status = "disagrees"
        layers = sorted(int(x) for x in below["layer"].unique())
        measured += f"{len(below)} of {n} cells fall below {NEAR_ONE} (layers {_compact(layers)}). "
        if core.empty:
            measured += "No core rows (all are sink or early rows)."
        elif core_below.empty:
            measured += (
                f"Without sink rows (argmax at key 0) and early rows (< {EARLY_KEYS} keys) every cell is ≥ "
                f"{NEAR_ONE} (lowest {core['theta_lower_median'].min():.4f}): the low medians come from those rows."
            )
        else:
            measured += (
                f"Without sink and early rows, {len(core_below)} of {len(core)} cells are still below {NEAR_ONE} "
                f"(lowest {core['theta_lower_median'].min():.4f})."
            )
    table = _layer_table(cells, {"theta_lower_median": "median θ_lb"}, subsets=("all", "core"))
    return Finding(
        key="theta",
        run_id=run_id,
        claim=CLAIMS["theta"],
        status=status,
        measured=measured,
        table=table,
        table_caption=(
            f"Per layer: median θ lower bound{_over(cells, ', ')}, all rows and core rows (no sinks, no early rows)."
        ),
    )


def concentration_finding(cells: pd.DataFrame, *, run_id: str, pretrained: bool) -> Finding:
    """Concentration: per layer, p_max·n up by CONCENTRATION_FACTOR and normalized entropy down by ENTROPY_DROP."""
    every = _subset(cells, "all")
    steps = sorted(int(s) for s in every["step"].unique())
    if pretrained or len(steps) < 2:
        what = "a pretrained model" if pretrained else f"one checkpoint (step {steps[0]:,})"
        level = every.agg({"p_max_n_median": "median", "normalized_entropy_mean": "mean"})
        return Finding(
            key="concentration",
            run_id=run_id,
            claim=CLAIMS["concentration"],
            status="not measured",
            measured=(
                f"This run is {what}: there is no training trajectory. Its level, relative to uniform attention: "
                f"median p_max·n {level['p_max_n_median']:.2f} (uniform 1), mean normalized entropy "
                f"{level['normalized_entropy_mean']:.3f} (uniform 1)."
            ),
        )
    first, last = steps[0], steps[-1]
    per_seed = every[every["step"].isin([first, last])].pivot_table(
        index=["layer", "seed"],
        columns="step",
        values=["p_max_n_median", "normalized_entropy_mean", "n_eff_fraction_mean"],
    )
    growth = (per_seed[("p_max_n_median", last)] / per_seed[("p_max_n_median", first)]).groupby("layer")
    drop = (per_seed[("normalized_entropy_mean", first)] - per_seed[("normalized_entropy_mean", last)]).groupby("layer")
    factor, fall = growth.mean(), drop.mean()
    concentrated = (factor >= CONCENTRATION_FACTOR) & (fall >= ENTROPY_DROP)
    spread = (factor <= 1 / CONCENTRATION_FACTOR) | (fall <= -ENTROPY_DROP)
    n_layers = len(factor)
    lowest_entropy = every[every["step"] == last].groupby("layer")["normalized_entropy_mean"].mean()
    measured = (
        f"Threshold: a layer concentrates when its median p_max·n grows ≥ {CONCENTRATION_FACTOR:g}× and its mean "
        f"normalized entropy falls by ≥ {ENTROPY_DROP} from checkpoint {first:,} to {last:,} (mean over seeds). "
        f"p_max·n growth per layer: {_per_layer(factor, growth, '×')}; normalized entropy fall: "
        f"{_per_layer(fall, drop, '')}; lowest mean normalized entropy at {last:,}: "
        f"{lowest_entropy.min():.3f} (layer {int(lowest_entropy.idxmin())}). "
        f"{int(concentrated.sum())} of {n_layers} layers concentrate. "
    )
    if 2 * concentrated.sum() >= n_layers:
        status: Status = "agrees"
    elif 2 * spread.sum() >= n_layers:
        status = "disagrees"
        measured += f"{int(spread.sum())} layers spread out instead (p_max·n falls or entropy rises)."
    else:
        status = "not observed"
        measured += "Fewer than half the layers pass the threshold."
    metrics = {
        "p_max_n_median": "p_max·n",
        "normalized_entropy_mean": "norm. entropy",
        "n_eff_fraction_mean": "n_eff/n",
    }
    table = _layer_table(cells, metrics)
    return Finding(
        key="concentration",
        run_id=run_id,
        claim=CLAIMS["concentration"],
        status=status,
        measured=measured,
        table=table,
        table_caption=(
            f"Per layer, checkpoint {first:,} → {last:,}: median p_max·n, mean normalized entropy and mean "
            f"n_eff / n (uniform attention has 1 for all three){_over(cells, '; ', checkpoints=False)}."
        ),
    )


def dominant_finding(cells: pd.DataFrame, data: RunData, *, run_id: str) -> Finding:
    """Dominant minority: ≥ DOMINANT_MIN_FRACTION of rows at the last checkpoint, < MAJORITY in every cell."""
    every, core = _subset(cells, "all"), _subset(cells, "core")
    last = int(every["step"].max())
    total, dominant = int(every["n_rows"].sum()), int(every["n_dominant"].sum())
    at_last = every[every["step"] == last]
    last_fraction = at_last["n_dominant"].sum() / at_last["n_rows"].sum()
    sinks = int(every["n_dominant_sink"].sum())
    cell_fraction = every["n_dominant"] / every["n_rows"]
    majority = every[cell_fraction >= MAJORITY]
    pretrained = data.run_kinds.get(run_id) == "pretrained"  # one audit of a trained model: no checkpoints, no seeds
    if pretrained:
        measured = (
            f"Thresholds: dominant rows appear when ≥ {DOMINANT_MIN_FRACTION:.0%} of the rows have p_max ≥ s/2, "
            f"and are a minority when below {MAJORITY:.0%} in every layer. Dominant rows: {_count(dominant, total)}; "
            f"largest layer fraction {_percent(cell_fraction.max())}. "
        )
    else:
        measured = (
            f"Thresholds: dominant rows appear when ≥ {DOMINANT_MIN_FRACTION:.0%} of the rows at the last checkpoint "
            f"have p_max ≥ s/2, and are a minority when below {MAJORITY:.0%} in every (layer, checkpoint, seed) "
            f"cell. Dominant rows: {_count(dominant, total)} overall, {_percent(last_fraction)} at checkpoint "
            f"{last:,}; largest cell fraction {_percent(cell_fraction.max())}. "
        )
    problems: list[str] = []
    if dominant:
        core_dominant = int(core["n_dominant"].sum())
        measured += (
            f"{_count(sinks, dominant)} of them put their largest weight on key 0 (a sink); without sink and early "
            f"rows {_count(core_dominant, int(core['n_rows'].sum()))} rows are dominant. "
        )
        check = data.dominant_checks.get(run_id)
        if check is not None and check.n_dominant and check.max_abs_deviation_lower is not None:
            deviation = check.max_abs_deviation_lower
            measured += (
                f"Largest |θ lower bound − (4m(s−m) + s(1−s))| over dominant rows: {deviation:.2e} (tolerance "
                f"{CLOSED_FORM_TOLERANCE:g}); {_percent(check.fraction_exact_among_dominant)} are certified exact. "
            )
            if deviation > CLOSED_FORM_TOLERANCE:
                problems.append(f"their θ lower bound departs from 4m(1−m) by up to {deviation:.2e}")
    if not majority.empty:
        layers = sorted(int(x) for x in majority["layer"].unique())
        problems.append(
            f"they are a majority in {len(majority)} of {len(every)} "
            f"{'layers' if pretrained else 'cells'} (layers {_compact(layers)}, "
            f"{_count(int(majority['n_dominant_sink'].sum()), int(majority['n_dominant'].sum()))} of those rows "
            "are sink rows)"
        )
    if problems:
        status: Status = "disagrees"
        measured += "The measurement disagrees: " + "; ".join(problems) + "."
    elif dominant == 0:
        status = "not observed"
        measured += "There are no dominant rows."
    elif last_fraction < DOMINANT_MIN_FRACTION:
        status = "not observed"
        measured += f"Only a trace at the last checkpoint, below the {DOMINANT_MIN_FRACTION:.0%} threshold."
    else:
        status = "agrees"
        measured += "A dominant minority is present and on the closed form."
    table = every.assign(fraction=cell_fraction).pivot_table(
        index="layer", columns="step", values="fraction", aggfunc="mean"
    )
    table.columns = ["pretrained" if pretrained else f"step {int(c):,}" for c in table.columns]
    table = table.map(_percent)  # one format for the whole table: 0.0977 % beside 2.0 %, not 9.766e-04 beside 0.0200
    caption = "Share of dominant-atom rows per layer and checkpoint (mean over seeds), all rows."
    if table.shape[1] > table.shape[0]:  # more checkpoints than layers: one row per checkpoint, so the table fits
        table = table.T.rename_axis(index="checkpoint", columns=None)
        table.columns = [f"layer {int(layer)}" for layer in table.columns]
        caption = "Share of dominant-atom rows per checkpoint and layer (mean over seeds), all rows."
    return Finding(
        key="dominant",
        run_id=run_id,
        claim=CLAIMS["dominant"],
        status=status,
        measured=measured,
        table=table.reset_index(),
        table_caption=caption,
    )


def _layer_table(cells: pd.DataFrame, metrics: dict[str, str], *, subsets: tuple[str, ...] = ("all",)) -> pd.DataFrame:
    """Per layer and metric: 'first → last [min, max]', the means over seeds at the first and last checkpoint
    and the seed range at the last; one column per (metric, subset)."""
    steps = sorted(int(s) for s in cells["step"].unique())
    first, last = steps[0], steps[-1]
    table = pd.DataFrame({"layer": sorted(int(x) for x in cells["layer"].unique())})
    for subset in subsets:
        part = cells[cells["subset"] == subset]
        for column, label in metrics.items():
            start = part[part["step"] == first].groupby("layer")[column].mean()
            end = part[part["step"] == last].groupby("layer")[column]
            text = {}
            for layer, values in end:
                arrow = "" if first == last else f"{_fmt(start.get(layer, float('nan')))} → "
                text[int(layer)] = arrow + _spread(values)
            name = label if subsets == ("all",) else f"{label} ({subset})"
            table[name] = [text.get(int(layer), "–") for layer in table["layer"]]
    return table


def _over(cells: pd.DataFrame, lead: str, *, checkpoints: bool = True) -> str:
    """What a ``_layer_table`` cell spans, after ``lead``: first → last checkpoint where there are several, means
    over seeds and their range at the last where there are several seeds; "" for one checkpoint of one seed."""
    several_steps = checkpoints and cells["step"].nunique() > 1
    several_seeds = cells["seed"].nunique() > 1
    if several_steps and several_seeds:
        return f"{lead}first → last checkpoint (means over seeds; [min, max] over seeds at the last)"
    if several_steps:
        return f"{lead}first → last checkpoint"
    if several_seeds:
        return f"{lead}means over seeds, [min, max] over seeds at the last checkpoint"
    return ""


def _spread(values: pd.Series) -> str:
    """'mean [min, max]' over seeds, or the one value."""
    if len(values) == 1:
        return _fmt(values.iloc[0])
    return f"{_fmt(values.mean())} [{_fmt(values.min())}, {_fmt(values.max())}]"


def _per_layer(means: pd.Series, groups: object, unit: str) -> str:
    lows, highs = groups.min(), groups.max()  # type: ignore[attr-defined]
    parts = []
    for layer, value in means.items():
        spread = "" if lows[layer] == highs[layer] else f" [{_fmt(lows[layer])}, {_fmt(highs[layer])}]"
        parts.append(f"L{int(layer)} {_fmt(value)}{unit}{spread}")
    return ", ".join(parts)


def _fmt(value: float) -> str:
    if value != value:  # NaN
        return "–"
    text = f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.000"


def _percent(fraction: float | None) -> str:
    """A fraction as a percentage that never rounds a non-zero value to 0 (0.0213 %, not 0.0 %)."""
    if fraction is None or fraction != fraction:
        return "–"
    if fraction == 0:
        return "0 %"
    percent = 100 * fraction
    return f"{percent:.3g} %" if percent < 1 else f"{percent:.1f} %"


def _count(part: int, whole: int) -> str:
    return f"{part:,} of {whole:,} ({_percent(part / whole if whole else float('nan'))})"


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
