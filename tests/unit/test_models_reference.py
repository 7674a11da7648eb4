"""docs/models.md's family table is the family registry's (tools/models_reference.py); the notes below it stay."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_tool():
    spec = importlib.util.spec_from_file_location("models_reference", ROOT / "tools" / "models_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_models_reference_is_up_to_date() -> None:
    tool = load_tool()
    current = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert current == tool.render(current), "docs/models.md is out of date: run python tools/models_reference.py"


def test_the_hand_written_notes_survive_a_rewrite() -> None:
    tool = load_tool()
    current = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    notes = current.split(tool.MARKER, 1)[1]
    assert notes.strip(), "docs/models.md has no hand-written part below its marker"
    stale = current.replace("| `gpt2` |", "| `gpt2-renamed` |", 1)
    assert stale != current and tool.render(stale) == current
