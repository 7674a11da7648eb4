"""The sections of the report, each built from a RunData; a section without data says so instead of appearing.

Captions state what a figure shows and which claim it tests. All text from the run is escaped (``esc``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from attnsens.errors import FileFormatError, InputError
from attnsens.report import figures, figures_bounds
from attnsens.report.cells import EARLY_KEYS
from attnsens.report.data import RunData
from attnsens.report.findings import (
    CONCENTRATION_FACTOR,
    ENTROPY_DROP,
    NEAR_ONE,
    SHORT_CLAIMS,
    Finding,
    certified_log10_constant,
)
from attnsens.report.html_parts import definition_list, esc, figure_html, table_html
from attnsens.store.summary import ALL_HEADS

SOUNDNESS_RTOL = 1e-6
"""Relative slack allowed when checking that a measurement does not exceed its certified bound."""

_BOUND_PAIRS = (
    ("mha_local_jacobian_upper_bound", "mha_jacobian_estimate"),
    ("mha_lipschitz_upper_bound", "mha_jacobian_estimate"),
    ("mha_local_paper_form_upper_bound", "mha_jacobian_estimate"),
    ("mha_length_dependent_upper_bound", "mha_jacobian_estimate"),
    ("block_lipschitz_upper_bound", "block_jacobian_estimate"),
    ("residual_jacobian_upper_bound", "residual_jacobian_estimate"),
)
_BOUND_TABLE_COLUMNS = {
    "theta_tilde": "θ̃",
    "mha_local_jacobian_upper_bound": "MHA local bound",
    "mha_lipschitz_upper_bound": "MHA bound (θ̃ = 1)",
    "mha_jacobian_estimate": "MHA estimate",
    "tightness_ratio": "tightness",
    "ffn_lipschitz_upper_bound": "FFN bound",
    "block_lipschitz_upper_bound": "block bound",
    "block_jacobian_estimate": "block estimate",
    "ln_condition_fraction": "LN condition",
}
_BLOCK_TABLE_COLUMNS = ("FFN bound", "block bound", "block estimate", "LN condition")
"""The layer-level table is printed in two parts, attention and the rest of the block, so each fits 800 px."""


@dataclass(frozen=True, kw_only=True)
class Section:
    """A report section: anchor, heading, and its body as escaped HTML."""

    anchor: str
    title: str
    body: str

    def html(self) -> str:
        return f'<section id="{esc(self.anchor)}"><h2>{esc(self.title)}</h2>{self.body}</section>'


def _present(table: pd.DataFrame | None, name: str) -> pd.DataFrame:
    """A table a section is built from; the report plans each section only where its table exists (report/html.py)."""
    if table is None:
        raise FileFormatError(f"this run has no {name} table, which the report's section on it needs")
    return table


def _figure(build: Callable[[], Figure], caption: str, *, title: str, fmt_: str = "svg") -> str:
    """The figure, or a note naming why it could not be drawn from this run's data."""
    try:
        fig = build()
    except InputError as err:
        return f'<p class="note">Figure “{esc(title)}” not drawn: {esc(err)}</p>'
    return figure_html(fig, caption, title=title, fmt_=fmt_)


def _by_run(frame: pd.DataFrame) -> list[tuple[str | None, pd.DataFrame]]:
    """``frame`` split by run, so that nothing of two placements (or a reference) is averaged together; one
    unnamed part when it holds a single run."""
    if "run_id" not in frame or frame["run_id"].nunique() <= 1:
        return [(None, frame)]
    return [(str(run), part) for run, part in frame.groupby("run_id", sort=True)]


def _figures_by_run(
    frame: pd.DataFrame,
    build: Callable[[pd.DataFrame, str | None], Figure],
    caption: str,
    *,
    title: str,
    fmt_: str = "svg",
    keep: Callable[[pd.DataFrame], bool] = lambda _part: True,
) -> str:
    """``build(part, run)`` for each run's part of ``frame`` (``_by_run``), titled "title, run"; of several runs
    only those ``keep`` accepts (a single run is always drawn, or its note says why not)."""
    return "".join(
        _figure(
            functools.partial(build, part, run), caption, title=title if run is None else f"{title}, {run}", fmt_=fmt_
        )
        for run, part in _by_run(frame)
        if run is None or keep(part)
    )


