"""``attnsens verify RUN_DIR``: check a run folder against its manifest, the check ``report`` and ``query`` run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from attnsens.cli.app import JsonOption, app, console, domain_errors_exit, flag, print_json


@app.command()
@domain_errors_exit
def verify(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by audit, study, bounds or influence.")],
    rehash: Annotated[
        bool, flag("--rehash", help="Hash every file again, not trusting the cache (by size, mtime, ctime, inode).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Check a run folder's units and training checkpoints against their manifests, and that it is complete.

    Names every missing, changed, misplaced, unreadable or extra unit or checkpoint file.
    Names every planned unit that is absent, and a writer that holds the folder. Exit 1 if there is one.
    """
    from attnsens.errors import RunIntegrityError
    from attnsens.store.verify import verify_run

    check = verify_run(run_dir, rehash=rehash)
    if not check.has_manifest and not any(run_dir.rglob("*.parquet")) and not check.checkpoints and check.ok:
        from attnsens.errors import FileFormatError

        raise FileFormatError(f"{str(run_dir)!r} holds no manifest.json and no Parquet files; pass the --out of a run")
    if as_json:
        print_json({
            "run_dir": str(check.run_dir), "has_manifest": check.has_manifest, "verified": check.verified,
            "problems": [{"unit": p.unit, "kind": p.kind, "detail": p.detail} for p in check.problems],
            "checkpoints": check.checkpoints, "complete": check.complete, "absent": list(check.absent),
            "writer": check.writer,
        })  # fmt: skip
        if not check.ok or not check.complete:
            raise typer.Exit(code=1)
        return
    lines = [f"{problem.kind:<10} {problem.describe()}" for problem in check.problems]
    lines += [f"{'absent':<10} {unit} (planned, not recorded)" for unit in check.absent]
    lines += [f"{'writer':<10} {check.writer}"] if check.writer is not None else []
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if not check.ok:
        raise RunIntegrityError(check.message())
    if not check.complete:
        raise RunIntegrityError(check.incompleteness())
    console.print(check.summary(), highlight=False, markup=False, soft_wrap=True)


def warn_incomplete(check: Any) -> None:
    """One yellow line on stderr when a read (query, report) goes ahead on a run that is not complete: the planned
    units that are absent and a live writer."""
    from rich.text import Text

    from attnsens.cli.app import error_console

    if check is not None and not check.complete:
        error_console.print(Text.assemble(("warning:", "bold yellow"), " ", check.incompleteness()), soft_wrap=True)
