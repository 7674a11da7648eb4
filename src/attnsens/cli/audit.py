"""``attnsens audit MODEL``: every attention row of some text → Parquet rows, summary and a per-layer table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from attnsens._ranks import first_rank
from attnsens.cli.app import (
    DeviceMapOption,
    JsonOption,
    ModelArgument,
    OffloadOption,
    PlacementOption,
    StepOption,
    app,
    console,
    console_note,
    domain_errors_exit,
    flag,
    format_theta_lower,
    print_json,
    silent_note,
    theta_footnote,
)
from attnsens.cli.interrupt import on_interrupt, rerun_to_resume

OutOption = Annotated[
    Path | None, typer.Option("--out", help="Run directory for the results (default: a new folder under runs/).")
]
SeqLenOption = Annotated[
    int | None,
    typer.Option(
        "--seq-len",
        min=1,
        help="Tokens per audited sequence (default: the text, up to the context, and for a model whose forward "
        "pass holds a layer's n² attention scores, up to what half the memory holds).",
    ),
]
TextOption = Annotated[
    Path | None, typer.Option("--text", help="UTF-8 text file to audit (default: the built-in corpus).")
]
CorpusOption = Annotated[
    str | None,
    typer.Option("--corpus", help="Built-in corpus to audit: shakespeare (the default when --text is not given)."),
]
IdsOption = Annotated[
    Path | None,
    typer.Option(
        "--ids",
        help="Token ids to audit instead of text, for a model without a tokenizer: a .pt or .npy tensor [n] (a "
        "stream cut into --seq-len windows) or [batch, n] (sequences, each cut to --seq-len), or text with the "
        "ids separated by spaces or commas, one sequence a line.",
    ),
]
BatchOption = Annotated[int, typer.Option("--batch", min=1, help="Number of sequences audited.")]
SampleOption = Annotated[
    int | None, typer.Option("--sample", min=1, help="Query positions sampled per sequence (default: all rows).")
]
SeedOption = Annotated[
    int | None,
    typer.Option("--seed", help="Seed of the position sample; for a study folder also the run audited."),
]
LayersOption = Annotated[
    str | None, typer.Option("--layers", help="Comma-separated 0-based layers to audit (default: all).")
]
HeadsOption = Annotated[
    str | None, typer.Option("--heads", help="Comma-separated 0-based heads to audit (default: all).")
]
PerHeadOption = Annotated[bool, flag("--per-head", help="Print the per-(layer, head) table, not only per layer.")]
DeviceOption = Annotated[str | None, typer.Option("--device", help="cpu, cuda or cuda:N (default: cpu).")]
DtypeOption = Annotated[
    str | None, typer.Option("--dtype", help="Weights' float type: float32 (default), bfloat16, float16, float64.")
]
RevisionOption = Annotated[
    str | None, typer.Option("--revision", help="Hub branch, tag or commit (e.g. Pythia's step1000).")
]
MaxMemoryOption = Annotated[
    int | None,
    typer.Option(
        "--max-memory",
        min=1,
        metavar="MiB",
        help="Working-set budget of one chunk of recomputed attention rows, in MiB; sizes the query chunks "
        "(default 128).",
    ),
]
ExactSupportOption = Annotated[
    int | None,
    typer.Option(
        "--exact-support",
        help="Prove θ exact on every row with at most this many non-zero keys (24–48; up to ~0.3 s a row at "
        "48). Default: rows of up to 26 keys on the CPU (24 on the GPU and torch paths), and longer ones "
        "where a cheap proof applies.",
    ),
]
TrustRemoteCodeOption = Annotated[
    bool, flag("--trust-remote-code", help="Allow model code from the hub to run (off by default).")
]


@app.command()
@domain_errors_exit
@on_interrupt(rerun_to_resume)
def audit(
    model: ModelArgument,
    out: OutOption = None,
    seq_len: SeqLenOption = None,
    text: TextOption = None,
    corpus: CorpusOption = None,
    ids: IdsOption = None,
    batch: BatchOption = 1,
    sample: SampleOption = None,
    seed: SeedOption = None,
    step: StepOption = None,
    placement: PlacementOption = None,
    layers: LayersOption = None,
    heads: HeadsOption = None,
    per_head: PerHeadOption = False,
    device: DeviceOption = None,
    dtype: DtypeOption = None,
    revision: RevisionOption = None,
    max_memory: MaxMemoryOption = None,
    exact_support: ExactSupportOption = None,
    device_map: DeviceMapOption = None,
    offload_folder: OffloadOption = None,
    trust_remote_code: TrustRemoteCodeOption = False,
    as_json: JsonOption = False,
) -> None:
    """Audit attention rows: θ certificates, p_max, entropy per row; per-layer summary table.

    Under torchrun (torchrun --nproc_per_node=N -m attnsens audit …) the sequences are shared out among the ranks.
    """
    from attnsens.capture import RowSelection
    from attnsens.cli import inputs
    from attnsens.cli.progress import ProgressReport
    from attnsens.store.lock import writing_run_folder
    from attnsens.study import auditing
    from attnsens.study.inputs import model_inputs
    from attnsens.train.saved import study_runs

    inputs.check_exact_support(exact_support)
    out = inputs.default_out_dir("audit", model) if out is None else out
    inputs.check_out_dir(out)
    inputs.check_device(device)
    device, quiet = inputs.join_ranks(device), as_json or not first_rank()
    torch_dtype = inputs.parse_dtype(dtype)
    layer_list, head_list = _indices(layers, "--layers"), _indices(heads, "--heads")
    tokens, name = _tokens_to_audit(ids, text, corpus)
    saved = inputs.saved_checkpoint(model, step, seed if study_runs(Path(model)) else None, placement)
    if seq_len is not None:
        inputs.check_context(model, saved, seq_len, trust_remote_code=trust_remote_code)
    # The lock before the model loads: a second writer of --out is refused at once, not after the load.
    with writing_run_folder(out, "audit"), inputs.weight_placement(device_map, offload_folder, out) as placed:
        adapter = inputs.load_model(
            model, saved, trust_remote_code=trust_remote_code, device=device, dtype=torch_dtype, revision=revision,
            placed=placed,
        )  # fmt: skip
        _check_selection(layer_list, head_list, adapter.spec)
        note = silent_note if quiet else console_note
        sequences, _ = model_inputs(adapter, tokens, seq_len=seq_len, n_sequences=batch, name=name, note=note)
        # Progress counts (sequence, layer) pairs: "layers" of one sequence, each sequence's layers of several.
        unit = "layers" if len(sequences) == 1 else f"layers ({len(sequences)} sequences)"
        with ProgressReport("auditing", unit, enabled=not quiet) as report:
            result = auditing.audit(
                adapter, sequences, out_dir=out, exact_support=exact_support, progress=report.update,
                selection=RowSelection(layers=layer_list, heads=head_list, sample_per_sequence=sample, seed=seed or 0),
                step=0 if saved is None else saved.step, seed=(seed or 0) if saved is None else saved.seed,
                max_memory=None if max_memory is None else max_memory * 2**20,
            )  # fmt: skip
    if first_rank():
        _print_audit(
            adapter.name, out, result, seq_len=sequences.shape[1], per_head=per_head, as_json=as_json,
            attention=adapter.spec.attention,
        )  # fmt: skip
        if adapter.not_bounded is not None and not as_json:  # a hybrid's layers are its attention blocks
            console.print(f"{adapter.not_bounded}.", soft_wrap=True)


def _tokens_to_audit(ids: Path | None, text: Path | None, corpus: str | None) -> tuple[Any, str | None]:
    """The token ids of --ids, or the text of --text or --corpus, and how messages name them (None: "the text")."""
    from attnsens.cli.inputs import read_token_ids
    from attnsens.errors import InputError

    if ids is not None:
        if text is not None or corpus is not None:
            raise InputError(f"give one of --ids {ids}, --text and --corpus, not several")
        return read_token_ids(ids), f"--ids {ids}"
    source = _read_source(text, corpus)
    if not source.strip():
        raise InputError(f"the text of {text} is empty; give a file or corpus with some text")
    return source, None


def _print_audit(
    name: str, out: Path, result: Any, *, seq_len: int, per_head: bool, as_json: bool, attention: tuple[str, ...]
) -> None:
    """The findings written into ``out``, then the per-layer (and per-head) tables, or the JSON payload; the layers
    of an encoder-decoder named with their ``attention`` (encoder, decoder, cross)."""
    from attnsens.report import write_findings

    findings_path, findings = write_findings(out)
    identity = ["run_id", "model", "step", "seed"]
    per_layer = result.layer_summary()
    summary = result.summary
    if attention:
        per_layer = per_layer.assign(attention=[attention[layer] for layer in per_layer["layer"]])
        summary = summary.assign(attention=[attention[layer] for layer in summary["layer"]])
    if as_json:
        payload = {
            "model": name,
            "out": str(out),
            "seq_len": seq_len,
            "n_rows": result.n_rows,
            "findings": findings,
            "layers": per_layer.drop(columns=[*identity, "head"]).to_dict("records"),
        }
        if per_head:
            head_rows = summary[summary["head"] >= 0]
            payload["heads"] = head_rows.drop(columns=identity).to_dict("records")
        print_json(payload)
        return
    if attention:  # "3 cross": the layer and its attention in one column
        per_layer, summary = (t.assign(layer=[f"{i} {attention[i]}" for i in t["layer"]]) for t in (per_layer, summary))
    if per_head:
        _print_table(name, summary[summary["head"] >= 0], by_head=True)
    _print_table(name, per_layer, by_head=False)
    console.print(
        f"{result.n_rows:,} rows written to {out}/rows, summary to {out}/summary, findings to {findings_path}",
        soft_wrap=True,
    )


def _indices(text: str | None, flag_name: str) -> tuple[int, ...] | None:
    from attnsens.errors import InputError

    if text is None:
        return None
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as err:
        raise InputError(f"{flag_name} must be comma-separated 0-based indices such as 0,2, got {text!r}") from err
    if not values:
        raise InputError(f"{flag_name} {text!r} names no index; give comma-separated indices such as 0,2")
    return values


def _check_selection(layers: tuple[int, ...] | None, heads: tuple[int, ...] | None, spec: Any) -> None:
    """--layers and --heads within the model's layers and heads."""
    _check_indices(layers, spec.n_layer, "--layers", "layers")
    _check_indices(heads, spec.n_head, "--heads", "heads")


