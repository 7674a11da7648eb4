"""``build_report(run_dir)``: one self-contained HTML file regenerated from a run's results store.

The file embeds every figure as a data URI and inlines its CSS; it loads nothing from the network and runs no
script. Sections whose table is missing from the run are left out and listed in the overview. A report of a run
folder that failed its manifest check (built with ``force``) opens with a red banner listing every missing,
changed, misplaced, unreadable or extra unit; a folder without a manifest gets a note that it is unverified.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from attnsens.report.completeness import completeness_banner, provisional
from attnsens.report.data import RunData, load_run
from attnsens.report.findings import Finding, evaluate_findings, findings_records
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
from attnsens.store.verify import RunCheck

REPORT_NAME = "report.html"
FINDINGS_NAME = "findings.json"


def _compares_placements(data: RunData) -> bool:
    """True when the bounds table holds residual Jacobians of more than one run (e.g. pre- and post-LN)."""
    bounds = data.bounds
    return bounds is not None and "residual_jacobian_estimate" in bounds and bounds["run_id"].nunique() > 1


def render_report(data: RunData, findings: list[Finding] | None = None) -> str:
    """The report of ``data`` as an HTML document (a string; nothing is written); ``findings`` are evaluated
    from ``data`` unless given."""
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
    findings = evaluate_findings(data) if findings is None else findings
    head = [overview_section(data, omitted), provisional(findings_section(data, findings), data.check)]
    everything = head + sections
    banner = [completeness_banner(data.check)] + ([integrity_banner(data.check)] if data.check is not None else [])
    models = data.overview.get("model") or ["attnsens run"]
    title = "attnsens report — " + ", ".join(str(m) for m in models[:3]) + (" …" if len(models) > 3 else "")
    created = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    subtitle = f"Run directory <code>{esc(data.run_dir)}</code> · generated {esc(created)}"
    return page(title, subtitle, [(s.anchor, s.title) for s in everything], banner + [s.html() for s in everything])


def integrity_banner(check: RunCheck) -> str:
    """A banner naming what the report could not verify ("" for a verified folder)."""
    if check.ok and check.has_manifest:
        return ""
    if check.ok:
        return f'<div class="note" role="note">Unverified: {esc(check.summary())}.</div>'
    items = "".join(
        f"<li><b>{esc(kind)}</b>: {esc(', '.join(p.describe() for p in problems))}</li>"
        for kind, problems in check.by_kind().items()
    )
    return (
        '<div class="integrity-banner" role="alert"><b>This report was built with --force from a run folder that '
        f"failed its manifest check.</b> Its figures and tables leave out missing and unreadable units and include "
        f"units that could not be verified:<ul>{items}</ul>Fix: {esc(check.message())}</div>"
    )


def build_report(
    run_dir: str | os.PathLike[str], *, out: str | os.PathLike[str] | None = None, force: bool = False
) -> Path:
    """Write the HTML report of ``run_dir`` atomically to ``out`` (default ``RUN_DIR/report.html``); return its path.

    Raises RunIntegrityError when the folder fails its manifest check (``force`` writes the report anyway, with
    a banner); FileFormatError when the directory is missing or holds no Parquet tables.
    """
    data = load_run(run_dir, force=force)
    findings = evaluate_findings(data)
    document = render_report(data, findings)
    target = Path(out) if out is not None else Path(run_dir) / REPORT_NAME
    atomic_write(target, lambda tmp: Path(tmp).write_text(document, encoding="utf-8"))
    where = target.with_name(FINDINGS_NAME) if out is None else target.with_suffix(".findings.json")
    _write_findings(findings, where, data.check)
    return target


def write_findings(run_dir: str | os.PathLike[str], *, force: bool = False) -> tuple[Path, list[dict[str, Any]]]:
    """Evaluate the findings of ``run_dir`` and write them to ``RUN_DIR/findings.json``; return the path and the
    records (docs/findings.md)."""
    data = load_run(run_dir, force=force)
    target = Path(run_dir) / FINDINGS_NAME
    return target, _write_findings(evaluate_findings(data), target, data.check)


def _write_findings(findings: list[Finding], target: Path, check: RunCheck | None) -> list[dict[str, Any]]:
    """Write the findings' records, each marked ``provisional`` when the run is not complete (completeness.py)."""
    complete = check is None or check.complete
    records = [{**record, "provisional": not complete} for record in findings_records(findings)]
    text = json.dumps(records, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    atomic_write(target, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return records
