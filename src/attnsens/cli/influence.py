"""``attnsens influence --model MODEL``: measured influence of a nonfinal token vs n beside the certified C/n."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attnsens.cli.app import JsonOption, app, console, domain_errors_exit, print_json

if TYPE_CHECKING:
    from attnsens.influence.experiment import InfluenceResult

_DEFAULT_LENGTHS = "16,32,64,128,256,512,1024,2048"


@app.command()
@domain_errors_exit
def influence(
    model: Annotated[
        str, typer.Option("--model", help="builtin:lnfree, smollm2, minilm, a local path, .gguf file or hub id.")
    ] = "builtin:lnfree",
    lengths: Annotated[str, typer.Option("--lengths", help="Comma-separated sequence lengths n.")] = _DEFAULT_LENGTHS,
    samples: Annotated[int, typer.Option("--samples", min=1, help="Samples per length and position kind.")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sampled inputs.")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="Run directory for influence/<model>.parquet.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Inverse-length influence (docs/math.md §10): measured ‖Δy_n‖, certified C/n, TV and the log–log slope."""
    from attnsens.errors import InputError
    from attnsens.influence.experiment import run_influence
    from attnsens.models import load

    try:
        grid = [int(part) for part in lengths.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--lengths must be comma-separated integers, got {lengths!r}; e.g. 16,32,64") from None
    if model != "builtin:lnfree":
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    adapter = load(model)
    with contextlib.nullcontext() if as_json else console.status("measuring influence"):
        result = run_influence(adapter, grid, name=model, n_samples=samples, seed=seed)
    if out is not None:
        result.write(out)
    if as_json:
        print_json(result.summary())
        return
    _print(result)
    if out is not None:
        console.print(f"wrote {out / 'influence'}")


def _print(result: InfluenceResult) -> None:
    from rich.table import Table

    cert, fit = result.certificate, result.fit
    if cert.applicable:
        shape = "C/n" if cert.masking == "unmasked" else "E_L(H_n)/n, causal variant"
        console.print(f"certified: ‖Δy_n‖₂ ≤ {shape} with C = 10^{cert.log10_constant:.3f} (docs/math.md §10.3)")
        summary = result.summary()
        if summary["log10_probability_constant"] is not None:
            console.print(
                f"           ‖p − p'‖₁ ≤ 10^{summary['log10_probability_constant']:.3f}/n, so ≤ 0.01 for every "
                f"n ≥ n* = 10^{summary['n_star']['log10_n']:.3f}"
            )
    else:
        console.print("[yellow]no certificate: the theorem's assumptions fail here[/]")
        for reason in cert.reasons:
            console.print(f"  • {reason}", highlight=False)
        if cert.log10_constant is not None:
            console.print(f"  (the recursion would give C ≈ 10^{cert.log10_constant:.4g}, vacuous)")
    table = Table(title=f"influence of a nonfinal token — {result.model}")
    for column in ("n", "max ‖Δy_n‖₂", "n·max ‖Δy_n‖₂", "certified bound", "max TV"):
        table.add_column(column, justify="right")
    for row in result.per_length().itertuples():
        bound = f"{row.certified_bound:.3e}" if row.certified_bound == row.certified_bound else "—"
        table.add_row(str(row.n), f"{row.influence:.3e}", f"{row.n_times_influence:.4f}", bound, f"{row.tv:.3e}")
    console.print(table)
    low, high = fit.slope_ci
    console.print(
        f"log–log slope {fit.slope:.3f} ({fit.confidence:.0%} CI [{low:.3f}, {high:.3f}], {fit.n_points} lengths); "
        "the theorem predicts ≤ −1 where it applies"
    )
