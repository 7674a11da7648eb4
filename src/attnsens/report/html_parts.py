"""HTML building blocks of the report: escaping, embedded figures, compact tables, the page shell and its CSS.

Every piece of text that came from data, models or configs goes through :func:`esc`; figures are embedded as
``data:`` URIs, so the page needs no network, no CDN and no other file.
"""

from __future__ import annotations

import base64
import html
import io
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

CSS = """
:root { --ink: #1d2330; --muted: #5b6272; --line: #e3e6ec; --accent: #1f5fa8; --bg: #ffffff; --soft: #f6f7f9;
        --good: #1e7d4f; --bad: #b3261e; --na: #7a6a14; }
* { box-sizing: border-box; }
html { background: var(--soft); }
body { margin: 0 auto; max-width: 1120px; padding: 28px 36px 60px; background: var(--bg); color: var(--ink);
       font: 15px/1.55 "Source Serif Pro", Georgia, "DejaVu Serif", serif; }
h1, h2, h3, nav, .meta, table, figcaption, .badge, .note, dl, summary, pre {
       font-family: "Inter", "Helvetica Neue", "DejaVu Sans", Arial, sans-serif; }
h1 { font-size: 26px; margin: 0 0 4px; letter-spacing: -0.01em; }
h2 { font-size: 19px; margin: 40px 0 10px; padding-top: 14px; border-top: 1px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; }
p { margin: 8px 0; max-width: 78ch; }
.meta { color: var(--muted); font-size: 13px; margin-bottom: 14px; }
nav { font-size: 13px; margin: 10px 0 6px; display: flex; flex-wrap: wrap; gap: 4px 14px; }
nav a { color: var(--accent); text-decoration: none; }
figure { margin: 14px 0 22px; }
figure img { display: block; width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; }
figcaption { font-size: 13px; color: var(--muted); margin-top: 6px; max-width: 95ch; }
figcaption b { color: var(--ink); }
table { border-collapse: collapse; font-size: 12.5px; margin: 8px 0 14px; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { font-weight: 600; color: var(--muted); border-bottom: 1.5px solid #c9ced8; }
td:first-child, th:first-child { text-align: left; }
.scroll { overflow-x: auto; }
.table-caption { font-size: 12.5px; color: var(--muted); margin: 6px 0 0; }
.finding { border: 1px solid var(--line); border-left: 4px solid var(--muted); border-radius: 4px;
           padding: 10px 16px; margin: 12px 0; }
.finding.agrees { border-left-color: var(--good); }
.finding.disagrees { border-left-color: var(--bad); }
.finding .claim { font-style: italic; }
.badge { display: inline-block; font-size: 11.5px; font-weight: 700; text-transform: uppercase;
         letter-spacing: 0.04em; padding: 1px 8px; border-radius: 10px; margin-right: 8px; color: #fff;
         background: var(--na); }
.badge.agrees { background: var(--good); }
.badge.disagrees { background: var(--bad); }
.finding.inconclusive, .finding.implied-by-p_max { border-left-color: var(--na); }
.badge.inconclusive, .badge.implied-by-p_max { background: var(--na); }
.integrity-banner { font-size: 14px; color: #fff; background: var(--bad); padding: 10px 16px; border-radius: 4px;
                    margin: 10px 0 4px; font-family: "Inter", "Helvetica Neue", "DejaVu Sans", Arial, sans-serif; }
.integrity-banner ul { margin: 6px 0; }
.note { font-size: 13px; color: var(--muted); background: var(--soft); padding: 8px 12px; border-radius: 4px; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 3px 18px; font-size: 13.5px; margin: 10px 0; }
dt { color: var(--muted); }
dd { margin: 0; }
details { margin: 10px 0; }
summary { cursor: pointer; font-size: 13.5px; color: var(--accent); }
pre { font-size: 12px; background: var(--soft); padding: 10px 12px; border-radius: 4px; overflow-x: auto; }
code { font-size: 0.92em; }
.violation { color: var(--bad); font-weight: 700; }
.config th { text-align: left; }
.config td { text-align: left; white-space: normal; word-break: break-word; }
.config td:first-child { white-space: nowrap; color: var(--muted); }
"""


