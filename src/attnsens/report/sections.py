"""The sections of the report, each built from a RunData; a section without data says so instead of appearing.

Captions state what a figure shows and which claim it tests. All text from the run is escaped (``esc``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
from matplotlib.figure import Figure

from attnsens.errors import InputError
from attnsens.report import figures, figures_bounds
from attnsens.report.data import RunData
from attnsens.report.findings import Finding
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


@dataclass(frozen=True, kw_only=True)
class Section:
    """A report section: anchor, heading, and its body as escaped HTML."""

    anchor: str
    title: str
    body: str

    def html(self) -> str:
        return f'<section id="{esc(self.anchor)}"><h2>{esc(self.title)}</h2>{self.body}</section>'


def _figure(build: Callable[[], Figure], caption: str, *, title: str, fmt_: str = "svg") -> str:
    """The figure, or a note naming why it could not be drawn from this run's data."""
    try:
        fig = build()
    except InputError as err:
        return f'<p class="note">Figure “{esc(title)}” not drawn: {esc(err)}</p>'
    return figure_html(fig, caption, title=title, fmt_=fmt_)


def overview_section(data: RunData, omitted: list[str]) -> Section:
    info = data.overview
    items = []
    for label, key in (("model", "model"), ("run", "run_id"), ("seeds", "seed"), ("checkpoints", "step")):
        values = info.get(key)
        if values:
            items.append((label, esc(", ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in values))))
    if "layers" in info:
        items.append(("layers × heads", esc(f"{info['layers']} × {info.get('heads', '?')}")))
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


def findings_section(findings: list[Finding]) -> Section:
    cards = []
    for finding in findings:
        table = table_html(finding.table, caption=finding.table_caption) if finding.table is not None else ""
        cards.append(
            f'<div class="finding {esc(finding.status.replace(" ", "-"))}">'
            f'<p><span class="badge {esc(finding.status.replace(" ", "-"))}">{esc(finding.status)}</span>'
            f'<span class="claim">Paper: {esc(finding.claim)}</span></p>'
            f"<p>Measured: {esc(finding.measured)}</p>{table}</div>"
        )
    intro = (
        "<p>The paper's three empirical findings, each checked against this run's data. The verdict comes from "
        "the numbers shown, with the thresholds stated; nothing here is assumed.</p>"
    )
    return Section(anchor="findings", title="Findings, as measured", body=intro + "".join(cards))


def _has_trend(data: RunData) -> bool:
    """True when more than one checkpoint was audited, so figures are drawn against the step."""
    return data.summary is not None and data.summary["step"].nunique() > 1


def theta_section(data: RunData) -> Section:
    axis = (
        "against the checkpoint step (symmetric-log axis, step 0 included); shaded band: 25–75 % of rows"
        if _has_trend(data)
        else "at the single audited checkpoint; bars: 25–75 % of rows"
    )
    caption = (
        f"Median over audited rows of the certified θ lower bound, per layer with all heads pooled, {axis}; one "
        "line per seed. Dotted line: θ = 1, the largest possible value. Tests the claim that the median "
        "certificate stays near 1 in every layer and at every checkpoint; since the certificate is a lower bound, "
        "half the rows have a true θ at least the plotted median (docs/math.md T2(f))."
    )
    # Many small panels are lighter as PNG than as SVG.
    many_layers = data.overview.get("layers", 0) > 12
    body = _figure(
        lambda: figures.theta_lower_by_step_figure(data.summary),
        caption,
        title="θ lower bound by layer",
        fmt_="png" if many_layers else "svg",
    )
    return Section(anchor="theta", title="θ lower bound per layer and checkpoint", body=body)


def concentration_section(data: RunData) -> Section:
    if _has_trend(data):
        caption = (
            "Median largest attention weight p_max and mean Shannon entropy (nats) per layer (colour: depth), "
            "averaged over seeds, against checkpoint step. Tests the claim that attention concentrates during "
            "training (p_max rising, entropy falling) — and, read with the θ figure, whether it does so while θ "
            "stays near 1, which is possible because θ only sees the largest atom (θ ≥ 1 − p_max² for "
            "p_max ≤ 1/3, docs/math.md §7)."
        )
    else:
        caption = (
            "Median largest attention weight p_max and mean Shannon entropy (nats) per layer, one line per seed. "
            "With a single checkpoint there is no training trend to test; read with the θ figure, it shows how "
            "concentrated attention can be while θ stays near 1 (θ ≥ 1 − p_max² for p_max ≤ 1/3, docs/math.md §7)."
        )
    body = _figure(lambda: figures.concentration_figure(data.summary), caption, title="Concentration")
    return Section(anchor="concentration", title="Attention concentration", body=body)


def dominant_section(data: RunData) -> Section:
    where = "against checkpoint step" if _has_trend(data) else "at the single audited checkpoint"
    caption = (
        f"Fraction of rows with a dominant atom (p_max ≥ half the row's mass) per layer {where}. Only rows with "
        "p_max > 1/3 can have θ < 8/9; tests the claim that dominant rows are a minority (dotted line: 1/2). "
        "Early positions and attention sinks on token 0 raise this fraction (docs/math.md §7)."
    )
    body = _figure(lambda: figures.dominant_fraction_figure(data.summary), caption, title="Dominant-atom rows")
    return Section(anchor="dominant", title="Dominant-atom rows", body=body)


def scatter_section(data: RunData) -> Section:
    shown = len(data.rows_sample) if data.rows_sample is not None else 0
    caption = (
        f"θ lower bound against p_max for {shown:,} rows sampled uniformly (fixed seed) from the rows table. Dashed: "
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
    body = _figure(lambda: figures.layer_head_heatmap_figure(data.summary), caption, title="Layer × head", fmt_="png")
    return Section(anchor="heads", title="Layer × head", body=body)


def training_section(data: RunData) -> Section:
    caption = (
        "Training loss, global gradient ℓ2 norm before clipping (log scale) and learning rate against step, one line "
        "per seed: the context in which the attention statistics above were measured."
    )
    body = _figure(lambda: figures_bounds.training_figure(data.training), caption, title="Training")
    if data.grad_norms is not None and not data.grad_norms.empty:
        body += _figure(
            lambda: figures_bounds.grad_norms_figure(data.grad_norms),
            "Gradient ℓ2 norm of each parameter group before clipping, per layer (colour: depth; layer −1 = "
            "parameters outside the blocks), mean over seeds: where the gradient signal sits while attention "
            "changes (docs/math.md §9.5).",
            title="Gradient norms by parameter group",
        )
    return Section(anchor="training", title="Training", body=body)


def bounds_section(data: RunData) -> Section:
    bounds = data.bounds
    caption = (
        "Per layer at the last checkpoint (mean over seeds): the certified length-independent Lipschitz bound of "
        "multi-head attention (θ̃ = 1), the certified local bound using the measured θ̃, and the empirical Jacobian "
        "norm found by autograd (a lower estimate of the true norm); right: their ratio. Tests how much the "
        "distribution-aware bound (docs/math.md T4/T5) gains over the worst case and how tight it is."
    )
    body = _figure(lambda: figures_bounds.bounds_figure(bounds), caption, title="Certified bounds")
    body += _soundness(bounds)
    layer = bounds[bounds["head"] == ALL_HEADS]
    if not layer.empty:
        last = layer[layer["step"] == layer["step"].max()]
        columns = [c for c in _BOUND_TABLE_COLUMNS if c in last and last[c].notna().any()]
        table = last.groupby("layer", as_index=False)[columns].mean().rename(columns=_BOUND_TABLE_COLUMNS)
        norm = ", ".join(sorted(str(v) for v in last["norm"].dropna().unique()))
        body += table_html(
            table,
            caption=(
                f"Layer-level records at checkpoint {int(last['step'].max()):,}, mean over seeds, in the {norm} norm. "
                "Bounds are certified upper bounds; estimates are autograd lower estimates; tightness = local bound "
                "/ estimate (below 1 would be a violated bound); LN condition = fraction of tokens meeting T6."
            ),
            flags={"tightness": lambda v: v < 1 - SOUNDNESS_RTOL},
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


def layernorm_section(data: RunData) -> Section:
    caption = (
        "Fraction of audited tokens whose LayerNorm input meets the contraction condition of the projection lemma "
        "(docs/math.md T6), and the median ratio ‖γ‖∞/σ(x), per layer. The paper states this condition but does not "
        "test it; this is the measurement."
    )
    body = _figure(lambda: figures_bounds.ln_condition_figure(data.bounds), caption, title="LayerNorm condition")
    return Section(anchor="layernorm", title="LayerNorm condition", body=body)


def influence_section(data: RunData) -> Section:
    influence = data.influence
    caption = (
        "Left: largest measured change ‖Δy_n‖₂ of the last position's output when one nonfinal token is replaced, "
        "against length n (log–log; fitted slope in the legend), beside the certified bound C/n where the theorem's "
        "assumptions hold (dashed). Right: n times the measured influence; a flat line is the Θ(1/n) decay the "
        "inverse-length theorem predicts (docs/math.md §10)."
    )
    body = _figure(lambda: figures_bounds.influence_figure(influence), caption, title="Inverse-length influence")
    rows = []
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
                "C (certified)": float((part["n"] * bound).max()) if certified else None,
                "measured ≤ C/n at every n": sound,
                "max TV": float(part["tv_max"].max()) if "tv_max" in part else None,
            }
        )
    body += table_html(
        pd.DataFrame(rows),
        caption="Per model and choice of the changed position.",
        flags={"measured ≤ C/n at every n": lambda v: v is False},
    )
    return Section(anchor="influence", title="Inverse-length influence", body=body)
