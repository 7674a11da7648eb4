"""``attnsens audit MODEL``: every attention row of some text → Parquet rows, summary and a per-layer table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from attnsens.cli.app import (
    JsonOption,
    ModelArgument,
    PlacementOption,
    StepOption,
    app,
    console,
    domain_errors_exit,
    flag,
    format_theta_lower,
    print_json,
    theta_footnote,
)
from attnsens.cli.interrupt import on_interrupt, rerun_to_resume


@app.command()
@domain_errors_exit
@on_interrupt(rerun_to_resume)
def audit(
    model: ModelArgument,
    out: Annotated[
        Path | None, typer.Option("--out", help="Run directory for the results (default: a new folder under runs/).")
    ] = None,
    seq_len: Annotated[
        int | None,
        typer.Option(
            "--seq-len",
            min=1,
            help="Tokens per audited sequence (default: the text, up to the context, and for a model whose forward "
            "pass holds a layer's n² attention scores, up to what half the memory holds).",
        ),
    ] = None,
    text: Annotated[
        Path | None, typer.Option("--text", help="UTF-8 text file to audit (default: the built-in corpus).")
    ] = None,
    corpus: Annotated[
        str | None,
        typer.Option("--corpus", help="Built-in corpus to audit: shakespeare (the default when --text is not given)."),
    ] = None,
    ids: Annotated[
        Path | None,
        typer.Option(
            "--ids",
            help="Token ids to audit instead of text, for a model without a tokenizer: a .pt or .npy tensor [n] (a "
            "stream cut into --seq-len windows) or [batch, n] (sequences, each cut to --seq-len), or text with the "
            "ids separated by spaces or commas, one sequence a line.",
        ),
    ] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Number of sequences audited.")] = 1,
    sample: Annotated[
        int | None, typer.Option("--sample", min=1, help="Query positions sampled per sequence (default: all rows).")
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Seed of the position sample; for a study folder also the run audited."),
    ] = None,
    step: StepOption = None,
    placement: PlacementOption = None,
    layers: Annotated[
        str | None, typer.Option("--layers", help="Comma-separated 0-based layers to audit (default: all).")
    ] = None,
    heads: Annotated[
        str | None, typer.Option("--heads", help="Comma-separated 0-based heads to audit (default: all).")
    ] = None,
    per_head: Annotated[
        bool, flag("--per-head", help="Print the per-(layer, head) table, not only per layer.")
    ] = False,
    device: Annotated[str | None, typer.Option("--device", help="cpu, cuda or cuda:N (default: cpu).")] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="Weights' float type: float32 (default), bfloat16, float16, float64.")
    ] = None,
    revision: Annotated[
        str | None, typer.Option("--revision", help="Hub branch, tag or commit (e.g. Pythia's step1000).")
    ] = None,
    max_memory: Annotated[
        int | None,
        typer.Option(
            "--max-memory",
            min=1,
            metavar="MiB",
            help="Working-set budget of one chunk of recomputed attention rows, in MiB; sizes the query chunks "
            "(default 128).",
        ),
    ] = None,
    exact_support: Annotated[
        int | None,
        typer.Option(
            "--exact-support",
            help="Prove θ exact on every row with at most this many non-zero keys (24–48; up to ~0.3 s a row at "
            "48). Default: rows of up to 26 keys on the CPU (24 on the GPU and torch paths), and longer ones "
            "where a cheap proof applies.",
        ),
    ] = None,
    trust_remote_code: Annotated[
        bool, flag("--trust-remote-code", help="Allow model code from the hub to run (off by default).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Audit attention rows: θ certificates, p_max, entropy per row; per-layer summary table."""
    from attnsens.capture import RowSelection
    from attnsens.cli.inputs import (
        check_context,
        check_device,
        check_exact_support,
        check_out_dir,
        default_out_dir,
        load_model,
        parse_dtype,
        read_token_ids,
        saved_checkpoint,
    )
    from attnsens.cli.progress import ProgressReport
    from attnsens.errors import InputError
    from attnsens.store.lock import writing_run_folder
    from attnsens.study.audit import audit as run_audit
    from attnsens.study.audit import split_sequences
    from attnsens.train.saved import study_runs

    check_exact_support(exact_support)
    out = default_out_dir("audit", model) if out is None else out
    check_out_dir(out)
    check_device(device)
    torch_dtype = parse_dtype(dtype)
    layer_list, head_list = _indices(layers, "--layers"), _indices(heads, "--heads")
    if ids is not None and (text is not None or corpus is not None):
        raise InputError(f"give one of --ids {ids}, --text and --corpus, not several")
    token_ids = None if ids is None else read_token_ids(ids)
    source = "" if token_ids is not None else _read_source(text, corpus)
    if token_ids is None and not source.strip():
        raise InputError(f"the text of {text} is empty; give a file or corpus with some text")
    run_seed = seed if study_runs(Path(model)) else None
    saved = saved_checkpoint(model, step, run_seed, placement)
    if seq_len is not None:
        check_context(model, saved, seq_len, trust_remote_code=trust_remote_code)
    # The lock before the model loads: a second writer of --out is refused at once, not after the load.
    with writing_run_folder(out, "audit"):
        adapter = load_model(
            model, saved, trust_remote_code=trust_remote_code, device=device, dtype=torch_dtype, revision=revision
        )
        _check_indices(layer_list, adapter.spec.n_layer, "--layers", "layers")
        _check_indices(head_list, adapter.spec.n_head, "--heads", "heads")
        if token_ids is None:
            available = None
        else:  # a stream's windows, or each sequence, at most the context
            available = min(token_ids.shape[-1], adapter.spec.max_positions)
        seq_len = _seq_len_in_memory(adapter, seq_len, source, quiet=as_json, available=available)
        if token_ids is not None and token_ids.ndim == 2:  # sequences of their own: each cut to --seq-len
            seq_len = min(seq_len, token_ids.shape[1])
            sequences = split_sequences(adapter, token_ids[:, :seq_len], n_sequences=batch)
        else:
            tokens = source if token_ids is None else token_ids
            sequences = split_sequences(adapter, tokens, seq_len=seq_len, n_sequences=batch)
        if len(sequences) < batch:
            what = "the text" if token_ids is None else f"--ids {ids}"
            raise InputError(
                f"{what} gives {len(sequences)} sequence(s) of {seq_len} tokens, fewer than --batch {batch}; "
                f"use --batch {len(sequences)}, a shorter --seq-len or more {'text' if token_ids is None else 'ids'}"
            )
        # Progress counts (sequence, layer) pairs: "layers" of one sequence, each sequence's layers of several.
        unit = "layers" if len(sequences) == 1 else f"layers ({len(sequences)} sequences)"
        with ProgressReport("auditing", unit, enabled=not as_json) as report:
            result = run_audit(
                adapter,
                sequences,
                selection=RowSelection(layers=layer_list, heads=head_list, sample_per_sequence=sample, seed=seed or 0),
                out_dir=out,
                step=0 if saved is None else saved.step,
                seed=(seed or 0) if saved is None else saved.seed,
                max_memory=None if max_memory is None else max_memory * 2**20,
                exact_support=exact_support,
                progress=report.update,
            )
    from attnsens.report import write_findings

    findings_path, findings = write_findings(out)
    identity = ["run_id", "model", "step", "seed"]
    per_layer = result.layer_summary()
    if as_json:
        payload = {
            "model": adapter.name,
            "out": str(out),
            "seq_len": seq_len,
            "n_rows": result.n_rows,
            "findings": findings,
            "layers": per_layer.drop(columns=[*identity, "head"]).to_dict("records"),
        }
        if per_head:
            head_rows = result.summary[result.summary["head"] >= 0]
            payload["heads"] = head_rows.drop(columns=identity).to_dict("records")
        print_json(payload)
        return
    if per_head:
        _print_table(adapter.name, result.summary[result.summary["head"] >= 0], by_head=True)
    _print_table(adapter.name, per_layer, by_head=False)
    console.print(
        f"{result.n_rows:,} rows written to {out}/rows, summary to {out}/summary, findings to {findings_path}",
        soft_wrap=True,
    )


