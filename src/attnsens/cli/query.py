"""``attnsens query RUN_DIR "SQL"``: DuckDB SQL over a run's Parquet tables (views named rows, summary, ...)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from attnsens.cli.app import (
    ForceOption,
    JsonOption,
    app,
    console,
    domain_errors_exit,
    flag,
    format_float,
    warn_unverified,
)


@app.command()
@domain_errors_exit
def query(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by audit, study, bounds or influence.")],
    sql: Annotated[str, typer.Argument(help='DuckDB SQL; tables are views by name, e.g. "SELECT * FROM summary".')],
    as_json: JsonOption = False,
    as_csv: Annotated[bool, flag("--csv", help="Print CSV (full precision) instead of a table.")] = False,
    wide: Annotated[
        bool, flag("--wide", help="Every number at full precision, the table as wide as it needs (not the terminal).")
    ] = False,
    max_rows: Annotated[int, typer.Option("--max-rows", min=1, help="Rows shown in the table view.")] = 50,
    force: ForceOption = False,
) -> None:
    """Run SQL over the run's tables (after checking them against the run's manifest) and print the result.

    The table shows 6 significant digits, more where a value lies close to an integer (θ near 1 keeps the digits
    that tell it from 1); --wide, --json and --csv print every float at full precision.
    """
    from rich.table import Table

    from attnsens.cli.app import jsonable, print_json
    from attnsens.cli.verify import warn_incomplete
    from attnsens.errors import QueryError
    from attnsens.store.query import query as run_query
    from attnsens.store.verify import verify_run

    if sum((as_json, as_csv, wide)) > 1:
        raise QueryError("choose one of --json, --csv and --wide")
    check = verify_run(run_dir)
    if force:
        warn_unverified(check)
    frame = run_query(run_dir, sql, force=force, check=check)
    warn_incomplete(check)
    if as_json:
        print_json([jsonable(record) for record in frame.astype(object).to_dict("records")])
        return
    if as_csv:
        frame.to_csv(sys.stdout, index=False)
        return
    target = Console(markup=False, highlight=False, width=100_000) if wide else console
    rows = [[_cell(value, wide=wide) for value in record] for record in frame.head(max_rows).itertuples(index=False)]
    names = [str(name) for name in frame.columns]
    shown = _columns_that_fit(names, rows, target.width)
    table = Table(show_lines=False, header_style="bold")
    for index in range(shown):
        numeric = frame.iloc[:, index].dtype.kind in "iuf"
        # Long cells wrap onto more lines instead of shrinking to "…".
        table.add_column(names[index], justify="right" if numeric else "left", overflow="fold")
    for cells in rows:
        table.add_row(*cells[:shown])
    target.print(table, crop=False)
    hidden = len(frame) - max_rows
    console.print(
        f"{len(frame)} row(s)" + (f", {hidden} not shown (use --max-rows, --csv or --json)" if hidden > 0 else "")
    )
    if shown < len(names):
        console.print(
            f"{len(names) - shown} of {len(names)} columns do not fit in {target.width} characters and are not shown: "
            f"{', '.join(names[shown:])} (use --wide, --csv or --json, or select fewer columns)"
        )


def _columns_that_fit(names: list[str], rows: list[list[Text]], width: int) -> int:
    """How many leading columns fit side by side in ``width`` characters, each as wide as its header and its
    widest cell (plus a border and a space either side); at least one. Squeezed any narrower, rich would fold
    every header and value into a column of single characters."""
    used = 1  # the table's right border
    for index, name in enumerate(names):
        natural = max([len(name), *(row[index].cell_len for row in rows)])
        used += natural + 3
        if used > width and index > 0:
            return index
    return len(names)


def _cell(value: object, *, wide: bool) -> Text:
    # Text, not str: values from the data must never be read as rich markup.
    if getattr(value, "dtype", None) is not None and value.dtype.kind == "f":  # type: ignore[attr-defined]
        value = float(value)  # type: ignore[arg-type]
    if value is None or (isinstance(value, float) and value != value):
        return Text("null", style="dim")
    return Text(format_float(value, wide=wide) if isinstance(value, float) else str(value))