def _check_indices(values: tuple[int, ...] | None, count: int, flag_name: str, what: str) -> None:
    from attnsens.errors import InputError

    outside = [v for v in values or () if not 0 <= v < count]
    if outside:
        raise InputError(f"{flag_name} {outside} outside the model's {count} {what}; use indices 0 to {count - 1}")


def _read_source(text: Path | None, corpus: str | None) -> str:
    """The text of --text FILE, or of the built-in corpus (--corpus shakespeare, or neither option given)."""
    from attnsens.cli.inputs import read_text_file
    from attnsens.errors import InputError

    if text is not None and corpus is not None:
        raise InputError(f"give one of --text FILE and --corpus {corpus}, not both")
    if text is not None:
        return read_text_file(text)
    if corpus not in (None, "shakespeare"):
        raise InputError(f"unknown corpus {corpus!r}; the built-in corpus is 'shakespeare'")
    from attnsens.train.data import read_documents

    return "\n\n".join(read_documents(None))


def _print_table(name: str, summary: object, *, by_head: bool) -> None:
    from rich.table import Table

    keys = ("layer", "head") if by_head else ("layer",)
    title = f"attention audit of {name}" + (", per head" if by_head else "")
    table = Table(title=title, header_style="bold")
    records = list(summary.itertuples(index=False))  # type: ignore[attr-defined]
    marked = [format_theta_lower(record.theta_lower_median) for record in records]
    theta = [text for text, _ in marked]
    theta_header = "median θ lower bound"
    columns = (*keys, "rows", theta_header, "dominant fraction", "median p_max", "mean entropy (nats)")
    theta_width = max(map(len, theta), default=0)
    # The θ digits that tell 0.99999998 from 1 are the point of the column: it never truncates them. On a terminal
    # too narrow for every header on one line, the other headers wrap (at most 9 wide) so that the table fits.
    natural = sum(max(len(column), theta_width if column == theta_header else 6) + 3 for column in columns)
    narrow = natural + 1 > console.width
    for column in columns:
        if column == theta_header:
            table.add_column(column, justify="right", min_width=theta_width)
        else:
            table.add_column(column, justify="right", max_width=9 if narrow else None)
    for record, theta_text in zip(records, theta, strict=True):
        table.add_row(
            *(str(getattr(record, key)) for key in keys),
            str(record.n_rows),
            theta_text,
            f"{record.fraction_dominant:.3f}",
            f"{record.p_max_median:.4f}",
            f"{record.entropy_mean:.3f}",
        )
    console.print(table)
    footnote = theta_footnote({reason for _, reason in marked})
    if footnote is not None:
        console.print(footnote, soft_wrap=True)
