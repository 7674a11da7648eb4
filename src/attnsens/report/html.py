"""``build_report(run_dir)``: one self-contained HTML file regenerated from a run's results store.

The file embeds every figure as a data URI and inlines its CSS; it loads nothing from the network and runs no
script. Sections whose table is missing from the run are left out and listed in the overview.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

from attnsens.report.data import RunData, load_run
from attnsens.report.findings import evaluate_findings
from attnsens.report.html_parts import esc, page
from attnsens.report.sections import (
    Section,
    bounds_section,
    certificates_section,
    concentration_section,
    dominant_section,
    findings_section,
    heads_section,
    influence_section,
    layernorm_section,
    overview_section,
    placements_section,
    scatter_section,
    theta_section,
    training_section,
)
from attnsens.store.parquet import atomic_write

REPORT_NAME = "report.html"


def _compares_placements(data: RunData) -> bool:
    """True when the bounds table holds residual Jacobians of more than one run (e.g. pre- and post-LN)."""
    bounds = data.bounds
    return bounds is not None and "residual_jacobian_estimate" in bounds and bounds["run_id"].nunique() > 1


def render_report(data: RunData) -> str:
    """The report of ``data`` as an HTML document (a string; nothing is written)."""
    has_summary = data.summary is not None and not data.summary.empty
    has_ln = (
        data.bounds is not None
        and "ln_condition_fraction" in data.bounds
        and data.bounds["ln_condition_fraction"].notna().any()
    )
    plan = (
        (
            has_summary,
            "θ lower bound, concentration, dominant atoms, layer × head (no rows or summary table)",
            (theta_section, concentration_section, dominant_section),
        ),
        (
            data.rows_sample is not None and not data.rows_sample.empty,
            "θ versus p_max (no rows table)",
            (scatter_section,),
        ),
        (has_summary, "", (heads_section,)),
        (data.certificates is not None, "", (certificates_section,)),
        (
            data.training is not None and not data.training.empty,
            "training curves (no training table)",
            (training_section,),
        ),
        (data.bounds is not None and not data.bounds.empty, "certified bounds (no bounds table)", (bounds_section,)),
        (_compares_placements(data), "", (placements_section,)),
        (has_ln, "LayerNorm condition (no ln_condition_fraction in the bounds table)", (layernorm_section,)),
        (
            data.influence is not None and not data.influence.empty,
            "inverse-length influence (no influence table)",
            (influence_section,),
        ),
    )
    sections: list[Section] = []
    omitted: list[str] = []
    for available, note, builders in plan:
        if available:
            sections.extend(build(data) for build in builders)
        elif note:
            omitted.append(note)
    head = [overview_section(data, omitted), findings_section(data, evaluate_findings(data))]
    everything = head + sections
    models = data.overview.get("model") or ["attnsens run"]
    title = "attnsens report — " + ", ".join(str(m) for m in models[:3]) + (" …" if len(models) > 3 else "")
    created = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    subtitle = f"Run directory <code>{esc(data.run_dir)}</code> · generated {esc(created)}"
    return page(title, subtitle, [(s.anchor, s.title) for s in everything], [s.html() for s in everything])


def build_report(run_dir: str | os.PathLike[str], *, out: str | os.PathLike[str] | None = None) -> Path:
    """Write the HTML report of ``run_dir`` atomically to ``out`` (default ``RUN_DIR/report.html``); return its path.

    Raises FileFormatError when the directory is missing or holds no Parquet tables.
    """
    data = load_run(run_dir)
    document = render_report(data)
    target = Path(out) if out is not None else Path(run_dir) / REPORT_NAME
    atomic_write(target, lambda tmp: Path(tmp).write_text(document, encoding="utf-8"))
    return target
