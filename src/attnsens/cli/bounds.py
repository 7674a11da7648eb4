"""``attnsens bounds MODEL``: certified attention, FFN and block bounds per layer and head beside estimates.

MODEL is anything ``attnsens.models.load`` accepts (alias ``smollm2`` / ``minilm``, own GPT checkpoint, local
path, hub id) or a ``.safetensors`` file in attnsens' layer-weights layout: tensors
``layers.{i}.attention.{w_q,w_k,w_v,w_o,b_q,b_k,b_v,b_o}``, ``layers.{i}.mlp.{w_in,w_out,b_in,b_out,w_gate}``,
``layers.{i}.{attn_norm,mlp_norm,attn_out_norm,mlp_out_norm}.{gamma,beta}`` plus the JSON metadata
``attnsens.layers`` (see ``attnsens.store.layer_weights``). A weights-only file has no embedding: it is evaluated on
a seeded Gaussian residual stream of ``--seq-len`` tokens with RMS 1 per token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from attnsens.cli.app import (
    DeviceMapOption,
    JsonOption,
    OffloadOption,
    PlacementOption,
    StepOption,
    app,
    console,
    console_note,
    domain_errors_exit,
    flag,
    print_json,
    silent_note,
)
from attnsens.cli.interrupt import on_interrupt, rerun_bounds

SAMPLE_TEXT = (
    "The quality of mercy is not strained; it droppeth as the gentle rain from heaven upon the place beneath. "
    "It is twice blest: it blesseth him that gives and him that takes. 'Tis mightiest in the mightiest; it "
    "becomes the throned monarch better than his crown."
)

COLUMNS = (
    ("layer", "layer"),
    ("θ̃ max", "theta_tilde"),
    ("MHA bound", "mha_local_jacobian_upper_bound"),
    ("MHA est.", "mha_jacobian_estimate"),
    ("ratio", "tightness_ratio"),
    ("MHA Lip", "mha_lipschitz_upper_bound"),
    ("FFN Lip", "ffn_lipschitz_upper_bound"),
    ("block bound", "residual_jacobian_upper_bound"),
    ("block est.", "block_jacobian_estimate"),
    ("LN cond.", "ln_condition_fraction"),
)
"""(title, column of the bounds table) of the terminal table; every number is shown with 3 significant digits."""

LEGEND = (
    "Jacobian norms ({norm}) at the evaluated tokens, 3 significant digits. bound: certified upper bound; est.: "
    "autograd lower estimate; ratio = MHA bound / MHA est. (1 = tight); θ̃ max: largest per-head θ̃; MHA Lip: "
    "length-independent Lipschitz bound (θ = 1) on the input ball; FFN Lip: the FFN's; LN cond.: fraction of "
    "tokens meeting the LayerNorm condition (T6); —: not applicable."
)


ESTIMATOR_BUDGET = (
    "Certified bounds do not depend on the estimator budget. The estimates are lower bounds from a block power "
    "ascent with, per Jacobian (the attention sublayer and the block: two per layer), 1 random start × --iterations "
    "steps at --queries output tokens, half of them where the certified bound is largest."
)


ModelOrWeightsArgument = Annotated[
    str,
    typer.Argument(
        help="Model alias, run/checkpoint/study folder, path or hub id, or a .safetensors file of the "
        "attnsens layer layout."
    ),
]
TextOption = Annotated[
    Path | None, typer.Option("--text", help="UTF-8 text file for the local bounds (default: a sample text).")
]
IdsOption = Annotated[
    Path | None,
    typer.Option(
        "--ids",
        help="Token ids to bound on instead of text, for a model without a tokenizer: a .pt or .npy tensor, or "
        "text with the ids separated by spaces or commas; the first --seq-len ids of its first sequence.",
    ),
]
SeqLenOption = Annotated[int, typer.Option("--seq-len", min=2, help="Tokens of the evaluated sequence.")]
GeometryOption = Annotated[str, typer.Option("--geometry", help="Block norm convention: rms or l2.")]
QueriesOption = Annotated[
    int,
    typer.Option(
        "--queries",
        min=1,
        help="Estimator budget: output tokens probed per Jacobian (time grows in proportion; more: tighter).",
    ),
]
IterationsOption = Annotated[
    int,
    typer.Option("--iterations", min=1, help="Estimator budget: ascent steps per probe (time grows in proportion)."),
]
PlacementsOption = Annotated[
    bool,
    flag(
        "--placements/--no-placements",
        help="Also estimate the block under the pre-LN and the post-LN arrangement of its weights (T8): three "
        "more Jacobians per layer, about 2.5× the estimator time; the columns are in --out and --json.",
    ),
]
ThreadsOption = Annotated[
    int,
    typer.Option(
        "--threads",
        min=1,
        help="CPU threads for torch. Default 1: the bounds are many small matrix operations, which more threads "
        "speed up little on idle cores and slow down several times over when other work shares them.",
    ),
]
SeedOption = Annotated[int | None, typer.Option("--seed", help="Run of a study folder (its training seed).")]
OutOption = Annotated[Path | None, typer.Option("--out", help="Directory to write bounds.parquet into.")]


@app.command(epilog=ESTIMATOR_BUDGET)
@domain_errors_exit
@on_interrupt(rerun_bounds)
def bounds(
    model: ModelOrWeightsArgument,
    text: TextOption = None,
    ids: IdsOption = None,
    seq_len: SeqLenOption = 32,
    geometry: GeometryOption = "rms",
    queries: QueriesOption = 4,
    iterations: IterationsOption = 5,
    placements: PlacementsOption = False,
    threads: ThreadsOption = 1,
    step: StepOption = None,
    placement: PlacementOption = None,
    seed: SeedOption = None,
    out: OutOption = None,
    device_map: DeviceMapOption = None,
    offload_folder: OffloadOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per layer and head: projection norms, Φ_h, θ̃_h, certified local and global bounds, estimates, ratios.

    Under torchrun (torchrun --nproc_per_node=N -m attnsens bounds …) the layers are shared out among the ranks.
    """
    import torch

    from attnsens._ranks import first_rank
    from attnsens._threads import keep_torch_threads
    from attnsens.cli.inputs import check_out_dir, join_ranks, saved_checkpoint, weight_placement
    from attnsens.cli.progress import ProgressReport
    from attnsens.geometry.norms import check_geometry
    from attnsens.study.bounds import bound_model

    check_geometry(geometry)
    if out is not None:
        check_out_dir(out)
    saved, quiet = saved_checkpoint(model, step, seed, placement), as_json or not first_rank()
    join_ranks(None)
    with weight_placement(device_map, offload_folder, out) as placed:
        target, input_ids, name, n_layer = _bounded(
            model, saved, text=text, ids=ids, seq_len=seq_len, quiet=quiet, placed=placed
        )
        with keep_torch_threads(), ProgressReport("bounding", "layers", enabled=not quiet) as report:
            torch.set_num_threads(threads)  # restored on exit, so a caller in the same process keeps its own setting
            table = bound_model(
                target, input_ids, seq_len=seq_len, geometry=geometry, n_queries=queries, iterations=iterations,
                compare_placements=placements, model_name=name, on_layer=lambda i: report.update(i + 1, n_layer),
                shared=True,
            )  # fmt: skip
    if not first_rank():
        return
    if saved is not None:
        table["step"], table["seed"] = saved.step, saved.seed
    if out is not None:
        _write_bounds(Path(out), table, name)
    if as_json:
        print_json({"model": name, "norm": f"block_{geometry}", "records": table.to_dict("records")})
        return
    _print_table(name, table[table["head"] == -1], geometry)
    partial = getattr(target, "not_bounded", None)
    if partial is not None:
        console.print(f"{partial}.", soft_wrap=True)
    moe_modules = getattr(target, "moe_modules", None)
    experts = [i for i in range(n_layer) if moe_modules is not None and moe_modules(i) is not None]
    if experts:
        console.print(
            f"layer(s) {experts} hold a mixture of experts: their bounds are local, at these tokens with the router's "
            "choice there (docs/math.md T7); FFN Lip and the block's Lipschitz bound are inf, a mixture having none.",
            soft_wrap=True,
        )
    console.print(
        f"estimator budget: block power ascent, 1 random start × {iterations} steps at {queries} output token(s) "
        f"per Jacobian, pre/post-LN comparison {'on (--no-placements skips it)' if placements else 'off'}; higher "
        "--queries/--iterations give tighter (larger) estimates and take longer in proportion.",
        soft_wrap=True,
    )
    if out is not None:
        console.print(f"bounds written to {Path(out) / 'bounds.parquet'}")


