"""Reports of a run: figures (DataFrame in, matplotlib Figure out) and one self-contained HTML file.

from attnsens.report import build_report
path = build_report("runs/tiny")          # runs/tiny/report.html
"""

from __future__ import annotations

from attnsens.report.figures import (
    concentration_figure,
    dominant_fraction_figure,
    layer_head_heatmap_figure,
    theta_lower_by_step_figure,
    theta_vs_pmax_figure,
)
from attnsens.report.figures_bounds import (
    bounds_figure,
    grad_norms_figure,
    influence_figure,
    ln_condition_figure,
    norm_products_figure,
    training_figure,
)
from attnsens.report.findings import Finding, evaluate_findings
from attnsens.report.html import build_report, render_report, write_findings

__all__ = [
    "Finding",
    "bounds_figure",
    "build_report",
    "concentration_figure",
    "dominant_fraction_figure",
    "evaluate_findings",
    "grad_norms_figure",
    "influence_figure",
    "layer_head_heatmap_figure",
    "ln_condition_figure",
    "norm_products_figure",
    "render_report",
    "theta_lower_by_step_figure",
    "theta_vs_pmax_figure",
    "training_figure",
    "write_findings",
]
