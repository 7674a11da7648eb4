"""The ``attnsens`` typer application and the pieces every command shares.

Commands live one per module in this package and call the Python API; heavy imports happen inside the
command functions so that ``attnsens --help`` stays fast.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from attnsens.errors import AttnsensError

app = typer.Typer(
    name="attnsens",
    help="Certified attention sensitivity: θ(p) certificates, bounds, audits, studies and influence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Certified attention sensitivity: θ(p) certificates, bounds, audits, studies and influence."""


console = Console()
error_console = Console(stderr=True)

# Options defined once and reused by every command that takes them.
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
OutDirOption = Annotated[Path, typer.Option("--out", help="Directory to write results into.")]
ForceOption = Annotated[
    bool,
    typer.Option("--force", help="Read a run folder that fails its manifest check (the problems are listed)."),
]

F = TypeVar("F", bound=Callable[..., Any])


def domain_errors_exit(func: F) -> F:
    """Turn an AttnsensError into one red line on stderr and exit code 1 (no traceback)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AttnsensError as err:
            error_console.print(f"[bold red]error:[/] {err}", markup=True, highlight=False, soft_wrap=True)
            raise typer.Exit(code=1) from None

    return wrapper  # type: ignore[return-value]


def warn_unverified(check: Any) -> None:
    """One yellow line on stderr when a forced read goes ahead on a folder that failed its check."""
    if check is not None and not check.ok:
        error_console.print(
            f"[bold yellow]warning:[/] read with --force: {check.problem_list()}",
            markup=True, highlight=False, soft_wrap=True,
        )  # fmt: skip


def print_json(payload: Any) -> None:
    """Write ``payload`` as JSON on stdout (no rich markup, safe to pipe)."""
    sys.stdout.write(json.dumps(payload, indent=2, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")
