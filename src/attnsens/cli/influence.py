"""``attnsens influence [MODEL]``: measured influence of a nonfinal token vs n beside the certified C/n."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attnsens.cli.app import JsonOption, app, console, domain_errors_exit, print_json

if TYPE_CHECKING:
    from attnsens.influence.experiment import InfluenceResult

_DEFAULT_LENGTHS = (16, 32, 64, 128, 256, 512, 1024, 2048)


@app.command()
@domain_errors_exit
def influence(
    model_argument: Annotated[
        str | None,
        typer.Argument(
            metavar="MODEL",
            help="builtin:lnfree (default), smollm2, minilm, a local path, .gguf file or hub id (as in audit).",
            show_default=False,
        ),
    ] = None,
    model_option: Annotated[str | None, typer.Option("--model", help="The same as MODEL.", show_default=False)] = None,
    lengths: Annotated[
        str | None,
        typer.Option(
            "--lengths",
            help="Comma-separated sequence lengths n (default: 16,32,…,2048, those within the model's context).",
            show_default=False,
        ),
    ] = None,
    samples: Annotated[int, typer.Option("--samples", min=1, help="Samples per length and position kind.")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sampled inputs.")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="Run directory for influence/<model>.parquet.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Inverse-length influence (docs/math.md §10): measured ‖Δy_n‖, certified C/n, TV and the log–log slope."""
    from attnsens.cli.inputs import check_out_dir, load_model
    from attnsens.cli.progress import ProgressReport
    from attnsens.influence.experiment import run_influence

    model = _model_name(model_argument, model_option)
    grid = None if lengths is None else _parse_lengths(lengths)
    if out is not None:
        check_out_dir(out)
    adapter = load_model(model)
    grid = _within_context(grid, adapter, quiet=as_json)
    _check_memory(grid, adapter)
    with ProgressReport("measuring influence", "lengths", enabled=not as_json) as report:
        result = run_influence(adapter, grid, name=model, n_samples=samples, seed=seed, progress=report.update)
    if out is not None:
        from attnsens.cli.inputs import writing

        with writing(out):
            result.write(out)
    if as_json:
        print_json(result.summary())
        return
    _print(result)
    if out is not None:
        console.print(f"wrote {out / 'influence'}")


def _model_name(argument: str | None, option: str | None) -> str:
    """MODEL or --model (the same, given either way), builtin:lnfree when neither is given."""
    from attnsens.errors import InputError

    if argument is not None and option is not None and argument != option:
        raise InputError(f"MODEL {argument!r} and --model {option!r} name two models; give one of them")
    return argument or option or "builtin:lnfree"


def _parse_lengths(lengths: str) -> list[int]:
    from attnsens.errors import InputError

    try:
        grid = [int(part) for part in lengths.split(",") if part.strip()]
    except ValueError as err:
        raise InputError(f"--lengths must be comma-separated integers, got {lengths!r}; e.g. 16,32,64") from err
    if not grid:
        raise InputError(f"--lengths {lengths!r} names no length; give comma-separated integers such as 16,32,64")
    small = [n for n in grid if n < 2]
    if small:
        raise InputError(f"--lengths must all be >= 2 (a nonfinal token needs one after it), got {small}")
    distinct = sorted(set(grid))
    if len(distinct) < 3:  # checked here, not after minutes of measuring, where the slope is fitted
        raise InputError(
            f"--lengths needs at least 3 distinct lengths for the log–log slope and its confidence interval, got "
            f"{distinct}; e.g. 16,64,256"
        )
    return grid


def _within_context(grid: list[int] | None, adapter: object, *, quiet: bool) -> list[int]:
    """The lengths given, refused where one exceeds the model's context; without --lengths, the default lengths
    within it (said unless ``quiet``)."""
    from attnsens.errors import InputError

    name, context = adapter.name, adapter.spec.max_positions  # type: ignore[attr-defined]
    if grid is not None:
        beyond = sorted({n for n in grid if n > context})
        if beyond:
            raise InputError(
                f"--lengths {beyond} exceed the context of {name!r} ({context} positions); use lengths up to {context}"
            )
        return grid
    grid = [n for n in _DEFAULT_LENGTHS if n <= context]
    if len(grid) < 3:
        short = [n for n in (4, 8, 16, 32) if n <= context][-3:]
        raise InputError(
            f"the context of {name!r} ({context} positions) holds {len(grid)} of the default lengths, fewer than the "
            f"3 of a slope; give --lengths, e.g. {','.join(map(str, short))}"
        )
    if len(grid) < len(_DEFAULT_LENGTHS) and not quiet:
        console.print(
            f"lengths {grid[0]}–{grid[-1]}: the default ones within the context of {name} ({context} positions)"
        )
    return grid


# Bytes per attention score of one forward pass: float32 scores, probabilities and a masked copy.
_BYTES_PER_SCORE = 12


def _check_memory(grid: list[int], adapter: object) -> None:
    """Refuse lengths whose attention scores (2 sequences × heads × n², one pair per pass) exceed half the RAM."""
    from attnsens._memory import longest_in_memory, memory_budget
    from attnsens.errors import InputError

    heads = adapter.spec.n_head  # type: ignore[attr-defined]

    def score_bytes(n: int) -> int:
        return 2 * heads * n * n * _BYTES_PER_SCORE

    longest = max(grid)
    limit = longest_in_memory(score_bytes, longest)
    if limit is not None:
        raise InputError(
            f"--lengths {longest} needs about {score_bytes(longest) / 2**30:.0f} GiB for one forward pass (2 × {heads} "
            f"heads × n² scores), more than half of this machine's memory ({2 * memory_budget() / 2**30:.0f} GiB); "
            f"use lengths up to {limit}"
        )


def _print(result: InfluenceResult) -> None:
    from rich.table import Table
    from rich.text import Text

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
        console.print(Text("no certificate: the theorem's assumptions fail here", style="yellow"))
        for reason in cert.reasons:
            console.print(f"  • {reason}")
        if cert.log10_constant is not None:
            console.print(f"  (the recursion would give C ≈ 10^{cert.log10_constant:.4g}, vacuous)")
    table = Table(title=f"influence of a nonfinal token — {result.model}")
    for column in ("n", "max ‖Δy_n‖₂", "n·max ‖Δy_n‖₂", "certified bound", "max TV"):
        table.add_column(column, justify="right")
    per_length = result.per_length()
    for row in per_length.itertuples():
        bound = f"{row.certified_bound:.3e}" if row.certified_bound == row.certified_bound else "—"
        tv = f"{row.tv:.3e}" if row.tv == row.tv else "—"
        table.add_row(str(row.n), f"{row.influence:.3e}", f"{row.n_times_influence:.4f}", bound, tv)
    console.print(table)
    if per_length["tv"].isna().all():
        console.print(f"max TV: none, {result.model} has no language-model head (no output distribution to compare)")
    low, high = fit.slope_ci
    console.print(
        f"log–log slope {fit.slope:.3f} ({fit.confidence:.0%} CI [{low:.3f}, {high:.3f}], {fit.n_points} lengths); "
        "the theorem predicts ≤ −1 where it applies"
    )
