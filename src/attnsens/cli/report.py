"""``attnsens report RUN_DIR``: regenerate the self-contained HTML report of a run from its results store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnsens.cli.app import ForceOption, JsonOption, app, console, domain_errors_exit, warn_unverified


@app.command()
@domain_errors_exit
def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by audit, study, bounds or influence.")],
    out: Annotated[
        Path | None, typer.Option("--out", help="HTML file to write (default: RUN_DIR/report.html).")
    ] = None,
    force: ForceOption = False,
    as_json: JsonOption = False,
) -> None:
    """Write the HTML report and findings.json of a run (after checking it against its manifest); the last line
    printed is the report's path. With --json, print the findings (the objects of findings.json) instead."""
    import json

    from attnsens.cli.app import print_json
    from attnsens.cli.inputs import check_out_file, writing
    from attnsens.cli.verify import warn_incomplete
    from attnsens.report import build_report
    from attnsens.store.verify import verify_run

    if out is not None:
        check_out_file(out, example="report.html")
    check = verify_run(run_dir)
    if force:
        warn_unverified(check)
    with writing(out or run_dir / "report.html"):
        path = build_report(run_dir, out=out, force=force)
    warn_incomplete(check)
    if as_json:
        findings = path.with_name("findings.json") if out is None else path.with_suffix(".findings.json")
        print_json(json.loads(findings.read_text(encoding="utf-8")))
        return
    console.print(str(path), soft_wrap=True)
