"""``attnsens bounds MODEL``: certified attention, FFN and block bounds per layer and head beside estimates.

MODEL is anything ``attnsens.models.load`` accepts (alias ``smollm2`` / ``minilm``, own GPT checkpoint, local
path, hub id) or a ``.safetensors`` file in attnsens' layer-weights layout: tensors
``layers.{i}.attention.{w_q,w_k,w_v,w_o,b_q,b_k,b_v,b_o}``, ``layers.{i}.mlp.{w_in,w_out,b_in,b_out,w_gate}``,
``layers.{i}.{attn_norm,mlp_norm}.{gamma,beta}`` plus the JSON metadata ``attnsens.layers`` (see
``attnsens.study.bounds``). A weights-only file has no embedding: it is evaluated on a seeded Gaussian residual
stream of ``--seq-len`` tokens with RMS 1 per token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnsens.cli.app import JsonOption, app, console, domain_errors_exit, print_json

SAMPLE_TEXT = (
    "The quality of mercy is not strained; it droppeth as the gentle rain from heaven upon the place beneath. "
    "It is twice blest: it blesseth him that gives and him that takes. 'Tis mightiest in the mightiest; it "
    "becomes the throned monarch better than his crown."
)

COLUMNS = (
    ("layer", "layer", "{:d}"),
    ("θ̃ max", "theta_tilde", "{:.3f}"),
    ("local bound", "mha_local_jacobian_upper_bound", "{:.3g}"),
    ("estimate", "mha_jacobian_estimate", "{:.3g}"),
    ("ratio", "tightness_ratio", "{:.2f}"),
    ("Lipschitz (θ=1)", "mha_lipschitz_upper_bound", "{:.3g}"),
    ("FFN Lip", "ffn_lipschitz_upper_bound", "{:.3g}"),
    ("block local", "residual_jacobian_upper_bound", "{:.3g}"),
    ("block est.", "block_jacobian_estimate", "{:.3g}"),
    ("LN cond.", "ln_condition_fraction", "{:.2f}"),
)


@app.command()
@domain_errors_exit
def bounds(
    model: Annotated[
        str, typer.Argument(help="Model alias/path/hub id, or a .safetensors file of the attnsens layer layout.")
    ],
    text: Annotated[Path | None, typer.Option("--text", help="UTF-8 text file for the local bounds.")] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", min=1, help="Tokens of the evaluated sequence.")] = 32,
    geometry: Annotated[str, typer.Option("--geometry", help="Block norm convention: rms or l2.")] = "rms",
    queries: Annotated[int, typer.Option("--queries", min=1, help="Output tokens probed by the estimators.")] = 8,
    iterations: Annotated[int, typer.Option("--iterations", min=1, help="Estimator ascent steps.")] = 10,
    out: Annotated[Path | None, typer.Option("--out", help="Directory to write bounds.parquet into.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Per layer and head: projection norms, Φ_h, θ̃_h, certified local and global bounds, estimates, ratios."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from attnsens.errors import FileFormatError, InputError
    from attnsens.study.bounds import bound_model, load_layer_weights

    if model.endswith(".safetensors"):
        if text is not None:
            raise InputError(f"{model} holds layer weights only (no tokenizer); drop --text or give a full model")
        target, input_ids, name = load_layer_weights(model), None, Path(model).name
        n_layer = len(target)
    else:
        from transformers.utils import logging as hf_logging

        from attnsens.models import load

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        source = SAMPLE_TEXT
        if text is not None:
            if not text.is_file():
                raise FileFormatError(f"text file {str(text)!r} does not exist; check the path")
            source = text.read_text(encoding="utf-8")
        target = load(model)
        input_ids, name, n_layer = target.encode(source, max_length=seq_len), target.name, len(target.layers)
    with Progress(
        TextColumn("bounding"), BarColumn(), MofNCompleteColumn(), TextColumn("layers"), TimeElapsedColumn(),
        console=console, transient=True, disable=as_json,
    ) as bar:  # fmt: skip
        task = bar.add_task("bounds", total=n_layer)
        table = bound_model(
            target, input_ids, seq_len=seq_len, geometry=geometry, n_queries=queries, iterations=iterations,
            model_name=name, on_layer=lambda _: bar.advance(task),
        )  # fmt: skip
    if out is not None:
        from attnsens.store.parquet import write_parquet

        write_parquet(table, Path(out) / "bounds.parquet", schema="bounds", metadata={"model": name})
    layers = table[table["head"] == -1]
    if as_json:
        records = table.astype(object).where(table.notna(), None).to_dict("records")
        print_json({"model": name, "norm": f"block_{geometry}", "records": records})
        return
    _print_table(name, layers, geometry)
    if out is not None:
        console.print(f"bounds written to {Path(out) / 'bounds.parquet'}", highlight=False)


def _print_table(name: str, layers: object, geometry: str) -> None:
    from rich.table import Table

    table = Table(title=f"certified bounds of {name} (block_{geometry} norm)", header_style="bold")
    for title, _, _ in COLUMNS:
        table.add_column(title, justify="right")
    for record in layers.to_dict("records"):  # type: ignore[attr-defined]
        cells = []
        for _, column, fmt in COLUMNS:
            value = record.get(column)
            cells.append("—" if value is None or value != value else fmt.format(value))
        table.add_row(*cells)
    console.print(table)
