"""``attnsens report RUN_DIR``: regenerate the self-contained HTML report of a run from its results store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnsens.cli.app import app, console, domain_errors_exit


@app.command()
@domain_errors_exit
def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by audit, study, bounds or influence.")],
    out: Annotated[
        Path | None, typer.Option("--out", help="HTML file to write (default: RUN_DIR/report.html).")
    ] = None,
) -> None:
    """Write the HTML report of a run; the last line printed is its path."""
    from attnsens.cli.inputs import check_out_file, writing
    from attnsens.report import build_report

    if out is not None:
        check_out_file(out, example="report.html")
    with writing(out or run_dir / "report.html"):
        path = build_report(run_dir, out=out)
    console.print(str(path), soft_wrap=True)