def _bounded(
    model: str, saved: Any, *, text: Path | None, ids: Path | None, seq_len: int, quiet: bool, placed: dict[str, Any]
) -> tuple[Any, Any, str, int]:
    """What ``bounds`` evaluates, its token ids, name and number of layers: a layer-weights file alone (no
    tokens), or the model and the first --seq-len tokens of --ids, --text or the sample text
    (``attnsens.study.inputs.leading_tokens``)."""
    from attnsens.cli.inputs import check_context, load_model, read_text_file, read_token_ids
    from attnsens.errors import InputError
    from attnsens.store.layer_weights import load_layer_weights
    from attnsens.study.inputs import leading_tokens

    if ids is not None and text is not None:
        raise InputError(f"give one of --ids {ids} and --text {text}, not both")
    if saved is None and model.endswith(".safetensors"):
        if text is not None or ids is not None:
            raise InputError(
                f"{model} holds layer weights only (no embeddings); drop --{'text' if ids is None else 'ids'} or give "
                "a full model"
            )
        weights = load_layer_weights(model)
        return weights, None, Path(model).name, len(weights)
    tokens = read_token_ids(ids) if ids is not None else SAMPLE_TEXT if text is None else read_text_file(text)
    check_context(model, saved, seq_len)
    target = load_model(model, saved, placed=placed)
    name = None if ids is None else f"--ids {ids}"
    input_ids = leading_tokens(target, tokens, seq_len=seq_len, name=name, note=silent_note if quiet else console_note)
    return target, input_ids, target.name, len(target.layers)