def overview_section(data: RunData, omitted: list[str]) -> Section:
    info = data.overview
    items = []
    static = bool(data.run_kinds) and set(data.run_kinds.values()) == {"pretrained"}
    fields = (("model", "model"), ("run", "run_id")) + (() if static else (("seeds", "seed"), ("checkpoints", "step")))
    for label, key in fields:
        values = info.get(key)
        if values:
            items.append((label, esc(", ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in values))))
    if data.run_kinds and data.cells is not None:
        items.append(("runs", esc("; ".join(run_label(data, run) for run in sorted(data.run_kinds)))))
    if data.baselines is not None and not data.baselines.empty:
        sizes = data.baselines.dropna(subset=["n_parameters"])
        items += [(f"parameters, {r.run_id}", esc(f"{int(r.n_parameters):,}")) for r in sizes.itertuples()]
    shapes = info.get("shapes", {})
    if len(set(shapes.values())) == 1:
        items.append(("layers × heads", esc(_shape_text(next(iter(shapes.values()))))))
    else:  # runs of different models: each its own
        items += [(f"layers × heads, {run}", esc(_shape_text(shape))) for run, shape in shapes.items()]
    if "training_steps" in info:
        items.append(("training steps", esc(f"{info['training_steps']:,}")))
    records = ", ".join(f"{name} {count:,}" for name, count in info.get("records", {}).items())
    items.append(("records", esc(records)))
    items.append(("directory", f"<code>{esc(data.run_dir)}</code>"))
    provenance = (data.manifest or {}).get("provenance", {})
    if provenance:
        items.append(("git revision", f"<code>{esc(provenance.get('git_sha') or 'unknown')}</code>"))
        versions = provenance.get("versions", {})
        items.append(("versions", esc(", ".join(f"{k} {v}" for k, v in versions.items()))))
    body = (
        "<p>What was measured, on which model, and where it came from. θ(p) = 4·max<sub>S</sub> p(S)(1 − p(S)) is the "
        "balanced-mass factor of an attention row; the ∞→1 norm of the softmax Jacobian equals θ/τ exactly "
        "(docs/math.md T1), so θ near 1 means attention is as sensitive as a softmax row can be.</p>"
        + definition_list(items)
    )
    config = _flatten((data.manifest or {}).get("config") or {})
    if config:
        body += (
            f'<details class="config"><summary>Configuration ({len(config)} settings)</summary>'
            + table_html(pd.DataFrame({"key": list(config), "value": list(config.values())}), max_rows=400)
            + "</details>"
        )
    if provenance:
        body += (
            "<details><summary>Full provenance (argv, versions, time)</summary>"
            f"<pre>{esc(json.dumps(provenance, indent=2, default=str))}</pre></details>"
        )
    if omitted:
        body += '<p class="note">Not in this run: ' + esc("; ".join(omitted)) + ".</p>"
    return Section(anchor="overview", title="Overview", body=body)


def _flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """Nested config as dotted keys → JSON text of each leaf (``{"model": {"d_model": 16}}`` → model.d_model)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return flat


def _shape_text(shape: tuple[int, int | None]) -> str:
    layers, heads = shape
    return f"{layers} × {'?' if heads is None else heads}"


def run_label(data: RunData, run_id: str) -> str:
    """'tiny-pre (training run, seeds 0–2)' or 'reference-smollm2 (pretrained model)'."""
    kind = data.run_kinds.get(run_id, "training")
    if kind == "pretrained":
        return f"{run_id} (pretrained model)"
    if data.cells is None:  # a run with an influence table only
        return run_id
    cells = data.cells
    seeds = sorted(int(s) for s in cells.loc[cells["run_id"] == run_id, "seed"].unique())
    if not seeds:
        return run_id
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    what = "training run" if kind == "training" else "one checkpoint"
    return f"{run_id} ({what}, {seed_text})"


def findings_section(data: RunData, findings: list[Finding]) -> Section:
    runs = list(dict.fromkeys(f.run_id for f in findings))
    intro = (
        "<p>The paper's findings, checked against each run's data: every placement trained here and, where present, "
        "the pretrained reference. Each verdict names its statistic and threshold and rests on a 95 % bootstrap "
        "interval over independent units (audited sequences, and seeds where there are several; never rows): "
        "<em>agrees</em> or <em>disagrees</em> only when the interval lies on one side of the threshold, "
        "<em>inconclusive</em> when it straddles it, <em>implied by p_max</em> when the envelope "
        "E = max(s − m², 4m(s − m) + s(1 − s)) that the largest weight alone gives already reaches it "
        "(docs/math.md T2(b)). Every finding is computed over all rows and over the core rows, which leave out "
        f"attention-sink rows (argmax at key 0) and early rows (fewer than {EARLY_KEYS} keys). The same objects are "
        "in <code>findings.json</code>.</p>"
    )
    body = intro + table_html(_headline(findings), caption="Verdict per run and finding: all rows beside core rows.")
    for run in runs:
        cards = []
        for finding in (f for f in findings if f.run_id == run):
            table = table_html(finding.table, caption=finding.table_caption) if finding.table is not None else ""
            badge = esc(finding.verdict.replace(" ", "-"))
            subset = f" ({finding.subset} rows)" if finding.subset else ""
            threshold = "" if finding.threshold is None else f" — threshold {finding.threshold:.3g}"
            cards.append(
                f'<div class="finding {badge}">'
                f'<p><span class="badge {badge}">{esc(finding.verdict)}</span>'
                f'<span class="claim">{esc(SHORT_CLAIMS.get(finding.finding, finding.finding))}{esc(subset)}'
                f"{esc(threshold)}. Paper: {esc(finding.claim)}</span></p>"
                f"<p>Measured: {esc(finding.measured)}</p>{table}</div>"
            )
        heading = esc(run_label(data, run)) if run else "this run"
        body += f"<h3>{heading}</h3>" + "".join(cards)
    return Section(anchor="findings", title="Findings, as measured", body=body)


def _headline(findings: list[Finding]) -> pd.DataFrame:
    """One row per (run, finding, threshold): the verdict and statistic [95 % interval] of all rows and core rows."""
    records: dict[tuple[str, str, float | None], dict[str, str]] = {}
    for finding in findings:
        key = (finding.run_id, finding.finding, finding.threshold)
        record = records.setdefault(
            key,
            {
                "run": finding.run_id or "run",
                "finding": SHORT_CLAIMS.get(finding.finding, finding.finding)
                + ("" if finding.threshold is None else f" ({finding.threshold:.3g})"),
            },
        )
        value = "" if finding.statistic is None else f": {_statistic_text(finding)}"
        record[f"{finding.subset or 'all'} rows"] = finding.verdict + value
    return pd.DataFrame(list(records.values())).fillna("–")


def _statistic_text(finding: Finding) -> str:
    digits = 2 if finding.finding == "concentration" else 3
    if finding.finding == "dominant":
        percent = [100 * (value or 0) for value in (finding.statistic, finding.ci_low, finding.ci_high)]
        return "{:.1f} % [{:.1f}, {:.1f}]".format(*percent)
    low = "–" if finding.ci_low is None else f"{finding.ci_low:.{digits}f}"
    high = "–" if finding.ci_high is None else f"{finding.ci_high:.{digits}f}"
    return f"{finding.statistic:.{digits}f} [{low}, {high}]"


def _has_trend(data: RunData) -> bool:
    """True when some run has more than one audited checkpoint, so figures are drawn against the step."""
    return data.cells is not None and bool((data.cells.groupby("run_id")["step"].nunique() > 1).any())


def _trend_and_static(data: RunData) -> list[tuple[str, pd.DataFrame]]:
    """The cells split into training runs (drawn over checkpoints) and static ones (drawn per layer)."""
    cells = _present(data.cells, "cells")
    static = {run for run, kind in data.run_kinds.items() if kind != "training"}
    parts = [
        ("training runs", cells[~cells["run_id"].isin(static)]),
        ("pretrained and single-checkpoint runs", cells[cells["run_id"].isin(static)]),
    ]
    return [(label, part) for label, part in parts if not part.empty]


def _cell_figures(data: RunData, build: Callable[[pd.DataFrame], Figure], caption: str, title: str) -> str:
    """One figure per kind of run present (training runs over checkpoints, static runs per layer)."""
    parts = _trend_and_static(data)
    return "".join(
        _figure(
            functools.partial(build, part),
            f"{label.capitalize()}. {caption}" if len(parts) > 1 else caption,
            title=title,
        )
        for label, part in parts
    )


def theta_section(data: RunData) -> Section:
    caption = (
        "Median over audited rows of the certified θ lower bound, per layer with all heads pooled: for training "
        "runs against the checkpoint step (symmetric-log axis, step 0 included), one panel per run, one line per "
        "layer (colour: depth), the band spanning the seeds; for a pretrained model against the layer. Dotted "
        "line: θ = 1, the largest possible value. Since the certificate is a lower bound, half the rows have a "
        "true θ at least the plotted median (docs/math.md T2(f)). Read it with the concentration figure: p_max alone "
        "implies θ ≥ E = max(1 − m², 4m(1 − m)), which is at least 8/9 for every row with m < 1/2 and reaches "
        f"{NEAR_ONE} unless m lies in (0.316, 0.342) or above 0.658; the findings compare each median with E's."
    )
    body = _cell_figures(data, figures.theta_lower_by_step_figure, caption, "θ lower bound by layer")
    return Section(anchor="theta", title="θ lower bound per layer and checkpoint", body=body)


def concentration_section(data: RunData) -> Section:
    caption = (
        "Concentration relative to uniform attention over the row's n keys: median p_max·n (log axis; 1 = uniform, "
        "n = all mass on one key) and mean normalized entropy H/log n (1 = uniform), per layer, all heads pooled; "
        "bands span the seeds. The concentration finding asks for p_max·n to grow at least "
        f"{CONCENTRATION_FACTOR:g}× and normalized entropy to fall by {ENTROPY_DROP} or more."
    )
    body = _cell_figures(data, figures.concentration_figure, caption, "Concentration")
    return Section(anchor="concentration", title="Attention concentration", body=body)


def dominant_section(data: RunData) -> Section:
    caption = (
        "Number of rows with a dominant atom (p_max ≥ half the row's mass) per layer cell, on a symmetric-log "
        "count axis so that zero and a handful of rows are both visible. Attention sinks on key 0 and early "
        "positions raise it (the findings give the counts without them, docs/math.md §7)."
    )
    body = _cell_figures(data, figures.dominant_fraction_figure, caption, "Dominant-atom rows")
    return Section(anchor="dominant", title="Dominant-atom rows", body=body)


def scatter_section(data: RunData) -> Section:
    sample = data.rows_sample
    n_dominant = int(sample["dominant"].sum()) if sample is not None else 0
    shown = len(sample) - n_dominant if sample is not None else 0
    caption = (
        f"θ lower bound against p_max: every dominant row ({n_dominant:,}) and {shown:,} of the others, sampled "
        "uniformly with a fixed seed; the axes are zoomed to where the rows are. Dashed: "
        "the envelope max(4m(1−m), 1−m²), a floor every row must respect (docs/math.md T2(b)); red: the exact value "
        "4m(1−m) for m ≥ 1/2 (T2(a)). Tests that dominant rows sit exactly on the red curve and that no row falls "
        "below the envelope."
    )
    body = _figure(lambda: figures.theta_vs_pmax_figure(data.rows_sample), caption, title="θ versus p_max", fmt_="png")
    return Section(anchor="scatter", title="θ versus p_max", body=body)


def heads_section(data: RunData) -> Section:
    caption = (
        "Median θ lower bound (left) and median p_max (right) for every layer and head at the last audited checkpoint, "
        "averaged over seeds. Shows whether low θ is spread over the model or confined to a few heads "
        "(e.g. sink or previous-token heads)."
    )
    body = _figures_by_run(
        _present(data.summary, "summary"),
        lambda part, run: figures.layer_head_heatmap_figure(part, run=run),
        caption,
        title="Layer × head",
        fmt_="png",
    )
    return Section(anchor="heads", title="Layer × head", body=body)


def training_section(data: RunData) -> Section:
    caption = (
        "Training loss (solid) and held-out eval loss at the checkpoints (dotted) beside count-based baselines "
        "scored on the same eval batch (dashed: unigram, and the best Dirichlet-smoothed bigram), the global "
        "gradient ℓ2 norm before clipping (log scale) and the learning rate against step, per run with the band "
        "spanning the seeds: the context in which the attention statistics above were measured. A model below "
        "the bigram line has learned more than which token follows which."
    )
    body = _figure(lambda: figures_bounds.training_figure(data.training, data.baselines), caption, title="Training")
    if data.grad_norms is not None and not data.grad_norms.empty:
        body += _figures_by_run(
            data.grad_norms,
            lambda part, run: figures_bounds.grad_norms_figure(part, title=run),
            "Gradient ℓ2 norm of each parameter group before clipping, per layer (colour: depth; layer −1 = "
            "parameters outside the blocks), mean over seeds: where the gradient signal sits while attention "
            "changes (docs/math.md §9.5).",
            title="Gradient norms by parameter group",
        )
    return Section(anchor="training", title="Training", body=body)


def bounds_section(data: RunData) -> Section:
    bounds = _present(data.bounds, "bounds")
    caption = (
        "Per layer at the last checkpoint (mean over seeds): the certified length-independent Lipschitz bound of "
        "multi-head attention (θ̃ = 1), the certified local bound using the measured θ̃, and the empirical Jacobian "
        "norm found by autograd (a lower estimate of the true norm); right: their ratio. Tests how much the "
        "distribution-aware bound (docs/math.md T4/T5) gains over the worst case and how tight it is."
    )
    body = _figures_by_run(
        bounds, lambda part, run: figures_bounds.bounds_figure(part, run=run), caption, title="Certified bounds"
    )
    if bounds["step"].nunique() > 1:
        body += _figure(
            lambda: figures_bounds.bounds_by_step_figure(bounds),
            "Certified attention bounds over training, median over layers (band: seeds), one panel per run. Three "
            "local bounds at the audited input form a chain, each adding one ingredient to the one above it: θ "
            "replaced by n/2 (dotted: no θ at all); the paper's form with the measured θ̃ (orange: the gain from "
            "θ); the key-sum form (red: the gain from weighing each key by its probability, docs/math.md T4). The "
            "dashed line is the length-independent Lipschitz bound with θ̃ = 1 (T5), which holds on the whole "
            "input set, not only at this input. The solid blue line is the autograd estimate every bound must "
            "stay above.",
            title="Certified bounds over checkpoints",
        )
    body += _soundness(bounds)
    body += _vacuous(bounds)
    layer = bounds[bounds["head"] == ALL_HEADS]
    if not layer.empty:
        # Each run's last checkpoint (a pretrained reference has only step 0), never two runs averaged together.
        last = layer[layer["step"] == layer.groupby("run_id")["step"].transform("max")]
        columns = [c for c in _BOUND_TABLE_COLUMNS if c in last and last[c].notna().any()]
        keys = ["run_id", "layer"] if last["run_id"].nunique() > 1 else ["layer"]
        table = (
            last.groupby(keys, as_index=False)[columns].mean().rename(columns={"run_id": "run", **_BOUND_TABLE_COLUMNS})
        )
        norm = ", ".join(sorted(str(v) for v in last["norm"].dropna().unique()))
        at = "each run's last checkpoint" if len(keys) > 1 else f"checkpoint {int(last['step'].max()):,}"
        keys_shown = [{"run_id": "run"}.get(key, key) for key in keys]
        block = [column for column in _BLOCK_TABLE_COLUMNS if column in table]
        body += table_html(
            table.drop(columns=block),
            caption=(
                f"Attention, layer-level records at {at}, mean over seeds, in the {norm} norm. Bounds are certified "
                "upper bounds; estimates are autograd lower estimates; tightness = local bound / estimate (below 1 "
                "would be a violated bound)."
            ),
            flags={"tightness": lambda v: v < 1 - SOUNDNESS_RTOL},
        )
        if block:
            body += table_html(
                table[keys_shown + block],
                caption=(
                    f"The rest of each block at {at}: the FFN's and the whole block's certified bounds beside the "
                    "block's autograd estimate; LN condition = fraction of tokens meeting T6."
                ),
            )
    if bounds["step"].nunique() > 1 and bounds.get("quartic_norm_product", pd.Series(dtype=float)).notna().any():
        body += _figure(
            lambda: figures_bounds.norm_products_figure(bounds),
            "Largest quartic product ‖W_O‖‖W_Q^h‖‖W_K^h‖‖W_V^h‖ over heads, per layer, against checkpoint step: "
            "the weight growth that the DeepNorm-style N^(−1/4) scaling rule controls (docs/math.md T9).",
            title="Projection-norm products",
        )
    return Section(anchor="bounds", title="Certified bounds and their tightness", body=body)


def _soundness(bounds: pd.DataFrame) -> str:
    """One line stating whether any empirical estimate exceeds its certified bound (that would be a bug)."""
    checked, violations = 0, []
    for bound, estimate in _BOUND_PAIRS:
        if bound not in bounds or estimate not in bounds:
            continue
        both = bounds[[bound, estimate, "layer", "head", "step"]].dropna()
        checked += len(both)
        bad = both[both[estimate] > both[bound] * (1 + SOUNDNESS_RTOL)]
        violations += [f"{bound} at layer {r.layer}, head {r.head}, step {r.step}" for r in bad.itertuples()]
    if not checked:
        return '<p class="note">No (certified bound, empirical estimate) pairs were recorded.</p>'
    if violations:
        return (
            f'<p class="violation">{len(violations)} of {checked:,} certified bounds are exceeded by their empirical '
            f"estimate — a certified bound was violated, which is a bug: {esc('; '.join(violations[:5]))}.</p>"
        )
    return f"<p>Soundness: in all {checked:,} recorded pairs the empirical estimate is below its certified bound.</p>"


VACUOUS_FACTOR = 100.0
"""A certified bound more than this many times its empirical estimate is flagged as vacuous in practice."""


def _vacuous(bounds: pd.DataFrame) -> str:
    """A note naming the certified bounds that exceed their estimate by more than VACUOUS_FACTOR."""
    layer = bounds[bounds["head"] == ALL_HEADS]
    notes = []
    for bound, estimate in _BOUND_PAIRS:
        if bound not in layer or estimate not in layer:
            continue
        both = layer[[bound, estimate]].dropna()
        both = both[both[estimate] > 0]
        if both.empty:
            continue
        ratio = both[bound] / both[estimate]
        share = float((ratio > VACUOUS_FACTOR).mean())
        if share > 0:
            notes.append(
                f"{bound} exceeds {estimate} by more than {VACUOUS_FACTOR:g}× in {share:.0%} of layer records "
                f"(median ratio {ratio.median():.3g}×, largest {ratio.max():.3g}×)"
            )
    if not notes:
        return f"<p>No certified bound exceeds its estimate by more than {VACUOUS_FACTOR:g}×.</p>"
    return (
        '<p class="note">Vacuous in practice (true, but too loose to say anything): '
        + esc("; ".join(notes))
        + ". Such bounds compound worst cases of every sublayer (docs/math.md T7); read the local attention bound "
        "instead.</p>"
    )


def _schedules(data: RunData) -> str:
    """'; learning rate: run A warms up over N steps to a peak of x, run B …' from the training table, or ''."""
    training = data.training
    if training is None or training.empty or not {"run_id", "step", "lr"} <= set(training.columns):
        return ""
    parts = []
    for run, part in training.groupby("run_id", sort=True):
        peak = part.loc[part["lr"].idxmax()]
        parts.append(f"{run} warms up over {int(peak['step']):,} steps to a peak of {peak['lr']:.3g}")
    return "; learning rate: " + ", ".join(parts)


def placements_section(data: RunData) -> Section:
    """Pre-LN against Post-LN: residual-stream Jacobians, θ and concentration per placement (docs/math.md T8)."""
    bounds, cells = _present(data.bounds, "bounds"), data.cells
    body = (
        "<p>The paper's structural distinction: a pre-LN block adds its branch to the identity, so its residual "
        "Jacobian is I + J_branch and stays ≥ 1 − ‖J_branch‖; a post-LN block normalizes after the sum, has no "
        "identity term, and its Jacobian is whatever the LayerNorm projection leaves (docs/math.md T6, T8). The "
        f"placements below were trained with the same seeds, data order, steps and batches{_schedules(data)}.</p>"
    )
    body += _figure(
        lambda: figures_bounds.residual_jacobian_figure(bounds),
        "Residual-stream Jacobian norm ‖∂X_{k+1}/∂X_k‖ per layer at the last checkpoint, per placement: "
        "certified bound (dashed) and autograd estimate (solid), bands over seeds. Dotted: 1.",
        title="Residual Jacobian by placement",
    )
    records = []
    for run in sorted(bounds["run_id"].unique()):
        layer = bounds[(bounds["run_id"] == run) & (bounds["head"] == ALL_HEADS)]
        last = layer[layer["step"] == layer["step"].max()]
        first = layer[layer["step"] == layer["step"].min()]
        run_cells = cells[(cells["run_id"] == run) & (cells["subset"] == "all")] if cells is not None else None
        end = run_cells[run_cells["step"] == run_cells["step"].max()] if run_cells is not None else None
        records.append(
            {
                "run": run,
                "placement": ", ".join(sorted(str(v) for v in last["norm_placement"].dropna().unique())),
                "residual est., first": first["residual_jacobian_estimate"].median(),
                "residual est., last": last["residual_jacobian_estimate"].median(),
                "residual bound, last": last["residual_jacobian_upper_bound"].median(),
                "LN condition, last": last["ln_condition_fraction"].mean(),
                "median θ_lb, last": None if end is None or end.empty else end["theta_lower_median"].median(),
                "p_max·n, last": None if end is None or end.empty else end["p_max_n_median"].median(),
            }
        )
    frame = pd.DataFrame(records)
    at_last = ["median θ_lb, last", "p_max·n, last", "LN condition, last"]
    body += table_html(
        frame.drop(columns=at_last),
        caption="Per placement, the residual Jacobian: medians over layers (and seeds) of the layer-level records at "
        "the first and last checkpoint.",
    )
    body += table_html(
        frame[["run", "placement", *at_last]],
        caption=(
            "Per placement at the last checkpoint: medians over layers of the median θ lower bound and p_max·n, and "
            "the fraction of tokens whose LayerNorm input meets the projection lemma's contraction condition (T6)."
        ),
    )
    return Section(anchor="placements", title="Pre-LN and Post-LN side by side", body=body)


def certificates_section(data: RunData) -> Section:
    """How good the θ certificates are: exact fraction, interval widths and the stage that settled each row."""
    quality = data.certificates
    if quality is None:
        raise FileFormatError("this run has no rows table, which the report's certificate section needs")
    caption = (
        "Per run: the share of rows whose θ is proved exact, the share certified to float32 resolution "
        "(width ≤ 2^-25) and width quantiles of [θ_lower, θ_upper]; then the cascade stage that settled the rows."
    )
    body = table_html(quality.summary, caption=caption) + table_html(
        quality.methods, caption="Rows per run and settling stage (attnsens.theta.ThetaMethod)."
    )
    return Section(anchor="certificates", title="Certificate quality", body=body)


def layernorm_section(data: RunData) -> Section:
    caption = (
        "Fraction of audited tokens whose LayerNorm input meets the contraction condition of the projection lemma "
        "(docs/math.md T6), and the median ratio ‖γ‖∞/σ(x), per layer. The paper states this condition but does not "
        "test it; this is the measurement."
    )
    bounds = _present(data.bounds, "bounds")
    body = _figures_by_run(
        bounds,
        lambda part, run: figures_bounds.ln_condition_figure(part, title=run),
        caption,
        title="LayerNorm condition",
        keep=lambda part: bool(part["ln_condition_fraction"].notna().any()),
    )
    layer = bounds[(bounds["head"] == ALL_HEADS) & bounds["ln_condition_fraction"].notna()]
    sentences = []
    for run, part in layer.groupby("run_id"):
        last = part[part["step"] == part["step"].max()]
        share = float(last["ln_condition_fraction"].mean())
        verdict = (
            "the LayerNorm contracts on almost every token, so its Jacobian bound is below 1 there"
            if share >= 0.9
            else "the condition fails on most tokens, so the LayerNorm can amplify and the lemma gives no contraction"
            if share < 0.5
            else "the condition holds on part of the tokens only"
        )
        sentences.append(
            f"{run}: at checkpoint {int(last['step'].max()):,}, {share:.0%} of tokens meet it (mean over layers and "
            f"seeds; median ‖γ‖∞/σ {last['ln_contraction_ratio_median'].median():.3g}) — {verdict}."
        )
    body += "<p>" + esc(" ".join(sentences)) + "</p>"
    return Section(anchor="layernorm", title="LayerNorm condition", body=body)


def influence_section(data: RunData) -> Section:
    influence = _present(data.influence, "influence")
    caption = (
        "Left: largest measured change ‖Δy_n‖₂ of the last position's output when one nonfinal token is replaced, "
        "against length n (log–log; fitted slope in the legend), beside the certified bound C/n where the theorem's "
        "assumptions hold (dashed). Right: n times the measured influence; a flat line is the Θ(1/n) decay the "
        "inverse-length theorem predicts (docs/math.md §10)."
    )
    body = _figure(lambda: figures_bounds.influence_figure(influence), caption, title="Inverse-length influence")
    rows = []
    stored = {model: summary for (_, model), summary in data.influence_summaries.items()}
    for (model, kind), part in influence.groupby(["model", "position_kind"], sort=True):
        part = part.sort_values("n")
        slope = figures_bounds.loglog_slope(part["n"].to_numpy(float), part["influence_max"].to_numpy(float))
        bound = part["influence_upper_bound"] if "influence_upper_bound" in part else pd.Series(dtype=float)
        certified = bound.notna().any()
        sound = bool((part["influence_max"] <= bound * (1 + SOUNDNESS_RTOL)).all()) if certified else None
        rows.append(
            {
                "model": model,
                "position": kind,
                "lengths": f"{int(part['n'].min()):,}–{int(part['n'].max()):,}",
                "fitted slope": slope,
                "max n·influence": float((part["n"] * part["influence_max"]).max()),
                "log10 C (certified)": certified_log10_constant(part, stored.get(model, {})),
                "measured ≤ C/n at every n": sound,
                "max TV": float(part["tv_max"].max()) if "tv_max" in part else None,
            }
        )
    body += table_html(
        pd.DataFrame(rows),
        caption="Per model and choice of the changed position.",
        flags={"measured ≤ C/n at every n": lambda v: v is False},
    )
    for (run_id, model), summary in sorted(data.influence_summaries.items()):
        body += _influence_constants(run_id, model, summary)
    return Section(anchor="influence", title="Inverse-length influence", body=body)


def _influence_constants(run_id: str, model: str, summary: dict[str, Any]) -> str:
    """Why the certified constant has the size it has: per layer, the recursion's score bound A_k (each layer
    multiplies C by about e^{2A_k}) beside the A_k and p_max·n measured on the audited and measured inputs, and the
    input-set constant those give (attnsens.influence.input_set)."""
    layers = summary.get("layers") or []
    certified, input_set = summary.get("log10_certified_C"), summary.get("input_set_log10_C")
    applicable = bool(summary.get("applicable"))
    parts = [f"<h3>{esc(model)}</h3>"]
    if certified is None:
        reasons = "; ".join(summary.get("reasons") or []) or "the recursion does not model this block"
        parts.append(f"<p>No certified constant: {esc(reasons)}.</p>")
    else:
        kind = "Certified" if applicable else "Indicative (the theorem's assumptions fail: see the reasons)"
        text = f"{kind} C = 10^{certified:,.1f}"
        if layers:
            total = sum(layer["log10_weight_ratio"] for layer in layers)
            text += (
                ". The recursion bounds every attention weight by exp(2A_k)/n, with A_k the largest score "
                f"oscillation any input can reach in layer k; over the {len(layers)} layers these factors alone add "
                f"10^{total:,.1f}, which is why C is far above the measured n·‖Δy_n‖"
            )
        parts.append(f"<p>{esc(text)}.</p>")
    if input_set is not None:
        parts.append(
            f"<p>Input-set constant: 10^{input_set:,.1f}. The same recursion with each layer's input norm and score "
            "oscillation as measured on the audited text and the measured random sequences, in place of their bounds "
            "over all inputs. It describes those inputs only and is not a certificate.</p>"
        )
    if layers:
        table = pd.DataFrame(
            {
                "layer": [layer["layer"] for layer in layers],
                "A_k (certified recursion)": [layer["A_k"] for layer in layers],
                "log10 exp(2A_k)": [layer["log10_weight_ratio"] for layer in layers],
                "A_k (measured)": [layer.get("A_k_observed") for layer in layers],
                "input norm bound": [layer.get("input_norm_bound") for layer in layers],
                "input norm (measured)": [layer.get("input_norm_observed") for layer in layers],
                "median p_max·n (measured)": [layer.get("p_max_n_median") for layer in layers],
            }
        )
        parts.append(table_html(table, caption=f"{run_id}: the recursion's constants per layer."))
    return "".join(parts)
