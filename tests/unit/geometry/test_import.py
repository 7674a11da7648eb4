"""``import attnsens.geometry`` stays light (DESIGN.md: no transformers, pyarrow, duckdb, matplotlib, typer)."""

from __future__ import annotations

import subprocess
import sys


def test_geometry_import_does_not_load_heavy_modules() -> None:
    code = (
        "import sys, attnsens.geometry\n"
        "names = ('transformers', 'pyarrow', 'duckdb', 'matplotlib', 'typer', 'numba')\n"
        "heavy = [m for m in names if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""
