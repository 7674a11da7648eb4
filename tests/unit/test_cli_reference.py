"""docs/cli.md is the current ``--help`` of every command, whatever the terminal (tools/cli_reference.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_tool():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "tools" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_up_to_date() -> None:
    tool = load_tool()
    assert (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") == tool.render(), (
        "docs/cli.md is out of date: run python tools/cli_reference.py"
    )


@pytest.mark.parametrize("columns", ["40", "250"])
def test_cli_reference_does_not_depend_on_the_terminal(monkeypatch: pytest.MonkeyPatch, columns: str) -> None:
    tool = load_tool()
    monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert tool.command_help(["query"]) == tool.render().split("## attnsens query\n\n```text\n")[1].split("\n```")[0]


def test_every_command_is_documented() -> None:
    tool = load_tool()
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for name in tool.command_names():
        assert f"## attnsens {name}\n" in text