def _write_bounds(out: Path, table: Any, name: str) -> None:
    """``out/bounds.parquet``, a unit of the folder's manifest, so report and verify check it like any run's."""
    from attnsens.cli.inputs import writing
    from attnsens.store import Manifest

    with writing(out / "bounds.parquet"):
        Manifest.open(out).write_unit("bounds.parquet", table, schema="bounds", metadata={"model": name})


def _print_table(name: str, layers: object, geometry: str) -> None:
    from rich import box
    from rich.table import Table

    rows = [
        [_cell(record.get(column), integer=column == "layer") for _, column in COLUMNS]
        for record in layers.to_dict("records")  # type: ignore[attr-defined]
    ]
    title = f"certified bounds of {name} (block_{geometry} norm)"
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)
    for index, (title, _) in enumerate(COLUMNS):
        # Numbers never shrink to "…": a narrow terminal wraps the headers instead.
        table.add_column(title, justify="right", min_width=max([len(r[index]) for r in rows] + [1]))
    for cells in rows:
        table.add_row(*cells)
    console.print(table)
    console.print(LEGEND.format(norm=f"block_{geometry}"), soft_wrap=True)


def _cell(value: object, *, integer: bool) -> str:
    if value is None or value != value:
        return "—"
    return str(int(value)) if integer else f"{value:.3g}"  # type: ignore[call-overload]
