"""The HTML report: every section for a full run, escaping, self-containment, omissions, atomic write, CLI."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.errors import FileFormatError
from attnsens.report import build_report
from attnsens.store import ALL_HEADS, read_table
from tests.unit.report.conftest import HOSTILE_MODEL

SECTIONS = (
    "overview",
    "findings",
    "theta",
    "concentration",
    "dominant",
    "scatter",
    "heads",
    "training",
    "bounds",
    "layernorm",
    "influence",
)


@pytest.fixture(scope="module")
def document(report_path):
    return report_path.read_text(encoding="utf-8")


def test_every_section_is_present_in_order(document):
    positions = [document.find(f'<section id="{anchor}">') for anchor in SECTIONS]
    assert all(p >= 0 for p in positions), dict(zip(SECTIONS, positions, strict=True))
    assert positions == sorted(positions)
    assert "Not in this run" not in document


def test_hostile_strings_are_escaped(document):
    assert "<script" not in document.lower()
    assert "tiny &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; co" in document
    assert HOSTILE_MODEL not in document


def test_self_contained(document):
    # no external resource of any kind: every src is a data URI, no links, no scripts, no imports
    sources = re.findall(r'\ssrc="([^"]*)"', document)
    assert sources and all(s.startswith("data:image/") for s in sources)
    assert "<link" not in document and "@import" not in document and "url(" not in document
    assert not re.search(r"https?://", document.split("<main>")[1].replace("http://www.w3.org", ""))


def _images(document: str) -> list[tuple[str, bytes]]:
    return [(m, base64.b64decode(data)) for m, data in re.findall(r'src="data:(image/[^;]+);base64,([^"]+)"', document)]


def test_figures_are_embedded_and_not_blank(document):
    images = _images(document)
    assert len(images) >= 10
    for mime, payload in images:
        if mime == "image/png":
            pixels = matplotlib.image.imread(io.BytesIO(payload), format="png")
            assert pixels.std() > 0.05
        else:
            assert mime == "image/svg+xml"
            assert payload.count(b"<path") > 20


def test_findings_have_verdicts_and_numbers(document, run_dir):
    findings = document.split('id="findings"')[1].split("</section>")[0]
    verdicts = re.findall(r'class="badge ([a-z_-]+)"', findings)
    # one badge per finding of findings.json, in its order: θ at two thresholds, concentration and dominant atoms
    # over all rows; the synthetic rows are all sink or early rows, so the core subset is one "not measured"; and
    # the influence slope
    records = json.loads((run_dir / "findings.json").read_text(encoding="utf-8"))
    assert [r["verdict"].replace(" ", "-") for r in records] == verdicts
    assert [(r["finding"], r["subset"]) for r in records] == [
        ("theta", "all"), ("theta", "all"), ("concentration", "all"), ("dominant", "all"), ("theta", "core"),
        ("influence", None),
    ]  # fmt: skip
    assert verdicts[4] == "not-measured" and verdicts[5] in ("agrees", "inconclusive")
    assert set(verdicts) <= {"agrees", "disagrees", "inconclusive", "implied-by-p_max", "not-observed", "not-measured"}
    # the synthetic run concentrates strongly, so its lowest median θ is far below 1 and must be reported so
    assert verdicts[0] == "disagrees"
    rows = read_table(run_dir / "rows")
    lowest = rows.groupby(["step", "layer"])["theta_lower"].median().min()
    assert lowest < 0.9
    assert re.search(
        rf"the lowest median θ lower bound over \d+ \(layer, checkpoint\) cells, seeds pooled, {lowest:.4f} \[",
        findings,
    )
    assert (run_dir / "findings.json").is_file()


def test_missing_tables_are_omitted_with_a_note(run_dir, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(run_dir, partial, ignore=shutil.ignore_patterns("report.html"))
    dropped = ("bounds", "influence", "training", "grad_norms")
    for table in dropped:
        shutil.rmtree(partial / table)
    # a run that never had these tables: its manifest does not record them either
    manifest = json.loads((partial / "manifest.json").read_text())
    manifest["units"] = {k: v for k, v in manifest["units"].items() if k.split("/")[0] not in dropped}
    (partial / "manifest.json").write_text(json.dumps(manifest))
    text = build_report(partial).read_text(encoding="utf-8")
    for anchor in ("overview", "findings", "theta", "scatter"):
        assert f'<section id="{anchor}">' in text
    for anchor in ("bounds", "influence", "training", "layernorm"):
        assert f'<section id="{anchor}">' not in text
    assert "Not in this run" in text and "no influence table" in text


def test_summary_is_derived_from_rows_when_absent(run_dir, tmp_path):
    partial = tmp_path / "rows-only"
    partial.mkdir()
    shutil.copytree(run_dir / "rows", partial / "rows")
    text = build_report(partial).read_text(encoding="utf-8")
    assert '<section id="theta">' in text and '<section id="heads">' in text
    # without a manifest, config and provenance come from the files' own metadata
    assert "git revision" in text and "tiny" in text.split('id="overview"')[1].split("</section>")[0]


def test_cli_writes_atomically_to_out_and_prints_the_path_last(run_dir, tmp_path):
    small = tmp_path / "small"
    shutil.copytree(run_dir / "influence", small / "influence")
    runner = CliRunner()
    out = tmp_path / "deep" / "cli.html"
    result = runner.invoke(app, ["report", str(small), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == str(out)
    # the report and its findings beside it, and no temporary file left
    assert sorted(p.name for p in out.parent.iterdir()) == ["cli.findings.json", "cli.html"]
    assert out.stat().st_size > 10_000

    result = runner.invoke(app, ["report", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "error:" in result.output and len(result.output.strip().splitlines()) == 1
    with pytest.raises(FileFormatError, match="does not exist"):
        build_report(tmp_path / "nothing")


def test_pixels_helper_detects_a_blank_image():
    blank = io.BytesIO()
    matplotlib.image.imsave(blank, np.ones((20, 20, 3)), format="png")
    assert matplotlib.image.imread(io.BytesIO(blank.getvalue()), format="png").std() == 0


def test_overview_gives_each_run_its_own_layers_and_heads(run_dir):
    """A study holds runs of different models (a tiny GPT beside a pretrained reference): the overview names each
    run's layers × heads instead of one model's shape for all of them; one shape when the runs share it."""
    from dataclasses import replace

    from attnsens.report.data import layer_head_shapes, load_run
    from attnsens.report.sections import overview_section

    def summary(run: str, layers: int, heads: int) -> pd.DataFrame:
        keys = [(layer, head) for layer in range(layers) for head in (*range(heads), ALL_HEADS)]
        return pd.DataFrame({"run_id": run, "layer": [k[0] for k in keys], "head": [k[1] for k in keys]})

    both = pd.concat([summary("reference-smollm2", 30, 9), summary("tiny-pre", 4, 4)], ignore_index=True)
    shapes = layer_head_shapes(both)
    assert shapes == {"reference-smollm2": (30, 9), "tiny-pre": (4, 4)}
    pooled_only = summary("pooled", 3, 0)
    assert layer_head_shapes(pooled_only) == {"pooled": (3, None)}

    data = load_run(run_dir)
    text = overview_section(replace(data, overview={**data.overview, "shapes": shapes}), []).html()
    assert "layers × heads, reference-smollm2<" in text and "layers × heads, tiny-pre<" in text
    assert "30 × 9" in text and "4 × 4" in text
    same = {"seed-0": (4, 4), "seed-1": (4, 4)}
    text = overview_section(replace(data, overview={**data.overview, "shapes": same}), []).html()
    assert "layers × heads<" in text and text.count("4 × 4") == 1
