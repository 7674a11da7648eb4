"""Write docs/cli.md from the ``--help`` of every ``attnsens`` command; ``--check`` fails when the file is stale.

The help is the text ``attnsens <command> --help`` prints, captured at a fixed width of 100 columns without colour
(``COLUMNS``, ``NO_COLOR``, ``TERM=dumb``) and with trailing spaces removed, so it does not depend on the terminal
the script runs in.

    python tools/cli_reference.py           # rewrite docs/cli.md
    python tools/cli_reference.py --check   # exit 1 if docs/cli.md differs from the current help
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

WIDTH = 100
TARGET = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
HEADER = """# Command-line reference

Generated from the `--help` of every command by `python tools/cli_reference.py` (`make docs`); a test and
`make lint` fail when it is out of date, so edit the commands' help, not this file. Every command that prints
results shows rich tables for people and takes `--json` for scripts; a domain error is one red line and exit
code 1.
"""
ENV = {"COLUMNS": str(WIDTH), "LINES": "50", "NO_COLOR": "1", "TERM": "dumb"}


def command_help(args: list[str]) -> str:
    """What ``attnsens *args --help`` prints at the fixed width, without trailing spaces or blank edges."""
    from typer.testing import CliRunner

    from attnsens.cli import app

    result = CliRunner().invoke(app, [*args, "--help"], env=ENV, terminal_width=WIDTH, prog_name="attnsens")
    if result.exit_code != 0:
        raise RuntimeError(f"attnsens {' '.join(args)} --help failed: {result.output}")
    return "\n".join(line.rstrip() for line in result.output.splitlines()).strip("\n")


def command_names() -> list[str]:
    import typer

    from attnsens.cli import app

    root = typer.main.get_command(app)
    return sorted(name for name, command in root.commands.items() if not command.hidden)


def render() -> str:
    """The whole reference as Markdown."""
    parts = [HEADER, "## attnsens\n", "```text", command_help([]), "```\n"]
    for name in command_names():
        parts += [f"## attnsens {name}\n", "```text", command_help([name]), "```\n"]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/cli.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not TARGET.is_file() or TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET} is out of date: run python tools/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