def _seq_len_in_memory(
    adapter: Any, seq_len: int | None, source: str, *, quiet: bool, available: int | None = None
) -> int:
    """--seq-len, or without it the tokens of ``source`` up to the context (``text_seq_len``; ``available`` tokens
    where the ids are given instead of text), checked against what
    the model's own forward pass holds for one layer's attention scores (``ModelAdapter.forward_score_bytes``): a
    --seq-len beyond half of this machine's memory is refused, the default shortened to fit (said unless
    ``quiet``)."""
    from attnsens.cli.app import error_console
    from attnsens.cli.inputs import longest_in_memory, memory_budget
    from attnsens.errors import InputError
    from attnsens.study.audit import text_seq_len

    limit = longest_in_memory(lambda n: adapter.forward_score_bytes(1, n), adapter.spec.max_positions)
    if seq_len is None:
        text_tokens = text_seq_len(adapter, source) if available is None else available
        if limit is not None and text_tokens > limit:
            if not quiet:
                error_console.print(
                    f"note: auditing windows of {limit:,} tokens: {adapter.name}'s forward pass holds each layer's "
                    f"attention scores at once, and longer ones would not fit in half of this machine's memory "
                    f"(its context is {adapter.spec.max_positions:,}); --seq-len chooses another length",
                    soft_wrap=True,
                )
            return limit
        return text_tokens
    if limit is not None and seq_len > limit:
        needed = adapter.forward_score_bytes(1, seq_len)
        raise InputError(
            f"--seq-len {seq_len} needs about {needed / 2**30:.1f} GiB for the attention scores that "
            f"{adapter.name}'s forward pass holds for one layer ({adapter.spec.n_head} heads × n²), more than half "
            f"of this machine's memory ({2 * memory_budget() / 2**30:.0f} GiB); use --seq-len {limit} or less"
        )
    return seq_len


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
