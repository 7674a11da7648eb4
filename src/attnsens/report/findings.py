"""The paper's findings (docs/math.md §9.1, §9.6), each judged on the measured data of every run as a statistical claim.

Every finding names its statistic, its threshold and a 95 % bootstrap interval over independent units (audited
sequences, and seeds where a run has several; attnsens.report.bootstrap), and a verdict that follows from them:

* ``agrees`` — the interval lies on the claim's side of the threshold;
* ``disagrees`` — the interval lies on the other side;
* ``inconclusive`` — the interval straddles the threshold: more sequences or seeds are needed to decide;
* ``implied by p_max`` — the claim holds, but the envelope E = max(s − m², 4m(s − m) + s(1 − s)) that p_max
  alone gives (docs/math.md T2(b)) already reaches the threshold: the certificate adds nothing to it;
* ``not observed`` — the effect the claim describes is absent or confidently below its threshold;
* ``not measured`` — the run lacks the data.

Each finding is computed over all audited rows and over the core rows (no attention sinks, no early positions;
attnsens.report.cells), and both are reported side by side. ``findings.json`` (``Finding.record``) holds the same
objects the HTML report renders.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from attnsens.report.bootstrap import CONFIDENCE, Interval, interval
from attnsens.report.cells import EARLY_KEYS
from attnsens.report.data import RunData
from attnsens.report.run_statistics import ENVELOPE_MARGIN, RunStatistics

NEAR_ONE = 0.9
"""The paper's "near 1": a median θ lower bound at or above this (‖J‖∞→1 within 10 % of its maximum 1/τ)."""

SHARP = 0.99
"""A second θ threshold, where θ and p_max part: E ≥ 0.99 needs m ≤ 0.1 or m ∈ [0.45, 0.55] (T2(b))."""

CLOSED_FORM_TOLERANCE = 1e-6
"""Largest |θ − 4m(s − m) − s(1 − s)| accepted for dominant rows (float64 rounding of stored rows)."""

CONCENTRATION_FACTOR = 2.0
"""A layer concentrates when its median p_max·n grows at least this many times …"""

ENTROPY_DROP = 0.05
"""… and its mean normalized entropy falls by at least this much (absolute; uniform attention has 1)."""

DOMINANT_MIN_FRACTION = 0.01
"""Dominant-atom rows "appear" when at least this fraction of the rows (last checkpoint) has p_max ≥ s/2."""

MAJORITY = 0.5
"""A cell whose dominant fraction reaches this is a majority, not a minority."""

INFLUENCE_SLOPE = -1.0
"""The slope of log ‖Δy_n‖ on log n that O(1/n) influence predicts for unmasked attention (docs/math.md §10); for
causal attention the certified rate is C·H_n^{L−1}/n, whose slope over the measured lengths ``expected_slope`` gives."""
INFLUENCE_MARGIN = 0.1
"""How much slower than the certified rate a measured decay may look and still agree: the theorem bounds ‖Δy_n‖ by
that rate, so a slope at or below its slope agrees, and over a finite range of lengths one within this margin
above it does too."""

UNIFORM_P_MAX_N = 1.5
"""Below this median p_max·n attention is close to uniform, and a 1/n decay is plain averaging."""

HEADS_SHOWN = 24
"""Heads listed in the report's per-head tables (findings.json lists every one)."""

