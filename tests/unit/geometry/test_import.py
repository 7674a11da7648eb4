"""``import attnsens.geometry`` stays light (no transformers, pyarrow, duckdb, matplotlib, typer).

The rule: docs/architecture.md, "Layers and import direction".
"""

from __future__ import annotations

from tests.imports import modules_loaded_by


def test_geometry_import_does_not_load_heavy_modules() -> None:
    heavy = ("transformers", "pyarrow", "duckdb", "matplotlib", "typer", "numba")
    assert modules_loaded_by("attnsens.geometry", heavy) == []
