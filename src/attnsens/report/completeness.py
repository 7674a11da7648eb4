"""The report of an incomplete run: a banner first, and its findings marked provisional.

A run folder is incomplete when units or checkpoints its writer planned are not recorded (it was interrupted or is
still running) or a writer holds it now (``RunCheck.complete``, store/verify.py). What is there verifies, so the
report is built, but every figure and finding rests on the finished part only and can change when the run ends.
"""

from __future__ import annotations

import dataclasses

from attnsens.report.html_parts import esc
from attnsens.report.sections import Section
from attnsens.store.verify import RunCheck

PROVISIONAL = "provisional: the run is not complete"
"""Added to the findings' heading of an incomplete run's report."""


def completeness_banner(check: RunCheck | None) -> str:
    """A banner naming what a run lacks and who writes it ("" for a complete run)."""
    if check is None or check.complete:
        return ""
    items = []
    if check.absent:
        shown = ", ".join(check.absent[:12]) + (f" and {len(check.absent) - 12} more" if len(check.absent) > 12 else "")
        items.append(f"<li><b>{len(check.absent)} planned unit(s) absent</b>: {esc(shown)}</li>")
    if check.writer is not None:
        items.append(f"<li><b>writer</b>: {esc(check.writer)}</li>")
    return (
        '<div class="integrity-banner" role="alert"><b>This run is not complete.</b> Its figures and tables show '
        f"the finished units only, and its findings are provisional: they can change when the run ends.<ul>"
        f"{''.join(items)}</ul>{esc(check.incompleteness())}</div>"
    )


def provisional(section: Section, check: RunCheck | None) -> Section:
    """``section`` (the findings) marked provisional when the run is not complete, else unchanged."""
    if check is None or check.complete:
        return section
    note = (
        '<p class="note" role="note"><b>Provisional.</b> The run is not complete (see the banner above): these '
        "verdicts rest on the finished units only.</p>"
    )
    return dataclasses.replace(section, title=f"{section.title} ({PROVISIONAL})", body=note + section.body)