Verdict = Literal["agrees", "disagrees", "inconclusive", "implied by p_max", "not observed", "not measured"]
FindingName = Literal["theta", "concentration", "dominant", "influence"]


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One claim of the paper, judged on one run and one subset of its rows (``record()`` is its JSON object)."""

    finding: FindingName
    run_id: str
    subset: Literal["all", "core"] | None
    verdict: Verdict
    claim: str
    measured: str
    threshold: float | None = None
    statistic: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_rows: int | None = None
    n_sequences: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    table: pd.DataFrame | None = None
    table_caption: str | None = None

    @property
    def key(self) -> str:
        return self.finding

    @property
    def status(self) -> str:
        return self.verdict

    def record(self) -> dict[str, Any]:
        """The finding as a JSON-ready object (docs/findings.md)."""
        return {
            "run_id": self.run_id,
            "finding": self.finding,
            "subset": self.subset,
            "verdict": self.verdict,
            "threshold": _number(self.threshold),
            "statistic": _number(self.statistic),
            "ci_low": _number(self.ci_low),
            "ci_high": _number(self.ci_high),
            "n_rows": self.n_rows,
            "n_sequences": self.n_sequences,
            "claim": self.claim,
            "measured": self.measured,
            **_jsonable(self.details),
        }


CLAIMS = {
    "theta": "The median θ lower-bound certificate stays near 1 in every layer and at every checkpoint.",
    "concentration": "Attention concentrates substantially during training (p_max rises, entropy falls).",
    "dominant": "A minority of rows enters the dominant-atom regime (p_max ≥ 1/2).",
    "influence": "A nonfinal token's influence on the last position decays as 1/n (slope −1 on log–log axes).",
}

SHORT_CLAIMS = {
    "theta": "median θ lower bound near 1",
    "concentration": "attention concentrates",
    "dominant": "dominant-atom minority",
    "influence": "influence decays at the certified rate (slope)",
}


def evaluate_findings(data: RunData) -> list[Finding]:
    """Every finding for every run of ``data``: θ at NEAR_ONE and SHARP, concentration and dominant atoms over
    all rows and the core rows, and influence wherever the run measured it."""
    rows = data.finding_rows
    findings: list[Finding] = []
    if rows is None or rows.empty:
        findings += [
            Finding(
                finding=key,
                run_id="",
                subset="all",
                verdict="not measured",
                claim=CLAIMS[key],
                measured="This run has no audited rows.",
            )
            for key in ("theta", "concentration", "dominant")
        ]
    else:
        for run_id, part in rows.groupby("run_id", sort=True):
            run = str(run_id)
            pretrained = data.run_kinds.get(run) == "pretrained"
            subsets: tuple[Literal["all", "core"], ...] = ("all", "core")
            for subset, stats in zip(subsets, RunStatistics.of_run(part, run_id=run), strict=True):
                context = _Context(run_id=run, subset=subset, stats=stats, pretrained=pretrained)
                if stats.n_rows == 0:
                    findings.append(_empty(context, "theta", "No core rows (all are sink or early rows)."))
                    continue
                findings.append(theta_finding(context, threshold=NEAR_ONE))
                findings.append(theta_finding(context, threshold=SHARP))
                findings.append(concentration_finding(context, data))
                findings.append(dominant_finding(context, data))
    findings += influence_findings(data)
    return findings


@dataclass(frozen=True, kw_only=True)
class _Context:
    run_id: str
    subset: Literal["all", "core"]
    stats: RunStatistics
    pretrained: bool

    def base(self, finding: FindingName) -> dict[str, Any]:
        return {
            "finding": finding,
            "run_id": self.run_id,
            "subset": self.subset,
            "claim": CLAIMS[finding],
            "n_rows": self.stats.n_rows,
            "n_sequences": self.stats.n_sequences,
        }

    def where(self, step: int, layer: int) -> str:
        return f"layer {layer}" if self.pretrained else f"layer {layer}, step {step:,}"

    def units(self) -> str:
        seeds = self.stats.weights.n_seeds
        if seeds > 1:
            return f"{self.stats.n_sequences} (seed, sequence) pairs of {seeds} seeds, resampled by seed, then sequence"
        return f"{self.stats.n_sequences} sequences, resampled"


def _at(context: _Context, step: int) -> str:
    return "in the model" if context.pretrained else f"at step {step:,}"


def _empty(context: _Context, finding: FindingName, why: str) -> Finding:
    return Finding(**context.base(finding), verdict="not measured", measured=why)


def _judge(value: Interval, threshold: float, *, higher_agrees: bool = True) -> Verdict:
    """agrees / disagrees when the interval lies on one side of the threshold, inconclusive when it straddles."""
    if value.above(threshold):
        return "agrees" if higher_agrees else "disagrees"
    if value.below(threshold):
        return "disagrees" if higher_agrees else "agrees"
    return "inconclusive"


def _with_interval(value: Interval) -> dict[str, Any]:
    return {"statistic": value.estimate, "ci_low": value.low, "ci_high": value.high}


def theta_finding(context: _Context, *, threshold: float) -> Finding:
    """θ near 1: the lowest cell median of θ_lb against ``threshold``, judged beside the envelope E's lowest median.

    "implied by p_max" when the envelope's interval already clears the threshold; otherwise the θ interval decides.
    """
    stats = context.stats
    cells = stats.cells()
    (step, layer), theta = stats.lowest("theta_lower", cells)
    _, floor = stats.lowest("envelope", cells)
    theta_medians = {key: stats.median("theta_lower", *key)[0] for key in cells}
    envelope_medians = {key: stats.median("envelope", *key)[0] for key in cells}
    by_envelope = sum(value >= threshold for value in envelope_medians.values())
    by_certificate = sum(
        theta_medians[key] >= threshold > envelope_medians[key] for key in cells
    )  # where the certificate, not p_max, carries the claim
    shares = [stats.share_above_envelope(*key) for key in cells]
    verdict: Verdict = "implied by p_max" if floor.above(threshold) else _judge(theta, threshold)
    noun = "layers" if context.pretrained else "(layer, checkpoint) cells, seeds pooled"
    seeds = stats.seed_medians("theta_lower", step, layer)
    per_seed = "" if len(seeds) < 2 else f"; per seed {', '.join(f'{s}: {v:.4f}' for s, v in seeds.items())}"
    measured = (
        f"Statistic: the lowest median θ lower bound over {len(cells)} {noun}, {theta.text(4)} at "
        f"{context.where(step, layer)} (95 % bootstrap interval over {context.units()}{per_seed}); threshold "
        f"{threshold}. What p_max alone implies: the lowest median of the envelope E = max(s − m², 4m(s − m) + "
        f"s(1 − s)) is {floor.text(4)}; E's median reaches {threshold} in {by_envelope} of {len(cells)} cells, and "
        f"the certificate carries the claim beyond E in {by_certificate}. Rows whose θ lower bound exceeds E by "
        f"more than {ENVELOPE_MARGIN}: median share per cell {_percent(float(np.median(shares)))}. "
    )
    measured += {
        "implied by p_max": f"E's interval clears {threshold}: the claim follows from p_max alone.",
        "agrees": f"The θ interval clears {threshold} where E's does not: the certificate adds to p_max.",
        "disagrees": f"The θ interval lies below {threshold}.",
        "inconclusive": f"The θ interval straddles {threshold}: more sequences or seeds would decide it.",
    }.get(verdict, "")
    details: dict[str, Any] = {
        "envelope_statistic": floor.estimate,
        "envelope_ci_low": floor.low,
        "envelope_ci_high": floor.high,
        "where": {"step": step, "layer": layer},
        "seed_statistics": {str(s): v for s, v in seeds.items()},
        "cells_envelope_reaches": by_envelope,
        "cells_certificate_adds": by_certificate,
        "n_cells": len(cells),
    }
    table, caption = None, None
    if threshold == NEAR_ONE:
        heads, shown = _heads_below(context, threshold)
        details["heads"] = heads
        table, caption = _theta_table(context), _theta_caption(context)
        if heads["n_heads"]:
            measured += (
                f" Per head {_at(context, heads['step'])}: "
                f"{heads['n_below']} of {heads['n_heads']} heads have a median θ lower bound whose interval lies "
                f"below {threshold}, {heads['n_straddling']} straddle it" + (f" ({shown})." if shown else ".")
            )
    return Finding(
        **context.base("theta"),
        verdict=verdict,
        measured=measured,
        threshold=threshold,
        **_with_interval(theta),
        details=details,
        table=table,
        table_caption=caption,
    )


def _heads_below(context: _Context, threshold: float) -> tuple[dict[str, Any], str]:
    """Per (layer, head) at the last checkpoint: the heads whose median θ_lb interval lies below ``threshold``."""
    stats = context.stats
    step = stats.steps[-1]
    below, straddling = [], 0
    pairs = stats.heads(step)
    for layer, head in pairs:
        estimate, replicates = stats.median("theta_lower", step, layer, head)
        value = interval(estimate, replicates)
        if value.below(threshold):
            below.append(
                {
                    "layer": layer,
                    "head": head,
                    **_with_interval(value),
                    "envelope": stats.median("envelope", step, layer, head)[0],
                }
            )
        elif not value.above(threshold):
            straddling += 1
    below.sort(key=lambda record: record["statistic"])
    shown = ", ".join(
        f"L{r['layer']}H{r['head']} {r['statistic']:.3f} (E {r['envelope']:.3f})" for r in below[:HEADS_SHOWN]
    )
    if len(below) > HEADS_SHOWN:
        shown += f", … {len(below) - HEADS_SHOWN} more in findings.json"
    summary = {"step": step, "n_heads": len(pairs), "n_below": len(below), "n_straddling": straddling, "below": below}
    return summary, shown


def _theta_table(context: _Context) -> pd.DataFrame:
    """Per layer at the last checkpoint: median θ_lb with its interval, median E, the share above E, and the lowest
    median over checkpoints."""
    stats = context.stats
    last = stats.steps[-1]
    records = []
    for layer in stats.layers:
        estimate, replicates = stats.median("theta_lower", last, layer)
        record = {
            "layer": layer,
            "median θ_lb [95 % CI]": interval(estimate, replicates).text(4) if math.isfinite(estimate) else "–",
            "median E": f"{stats.median('envelope', last, layer)[0]:.4f}",
            f"θ_lb − E > {ENVELOPE_MARGIN}": _percent(stats.share_above_envelope(last, layer)),
        }
        if len(stats.steps) > 1:
            lows = [stats.median("theta_lower", step, layer)[0] for step in stats.steps]
            record["lowest over checkpoints"] = f"{np.nanmin(lows):.4f}"
        records.append(record)
    return pd.DataFrame(records)


def _theta_caption(context: _Context) -> str:
    at = "" if context.pretrained else f" at step {context.stats.steps[-1]:,} (seeds pooled)"
    return (
        f"{context.subset.capitalize()} rows, per layer{at}: median θ lower bound with its 95 % interval, the "
        "median of the envelope E that p_max alone implies, and the share of rows where the certificate exceeds E."
    )


def concentration_finding(context: _Context, data: RunData) -> Finding:
    """Concentration from the end of warmup to the last checkpoint: median over layers of the p_max·n growth
    (threshold CONCENTRATION_FACTOR) and of the normalized-entropy fall (ENTROPY_DROP), with joint intervals."""
    stats = context.stats
    if context.pretrained or len(stats.steps) < 2:
        what = "a pretrained model" if context.pretrained else f"one checkpoint (step {stats.steps[0]:,})"
        step = stats.steps[-1]
        levels = [stats.median("p_max_n", step, layer)[0] for layer in stats.layers]
        return Finding(
            **context.base("concentration"),
            verdict="not measured",
            measured=(
                f"This run is {what}: there is no training trajectory. Its level, relative to uniform attention "
                f"(1): median p_max·n per layer {', '.join(f'{v:.2f}' for v in levels)}."
            ),
        )
    last = stats.steps[-1]
    start, why = warm_step(stats.steps, data, context.run_id)
    from_start = _change(stats, start, last)
    from_first = _change(stats, stats.steps[0], last)
    growth, fall = from_start["growth"], from_start["fall"]
    if growth.above(CONCENTRATION_FACTOR) and fall.above(ENTROPY_DROP):
        verdict: Verdict = "agrees"
    elif growth.below(1.0) and fall.below(0.0):
        verdict = "disagrees"
    elif growth.below(CONCENTRATION_FACTOR) or fall.below(ENTROPY_DROP):
        verdict = "not observed"
    else:
        verdict = "inconclusive"
    heads = _concentrating_heads(stats, start, last)
    measured = (
        f"Statistic: the median over layers of the growth of median p_max·n from step {start:,} ({why}) to "
        f"{last:,}: {growth.text(2)}× (threshold {CONCENTRATION_FACTOR:g}×), with the median fall of mean "
        f"normalized entropy {fall.text(3)} (threshold {ENTROPY_DROP}); 95 % intervals over {context.units()}. "
        f"From step {stats.steps[0]:,} instead: {from_first['growth'].text(2)}× and {from_first['fall'].text(3)}. "
        f"Heads that concentrate by both thresholds from step {start:,}: {heads[0]} of {heads[1]}. "
    )
    measured += {
        "agrees": "Both intervals clear their thresholds.",
        "disagrees": "Attention spreads out instead: p_max·n falls and entropy rises.",
        "not observed": "An interval lies below its threshold: no substantial concentration after warmup.",
        "inconclusive": "An interval straddles its threshold: more sequences or seeds would decide it.",
    }[verdict]
    return Finding(
        **context.base("concentration"),
        verdict=verdict,
        measured=measured,
        threshold=CONCENTRATION_FACTOR,
        **_with_interval(growth),
        details={
            "from_step": start,
            "from_step_reason": why,
            "to_step": last,
            "entropy_fall": fall.estimate,
            "entropy_fall_ci_low": fall.low,
            "entropy_fall_ci_high": fall.high,
            "from_first_checkpoint": {k: _with_interval(from_first[k]) for k in ("growth", "fall")},
            "per_layer": from_start["per_layer"],
            "heads_concentrating": heads[0],
            "n_heads": heads[1],
        },
        table=_concentration_table(stats, start, last),
        table_caption=(
            f"{context.subset.capitalize()} rows, per layer, steps {stats.steps[0]:,} → {start:,} → {last:,}: median "
            "p_max·n and mean normalized entropy (uniform attention has 1 for both), seeds pooled."
        ),
    )


def warm_step(steps: list[int], data: RunData, run_id: str) -> tuple[int, str]:
    """The first audited checkpoint after warmup whose eval loss is below the unigram baseline (where both are
    known), else the first after warmup, else the second checkpoint; and the reason, in words."""
    warmup = _warmup_steps(data, run_id)
    unigram = None
    if data.baselines is not None and not data.baselines.empty:
        values = data.baselines.loc[data.baselines["name"] == "unigram", "eval_loss"].dropna()
        unigram = float(values.iloc[0]) if len(values) else None
    losses = _eval_losses(data, run_id)
    candidates = [s for s in steps[1:] if warmup is None or s >= warmup]
    for step in candidates:
        loss = _loss_at(losses, step)
        if unigram is None or loss is None or loss < unigram:
            reason = "end of warmup" if warmup is not None else "second checkpoint"
            if unigram is not None and loss is not None:
                reason += f"; eval loss {loss:.2f} below the unigram's {unigram:.2f}"
            return step, reason
    return (candidates or steps[1:])[0], "second checkpoint"


def _warmup_steps(data: RunData, run_id: str) -> int | None:
    config = (data.manifest or {}).get("config") or {}
    train = config.get("train") if isinstance(config, dict) else None
    if not isinstance(train, dict) or "warmup_steps" not in train:
        return None
    warmup = int(train["warmup_steps"])
    name = str(config.get("name", ""))
    placement = run_id[len(name) + 1 :] if name and run_id.startswith(name + "-") else None
    own = (config.get("placement_train") or {}).get(placement or "", {})
    return int(own.get("warmup_steps", warmup))


def _eval_losses(data: RunData, run_id: str) -> pd.Series | None:
    training = data.training
    if training is None or training.empty or "eval_loss" not in training:
        return None
    part = training[(training["run_id"] == run_id) & training["eval_loss"].notna()]
    return part.groupby("step")["eval_loss"].mean() if not part.empty else None


def _loss_at(losses: pd.Series | None, step: int) -> float | None:
    if losses is None:
        return None
    known = losses[losses.index <= step]
    return float(known.iloc[-1]) if len(known) else None


def _change(stats: RunStatistics, start: int, last: int) -> dict[str, Any]:
    """Per layer and as the median over layers: p_max·n growth and normalized-entropy fall, start → last."""
    growths, falls, per_layer = [], [], []
    for layer in stats.layers:
        before, before_r = stats.median("p_max_n", start, layer)
        after, after_r = stats.median("p_max_n", last, layer)
        h_before, h_before_r = stats.mean("normalized_entropy", start, layer)
        h_after, h_after_r = stats.mean("normalized_entropy", last, layer)
        growths.append((after / before, after_r / before_r))
        falls.append((h_before - h_after, h_before_r - h_after_r))
        per_layer.append({"layer": layer, "growth": after / before, "entropy_fall": h_before - h_after})
    growth = interval(float(np.median([g for g, _ in growths])), np.median(np.stack([r for _, r in growths]), axis=0))
    fall = interval(float(np.median([f for f, _ in falls])), np.median(np.stack([r for _, r in falls]), axis=0))
    return {"growth": growth, "fall": fall, "per_layer": per_layer}


def _concentrating_heads(stats: RunStatistics, start: int, last: int) -> tuple[int, int]:
    frame = stats.rows[stats.rows["step"].isin([start, last])]
    grouped = frame.groupby(["layer", "head", "step"]).agg(
        p_max_n=("p_max_n", "median"), entropy=("normalized_entropy", "mean")
    )
    wide = grouped.unstack("step").dropna()
    if wide.empty:
        return 0, 0
    growth = wide[("p_max_n", last)] / wide[("p_max_n", start)]
    fall = wide[("entropy", start)] - wide[("entropy", last)]
    return int(((growth >= CONCENTRATION_FACTOR) & (fall >= ENTROPY_DROP)).sum()), len(wide)


def _concentration_table(stats: RunStatistics, start: int, last: int) -> pd.DataFrame:
    steps = list(dict.fromkeys([stats.steps[0], start, last]))
    records = []
    for layer in stats.layers:
        pmax = " → ".join(f"{stats.median('p_max_n', s, layer)[0]:.2f}" for s in steps)
        entropy = " → ".join(f"{stats.mean('normalized_entropy', s, layer)[0]:.3f}" for s in steps)
        records.append({"layer": layer, "p_max·n": pmax, "norm. entropy": entropy})
    return pd.DataFrame(records)


def dominant_finding(context: _Context, data: RunData) -> Finding:
    """Dominant minority: the largest cell fraction against MAJORITY, and the last checkpoint's fraction against
    DOMINANT_MIN_FRACTION, with intervals. The rows' θ = 4m(s − m) + s(1 − s) is how dominant rows are certified,
    so it is reported as a consistency check, not as evidence."""
    stats = context.stats
    last = stats.steps[-1]
    appear = interval(*stats.mean("dominant", last))
    (step, layer), largest = stats.highest_fraction("dominant", stats.cells())
    n_dominant = int(stats.rows["dominant"].sum())
    if n_dominant == 0 or appear.below(DOMINANT_MIN_FRACTION):
        verdict: Verdict = "not observed"
    elif largest.above(MAJORITY):
        verdict = "disagrees"
    elif appear.above(DOMINANT_MIN_FRACTION) and largest.below(MAJORITY):
        verdict = "agrees"
    else:
        verdict = "inconclusive"
    at = _at(context, last)
    sinks = int((stats.rows["dominant"] & stats.rows["sink"]).sum())
    measured = (
        f"Statistic: the largest dominant fraction over {'layers' if context.pretrained else 'cells'}, "
        f"{largest.text(percent=True)} at {context.where(step, layer)} (a minority below {MAJORITY:.0%}); the "
        f"fraction {at}, all layers, {appear.text(percent=True)} (present from {DOMINANT_MIN_FRACTION:.0%}); 95 % "
        f"intervals over {context.units()}. Dominant rows: {_count(n_dominant, stats.n_rows)}, "
        f"{_count(sinks, n_dominant)} "
        "of them on key 0 (a sink). "
    )
    measured += {
        "agrees": "A dominant minority is present.",
        "disagrees": f"Dominant rows are a majority in at least one {'layer' if context.pretrained else 'cell'}.",
        "not observed": "There are no dominant rows, or confidently fewer than the threshold.",
        "inconclusive": "An interval straddles its threshold: more sequences or seeds would decide it.",
    }[verdict]
    details: dict[str, Any] = {
        "where": {"step": step, "layer": layer},
        "fraction_at_last": appear.estimate,
        "fraction_at_last_ci_low": appear.low,
        "fraction_at_last_ci_high": appear.high,
        "n_dominant": n_dominant,
        "n_dominant_sink": sinks,
    }
    check = data.dominant_checks.get(context.run_id)
    if context.subset == "all" and check is not None and check.n_dominant and check.max_abs_deviation_lower is not None:
        deviation = check.max_abs_deviation_lower
        measured += (
            f" Consistency check (how dominant rows are certified, not a finding): the largest |θ lower bound − "
            f"(4m(s − m) + s(1 − s))| over dominant rows is {deviation:.2e} (tolerance {CLOSED_FORM_TOLERANCE:g})"
            + ("." if deviation <= CLOSED_FORM_TOLERANCE else " — above tolerance: a certificate fault to report.")
        )
        details["closed_form_max_deviation"] = deviation
    majority = _majority_heads(stats, last)
    if majority:
        measured += f" Heads with a dominant majority {at}: {', '.join(majority[:HEADS_SHOWN])}."
    details["majority_heads"] = majority
    return Finding(
        **context.base("dominant"),
        verdict=verdict,
        measured=measured,
        threshold=MAJORITY,
        **_with_interval(largest),
        details=details,
        table=_dominant_table(stats, pretrained=context.pretrained) if context.subset == "all" else None,
        table_caption="Share of dominant-atom rows per layer and checkpoint (seeds pooled), all rows.",
    )


def _majority_heads(stats: RunStatistics, step: int) -> list[str]:
    frame = stats.rows[stats.rows["step"] == step]
    fractions = frame.groupby(["layer", "head"])["dominant"].mean()
    return [f"L{layer}H{head} {_percent(value)}" for (layer, head), value in fractions.items() if value >= MAJORITY]


def _dominant_table(stats: RunStatistics, *, pretrained: bool) -> pd.DataFrame:
    table = stats.rows.pivot_table(index="layer", columns="step", values="dominant", aggfunc="mean")
    table.columns = ["pretrained" if pretrained else f"step {int(c):,}" for c in table.columns]
    table = table.map(_percent)
    if table.shape[1] > table.shape[0]:
        table = table.T.rename_axis(index="checkpoint", columns=None)
        table.columns = [f"layer {int(layer)}" for layer in table.columns]
    return table.reset_index()


def influence_findings(data: RunData) -> list[Finding]:
    """Per model of the influence table: the log–log slope of ‖Δy_n‖ with its t interval against −1, and the
    certified constant (or why there is none)."""
    from attnsens.errors import AttnsensError
    from attnsens.influence.slope import fit_loglog_slope

    table = data.influence
    if table is None or table.empty:
        return []
    findings = []
    for (run_id, model), part in table.groupby(["run_id", "model"], sort=True):
        base: dict[str, Any] = {
            "finding": "influence",
            "run_id": str(run_id),
            "subset": None,
            "claim": CLAIMS["influence"],
        }
        samples = int(part["n_samples"].min()) if "n_samples" in part else None
        try:
            fit = fit_loglog_slope(part)
        except AttnsensError as err:
            findings.append(Finding(**base, verdict="not measured", measured=f"{model}: {err}"))
            continue
        slope = Interval(fit.slope, fit.slope_ci[0], fit.slope_ci[1])
        summary = data.influence_summaries.get((str(run_id), str(model)), {})
        lengths = sorted(int(n) for n in part["n"].unique())
        expected, rate = expected_slope(lengths, summary)
        # The certified rate's shape or faster agrees (within the margin); an interval wholly above decays slower.
        slowest = expected + INFLUENCE_MARGIN
        verdict: Verdict = "disagrees" if slope.low > slowest else "agrees" if slope.high <= slowest else "inconclusive"
        log10_c = certified_log10_constant(part, summary)
        measured = (
            f"{model}: slope of log max ‖Δy_n‖ on log n over {part['n'].nunique()} lengths "
            f"({int(part['n'].min()):,}–{int(part['n'].max()):,}), {slope.text(3)} ({fit.confidence:.0%} t "
            f"interval, {samples} samples per length and position kind). The certified rate is {rate}, whose "
            f"slope over these lengths is {expected:.3f}; a measured slope up to {slowest:.3f} agrees with it. "
        )
        if expected > INFLUENCE_SLOPE and slope.low > INFLUENCE_SLOPE:
            measured += "Over these lengths it decays more slowly than 1/n, as the causal rate allows. "
        layers = summary.get("layers") or []
        p_max_n = [layer["p_max_n_median"] for layer in layers if layer.get("p_max_n_median") is not None]
        if p_max_n:
            measured += f"Median p_max·n per layer {', '.join(f'{v:.2f}' for v in p_max_n)}"
            measured += (
                f": attention is close to uniform (below {UNIFORM_P_MAX_N:g} in every layer), so a 1/n decay is "
                "plain averaging. "
                if max(p_max_n) < UNIFORM_P_MAX_N
                else ": attention is not uniform. "
            )
        if log10_c is None:
            measured += "No certified C applies to this model (see the table)."
        else:
            measured += f"Certified C: 10^{log10_c:,.1f}"
            input_set = summary.get("input_set_log10_C")
            measured += "." if input_set is None else f"; input-set C (not a certificate): 10^{input_set:,.1f}."
        findings.append(
            Finding(
                **base,
                verdict=verdict,
                measured=measured,
                threshold=expected,
                **_with_interval(slope),
                n_rows=None,
                n_sequences=samples,
                details={
                    "model": str(model),
                    "log10_certified_C": log10_c,
                    "input_set_log10_C": summary.get("input_set_log10_C"),
                    "p_max_n_median_per_layer": p_max_n,
                    "confidence": fit.confidence,
                },
            )
        )
    return findings


def certified_log10_constant(part: pd.DataFrame, summary: dict[str, Any]) -> float | None:
    """log10 of max_n n·(C/n) over one model's influence rows, or the stored log10 C (``summary``, the
    experiment's metadata) where C/n overflowed a float; None where no certificate applies."""
    bound = part["influence_upper_bound"] if "influence_upper_bound" in part else pd.Series(dtype=float)
    if not bound.notna().any():
        return None
    value = float((part["n"] * bound).max())
    if math.isfinite(value) and value > 0:
        return math.log10(value)
    stored = summary.get("log10_certified_C")
    return None if stored is None else float(stored)


