"""``attnsens query RUN_DIR "SQL"``: DuckDB SQL over a run's Parquet tables (views named rows, summary, ...)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from attnsens.cli.app import ForceOption, JsonOption, app, console, domain_errors_exit, warn_unverified


@app.command()
@domain_errors_exit
def query(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by audit, study, bounds or influence.")],
    sql: Annotated[str, typer.Argument(help='DuckDB SQL; tables are views by name, e.g. "SELECT * FROM summary".')],
    as_json: JsonOption = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table.")] = False,
    max_rows: Annotated[int, typer.Option("--max-rows", min=1, help="Rows shown in the table view.")] = 50,
    force: ForceOption = False,
) -> None:
    """Run SQL over the run's tables (after checking them against the run's manifest) and print the result."""
    from rich.table import Table

    from attnsens.errors import QueryError
    from attnsens.store.query import query as run_query
    from attnsens.store.verify import verify_run

    if as_json and as_csv:
        raise QueryError("choose one of --json and --csv")
    check = verify_run(run_dir)
    if force:
        warn_unverified(check)
    frame = run_query(run_dir, sql, force=force, check=check)
    if as_json:
        sys.stdout.write(frame.to_json(orient="records", indent=2, double_precision=15) + "\n")
        return
    if as_csv:
        frame.to_csv(sys.stdout, index=False)
        return
    table = Table(show_lines=False, header_style="bold")
    for name in frame.columns:
        table.add_column(str(name), justify="right" if frame[name].dtype.kind in "iuf" else "left")
    for record in frame.head(max_rows).itertuples(index=False):
        table.add_row(*(_cell(value) for value in record))
    console.print(table)
    hidden = len(frame) - max_rows
    console.print(
        f"{len(frame)} row(s)" + (f", {hidden} not shown (use --max-rows, --csv or --json)" if hidden > 0 else "")
    )


def _cell(value: object) -> Text:
    # Text, not str: values from the data must never be read as rich markup.
    if value is None or (isinstance(value, float) and value != value):
        return Text("null", style="dim")
    return Text(f"{value:.6g}" if isinstance(value, float) else str(value))
