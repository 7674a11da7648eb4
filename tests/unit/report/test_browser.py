"""The report opened in headless Chromium: it renders, is not blank, shows every figure, logs no console error.

Chromium comes from the Debian package, which .ci/run installs; the tests install nothing, and skip with the
reason when it is missing.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess

import matplotlib.image
import pytest

RUN_TIMEOUT_S = 60
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)


def _find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def chromium() -> str:
    found = _find_chromium()
    if not found:
        pytest.skip("chromium is not installed (.ci/run installs it: apt-get install chromium)")
    return found


def _run(chromium: str, profile, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium, *_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def _console_errors(log: str) -> list[str]:
    """Lines of a Chromium stderr log that are page console messages or uncaught errors."""
    return [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def test_console_scan_catches_page_errors(chromium, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    log = _run(chromium, tmp_path / "profile", "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()).stderr
    assert any("undefinedFunction" in line for line in _console_errors(log))


def test_report_renders_in_chromium(chromium, report_path, tmp_path):
    url = report_path.resolve().as_uri()
    shot = tmp_path / "report.png"
    rendered = _run(
        chromium,
        tmp_path / "profile-shot",
        "--enable-logging=stderr",
        "--v=0",
        f"--screenshot={shot}",
        "--window-size=1280,4000",
        url,
    )
    assert shot.is_file(), rendered.stderr[-2000:]
    assert _console_errors(rendered.stderr) == []

    pixels = matplotlib.image.imread(io.BytesIO(shot.read_bytes()), format="png")[..., :3]
    assert pixels.shape[:2] == (4000, 1280)
    assert pixels.std() > 0.05
    # not one blank stretch: ink (non-background pixels) in each quarter of the page
    for quarter in range(4):
        band = pixels[quarter * 1000 : (quarter + 1) * 1000]
        assert (band.min(axis=-1) < 0.5).mean() > 0.002, f"quarter {quarter} of the page is blank"

    dom = _run(chromium, tmp_path / "profile-dom", "--dump-dom", url).stdout
    figures = re.findall(r"<figure><img [^>]*src=\"data:image/(?:png|svg\+xml);base64,", dom)
    assert len(figures) >= 10
    for anchor in ("overview", "findings", "theta", "scatter", "bounds", "influence"):
        assert f'id="{anchor}"' in dom
    assert "<script" not in dom.lower()
