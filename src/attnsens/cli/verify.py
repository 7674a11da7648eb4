"""``attnsens verify RUN_DIR``: check a run folder against its manifest, the check ``report`` and ``query`` run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    """Name every missing, changed, misplaced, unreadable or extra unit; exit 1 if there is one."""
    from attnsens.errors import RunIntegrityError
    from attnsens.store.verify import verify_run

    check = verify_run(run_dir, rehash=rehash)
    if not check.has_manifest and not any(run_dir.rglob("*.parquet")):
        from attnsens.errors import FileFormatError

        raise FileFormatError(f"{str(run_dir)!r} holds no manifest.json and no Parquet files; pass the --out of a run")
    if as_json:
        print_json({
            "run_dir": str(check.run_dir), "has_manifest": check.has_manifest, "verified": check.verified,
            "problems": [{"unit": p.unit, "kind": p.kind, "detail": p.detail} for p in check.problems],
        })  # fmt: skip
        if not check.ok:
            raise typer.Exit(code=1)
        return
    for problem in check.problems:
        console.print(f"{problem.kind:<10} {problem.describe()}", highlight=False, markup=False, soft_wrap=True)
    if not check.ok:
        raise RunIntegrityError(check.message())
    console.print(check.summary(), highlight=False, markup=False, soft_wrap=True)