def esc(value: Any) -> str:
    """``value`` as text safe inside HTML element content and quoted attributes."""
    return html.escape(str(value), quote=True)


def fmt(value: Any, digits: int = 4) -> str:
    """Compact, escaped text for a table cell: integers with separators, floats with ``digits`` significant."""
    if value is None or value is pd.NA:
        return "–"
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isnan(number):
            return "–"
        if math.isinf(number):
            return "∞" if number > 0 else "−∞"
        if number != 0 and (abs(number) >= 1e5 or abs(number) < 1e-3):
            return f"{number:.{digits - 1}e}"
        # Fixed decimals below 10 keep a column aligned; larger values keep ``digits`` significant figures.
        return (
            f"{number:.{digits}f}" if abs(number) < 10 else f"{number:,.{max(digits - len(str(int(abs(number)))), 0)}f}"
        )
    return esc(value)


def figure_html(fig: Figure, caption: str, *, title: str, fmt_: str = "svg", dpi: int = 110) -> str:
    """The figure rendered to ``fmt_`` (svg or png), embedded as a data URI, with a bold title and a caption."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt_, dpi=dpi, metadata=_figure_metadata(fmt_))
    mime = "image/svg+xml" if fmt_ == "svg" else "image/png"
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    # Never wider than drawn (100 px per inch), so narrow figures keep their proportions next to wide ones.
    width_px = round(float(fig.get_size_inches()[0]) * 100)
    return (
        f'<figure><img alt="{esc(title)}" style="max-width: {width_px}px" src="data:{mime};base64,{encoded}">'
        f"<figcaption><b>{esc(title)}.</b> {esc(caption)}</figcaption></figure>"
    )


def _figure_metadata(fmt_: str) -> dict[str, Any]:
    # Drop creation dates so that a report rebuilt from the same data is byte-identical in its figures.
    return {"Date": None} if fmt_ == "svg" else {"Software": None}


def table_html(
    frame: pd.DataFrame,
    *,
    caption: str | None = None,
    digits: int = 4,
    max_rows: int = 60,
    flags: Mapping[str, Any] | None = None,
) -> str:
    """A compact HTML table of ``frame`` (all cells escaped); ``flags[column](value)`` marks a cell as a violation."""
    header = "".join(f"<th>{esc(c)}</th>" for c in frame.columns)
    body = []
    for record in frame.head(max_rows).itertuples(index=False):
        cells = []
        for column, value in zip(frame.columns, record, strict=True):
            check = (flags or {}).get(column)
            marked = check is not None and _is_present(value) and bool(check(value))
            text = fmt(value, digits)
            cells.append(f'<td class="violation">{text}</td>' if marked else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = len(frame) - max_rows
    extra = f'<p class="table-caption">{more:,} more rows not shown (use attnsens query).</p>' if more > 0 else ""
    cap = f'<p class="table-caption">{esc(caption)}</p>' if caption else ""
    table = f"<table><thead><tr>{header}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    return f'{cap}<div class="scroll">{table}</div>{extra}'


def _is_present(value: Any) -> bool:
    if value is None or value is pd.NA:
        return False
    return not (isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_) and math.isnan(value))


def definition_list(items: Sequence[tuple[str, str]]) -> str:
    """<dl> of (term, already-escaped description) pairs."""
    return "<dl>" + "".join(f"<dt>{esc(term)}</dt><dd>{value}</dd>" for term, value in items) + "</dl>"


def page(title: str, subtitle: str, nav: Sequence[tuple[str, str]], sections: Sequence[str]) -> str:
    """The complete self-contained HTML document."""
    links = "".join(f'<a href="#{esc(anchor)}">{esc(label)}</a>' for anchor, label in nav)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f'<header><h1>{esc(title)}</h1><div class="meta">{subtitle}</div><nav>{links}</nav></header>'
        f"<main>{''.join(sections)}</main></body></html>\n"
    )
