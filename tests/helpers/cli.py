"""One-line CLI errors: run a command and return its single ``error:`` line."""

from __future__ import annotations

from typer.testing import CliRunner

from attnsens.cli import app

runner = CliRunner()


def _one_line_error(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert isinstance(result.exception, SystemExit)  # no traceback: typer.Exit, not a raw exception
    return lines[0].removeprefix("error: ")
