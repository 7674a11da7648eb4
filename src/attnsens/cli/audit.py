"""``attnsens audit MODEL``: every attention row of some text → Parquet rows, summary and a per-layer table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnsens.cli.app import JsonOption, OutDirOption, app, console, domain_errors_exit, print_json


@app.command()
@domain_errors_exit
def audit(
    model: Annotated[str, typer.Argument(help="Model: alias (smollm2, minilm), local path, .gguf file or hub id.")],
    out: OutDirOption,
    seq_len: Annotated[int, typer.Option("--seq-len", min=1, help="Tokens per audited sequence.")],
    text: Annotated[Path | None, typer.Option("--text", help="UTF-8 text file to audit.")] = None,
    corpus: Annotated[str | None, typer.Option("--corpus", help="Built-in corpus to audit: shakespeare.")] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Number of sequences audited.")] = 1,
    sample: Annotated[
        int | None, typer.Option("--sample", min=1, help="Query positions sampled per sequence (default: all rows).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the position sample.")] = 0,
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Allow model code from the hub to run (off by default).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Audit attention rows: θ certificates, p_max, entropy per row; per-layer summary table."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers.utils import logging as hf_logging

    from attnsens.capture import RowSelection
    from attnsens.errors import InputError
    from attnsens.models import load
    from attnsens.study.audit import audit as run_audit

    # The command prints its own progress; transformers' load bars and length warnings would interleave.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    source = _read_source(text, corpus)
    if not source.strip():
        raise InputError(f"the text of {text or corpus} is empty; give a file or corpus with some text")
    adapter = load(model, trust_remote_code=trust_remote_code)
    selection = RowSelection(sample_per_sequence=sample, seed=seed)
    with Progress(
        TextColumn("auditing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("layers"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=as_json,
    ) as bar:
        task = bar.add_task("audit", total=None)
        result = run_audit(
            adapter,
            source,
            seq_len=seq_len,
            n_sequences=batch,
            selection=selection,
            out_dir=out,
            seed=seed,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    layers = result.layer_summary()
    if as_json:
        print_json(
            {
                "model": adapter.name,
                "out": str(out),
                "n_rows": len(result.rows),
                "layers": layers.drop(columns=["run_id", "model", "step", "seed", "head"]).to_dict("records"),
            }
        )
        return
    _print_table(adapter.name, layers, len(result.rows), out)


def _read_source(text: Path | None, corpus: str | None) -> str:
    from attnsens.errors import FileFormatError, InputError

    if (text is None) == (corpus is None):
        raise InputError("give exactly one of --text FILE and --corpus shakespeare")
    if text is not None:
        if not text.is_file():
            raise FileFormatError(f"text file {str(text)!r} does not exist; check the path")
        try:
            return text.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise FileFormatError(f"cannot read {str(text)!r} as UTF-8 text ({err}); give a UTF-8 text file") from None
    if corpus != "shakespeare":
        raise InputError(f"unknown corpus {corpus!r}; the built-in corpus is 'shakespeare'")
    from attnsens.train.data import read_documents

    return "\n\n".join(read_documents(None))


def _print_table(name: str, layers: object, n_rows: int, out: Path) -> None:
    from rich.table import Table

    table = Table(title=f"attention audit of {name}", header_style="bold")
    for column in ("layer", "rows", "median θ lower bound", "dominant fraction", "median p_max", "mean entropy (nats)"):
        table.add_column(column, justify="right")
    for record in layers.itertuples(index=False):  # type: ignore[attr-defined]
        table.add_row(
            str(record.layer),
            str(record.n_rows),
            f"{record.theta_lower_median:.4f}",
            f"{record.fraction_dominant:.3f}",
            f"{record.p_max_median:.4f}",
            f"{record.entropy_mean:.3f}",
        )
    console.print(table)
    console.print(f"{n_rows} rows written to {out}/rows, summary to {out}/summary", highlight=False)
