"""Table cells: number formats, escaping, violation marks."""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsens.report.html_parts import fmt, table_html


def test_number_formats():
    values = [1.0, 0.99994, 0.0896, 3918.35, 123456.0, 1e-4, np.int64(12345), np.bool_(True), None, float("nan")]
    assert [fmt(v) for v in values] == [
        "1.0000",
        "0.9999",
        "0.0896",
        "3,918",
        "1.235e+05",
        "1.000e-04",
        "12,345",
        "yes",
        "–",
        "–",
    ]


def test_cells_and_headers_are_escaped_and_violations_marked():
    frame = pd.DataFrame({"<b>name</b>": ["<script>x</script>", "ok"], "tightness": [0.5, 2.0]})
    html = table_html(frame, caption="a & b", flags={"tightness": lambda v: v < 1})
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;b&gt;name&lt;/b&gt;" in html
    assert "a &amp; b" in html
    assert html.count('class="violation"') == 1 and '<td class="violation">0.5000</td>' in html