def expected_slope(lengths: list[int], summary: dict[str, Any]) -> tuple[float, str]:
    """The log–log slope over ``lengths`` of the rate the influence theorem certifies, and that rate in words: 1/n
    for unmasked attention (slope −1), and E_L(H_n)/n ≤ C·H_n^{L−1}/n for causal attention over L layers
    (docs/math.md §10.3), whose slope over short lengths is well above −1 (H_n = 1 + 1/2 + … + 1/n)."""
    layers = len(summary.get("layers") or [])
    if summary.get("masking") != "causal" or layers < 2 or len(lengths) < 2:
        return INFLUENCE_SLOPE, "C/n"
    harmonic = np.cumsum(1.0 / np.arange(1, max(lengths) + 1))
    n = np.asarray(lengths, dtype=float)
    log_rate = (layers - 1) * np.log(harmonic[n.astype(int) - 1]) - np.log(n)
    slope = float(np.polyfit(np.log(n), log_rate, 1)[0])
    return slope, f"C·H_n^{layers - 1}/n (causal attention, {layers} layers)"


def findings_records(findings: list[Finding]) -> list[dict[str, Any]]:
    """The findings as the list of JSON objects written to findings.json."""
    return [finding.record() for finding in findings]


def _number(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.integer | int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, np.floating | float):
        return _number(float(value))
    if isinstance(value, np.bool_):
        return bool(value)
    return value


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


__all__ = [
    "CLAIMS",
    "CONFIDENCE",
    "EARLY_KEYS",
    "Finding",
    "evaluate_findings",
    "findings_records",
    "warm_step",
]
