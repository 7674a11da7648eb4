"""``attnsens theta FILE``: certify θ(p) for every attention row of a saved tensor (.npy, .pt, .safetensors)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnsens.cli.app import (
    JsonOption,
    app,
    console,
    domain_errors_exit,
    flag,
    format_theta_lower,
    print_json,
    theta_footnote,
)
from attnsens.errors import FileFormatError, InputError

if TYPE_CHECKING:
    import torch

    from attnsens.theta import ThetaCertificate

SUFFIXES = (".npy", ".pt", ".pth", ".safetensors")


@app.command()
@domain_errors_exit
def theta(
    file: Annotated[Path, typer.Argument(help="Tensor of attention probabilities: .npy, .pt or .safetensors.")],
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="Tensor name inside a .pt dict or .safetensors file; a nested one by its dotted path "
            "(layer0.attn, attentions.3).",
        ),
    ] = None,
    dim: Annotated[int, typer.Option("--dim", help="Key axis of the tensor.")] = -1,
    precision: Annotated[str, typer.Option("--precision", help="Stop refining at float32 or float64 resolution.")] = (
        "float32"
    ),
    exact_support: Annotated[
        int | None,
        typer.Option(
            "--exact-support",
            help="Prove every row with at most this many non-zero keys exact (24–48; the enumeration of an open "
            "row of 45–48 keys takes milliseconds to a few tenths of a second). Default: rows of up to 26 keys on "
            "the CPU (24 on the GPU and torch paths), and longer ones where a cheap proof applies.",
        ),
    ] = None,
    normalize: Annotated[bool, flag("--normalize", help="Renormalise rows instead of checking sums.")] = False,
    tolerance: Annotated[
        float | None,
        typer.Option(
            "--tolerance",
            help="Largest accepted |row sum − 1| (default: follows the dtype: 1e-3 for float32/float64, "
            "2^-9 for float16, 2^-6 for bfloat16).",
        ),
    ] = None,
    as_json: JsonOption = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write per-row results to this Parquet file (column names, types and method codes of the audit "
            "rows table).",
        ),
    ] = None,
) -> None:
    """Certified interval for θ(p) = 4·max_S p(S)(1 − p(S)) of every attention row, with a summary."""
    import time

    from attnsens.cli.inputs import check_exact_support, check_out_file, writing
    from attnsens.cli.progress import ProgressReport
    from attnsens.theta import certify

    if out is not None:
        check_out_file(out, example="rows.parquet")
    check_exact_support(exact_support)
    p = load_tensor(file, key)
    start = time.perf_counter()
    _load_kernels(p, dim, precision)
    load_seconds = time.perf_counter() - start
    start = time.perf_counter()
    if not normalize:
        _check_key_axis(p, dim, tolerance, file)
    if exact_support is not None:
        _note_enumeration(p, dim, exact_support)
    long_call = p.numel() >= PROGRESS_MIN_ELEMENTS or (exact_support or 0) >= ENUMERATION_NOTE_SUPPORT
    try:
        with ProgressReport("certifying", "rows", enabled=long_call and not as_json) as report:
            cert = certify(
                p, dim, precision=precision, exact_support=exact_support, normalize=normalize,  # type: ignore[arg-type]
                tolerance=tolerance, progress=report.update if long_call else None,
            )  # fmt: skip
    except InputError as err:
        # The library's advice names keywords; here the same choices are flags.
        advice = str(err).replace("tolerance", "--tolerance")
        advice = advice.replace("pass normalize=True", "pass --normalize (normalize=True in Python)")
        raise InputError(advice.replace("key axis dim=", "key axis --dim ")) from err
    summary = summarize(cert, seconds=time.perf_counter() - start)
    summary["kernel_load_seconds"] = load_seconds
    if summary["rows"] > 0:
        summary["short_rows_not_exact"] = short_rows_not_exact(p, dim, cert)
    summary.update(
        file=str(file), key=key, dim=dim, precision=precision, exact_support=exact_support, shape=list(p.shape)
    )
    if out is not None:
        with writing(out):
            write_rows(cert, out, summary)
        summary["out"] = str(out)
    if as_json:
        print_json(summary)
    else:
        print_summary(summary)


def load_tensor(path: Path, key: str | None) -> torch.Tensor:
    """The tensor stored in ``path`` (``key`` selects one of several); FileFormatError if there is none."""
    import pickle
    import warnings

    import numpy as np
    import torch

    if not path.is_file():
        raise FileFormatError(f"{path} does not exist or is not a file; pass the path of a saved tensor")
    if path.suffix not in SUFFIXES:
        raise FileFormatError(f"{path} has suffix {path.suffix!r}; save the tensor as one of {', '.join(SUFFIXES)}")
    try:
        if path.suffix == ".npy":
            loaded: Any = torch.from_numpy(np.load(path, allow_pickle=False))
        elif path.suffix == ".safetensors":
            from safetensors.torch import load_file

            loaded = load_file(str(path))
        else:
            with warnings.catch_warnings():  # torch warns of a file's pickle protocol before refusing it
                warnings.simplefilter("ignore")
                loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise FileFormatError(
            f"{path} holds pickled Python objects, which attnsens does not run (torch.load weights_only=True); "
            "save tensors only: torch.save(tensor) or a dict of tensors, or a .safetensors file"
        ) from err
    except Exception as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise FileFormatError(f"cannot read {path} ({type(err).__name__}: {reason}); is it a saved tensor?") from err
    if isinstance(loaded, dict | list | tuple):
        tensors = nested_tensors(loaded)
        if not tensors:
            kind = type(loaded).__name__
            raise FileFormatError(
                f"{path} holds a {kind} with no tensor in it, at any depth; save the attention tensor itself "
                "or a dict of tensors"
            )
        if key is None and len(tensors) == 1:
            key = next(iter(tensors))
        if key not in tensors:
            names = sorted(tensors)
            shown = str(names) if len(names) <= 12 else f"{str(names[:12])[:-1]}, … and {len(names) - 12} more]"
            deep = sorted(name for name in names if name not in _top_level_names(loaded))
            if key is not None:
                which = f"it has no tensor {key!r}: choose one of them"
            elif len(deep) == len(names):
                which = f"choose one with --key and its dotted path, e.g. --key {deep[0]}"
            elif deep:
                which = f"choose one with --key NAME (a nested one by its dotted path, e.g. --key {deep[0]})"
            else:
                which = "choose one with --key NAME"
            held = "no tensor at its top level, only nested ones:" if len(deep) == len(names) else "tensors"
            raise FileFormatError(f"{path} holds {held} {shown}; {which}")
        loaded = tensors[key]
    elif key is not None:
        raise FileFormatError(f"{path} holds a single tensor, not a named collection; drop --key {key}")
    if not isinstance(loaded, torch.Tensor):
        raise FileFormatError(f"{path} holds a {type(loaded).__name__}, not a tensor; save a torch tensor or array")
    if loaded.layout != torch.strided:
        raise FileFormatError(
            f"{path} holds a {str(loaded.layout).removeprefix('torch.')} tensor; save it dense (tensor.to_dense())"
        )
    return loaded


def nested_tensors(container: Any, prefix: str = "") -> dict[str, Any]:
    """Every tensor in a dict, list or tuple, at any depth, by its dotted path (``layer0.attn``, ``attentions.3``);
    a top-level name wins over a nested path spelled the same."""
    import torch

    found: dict[str, Any] = {}
    items = container.items() if isinstance(container, dict) else enumerate(container)
    nested: list[tuple[str, Any]] = []
    for name, value in items:
        path = f"{prefix}{name}"
        if isinstance(value, torch.Tensor):
            found[path] = value
        elif isinstance(value, dict | list | tuple):
            nested.append((path, value))
    for path, value in nested:
        for name, tensor in nested_tensors(value, f"{path}.").items():
            found.setdefault(name, tensor)
    return found


def _top_level_names(container: Any) -> set[str]:
    return {str(name) for name in (container.keys() if isinstance(container, dict) else range(len(container)))}


def _check_key_axis(p: torch.Tensor, dim: int, tolerance: float | None, file: Path) -> None:
    """Refuse rows along ``dim`` that do not sum to 1 when those along another axis do (the wrong --dim)."""
    import torch

    from attnsens.theta.certificate import default_sum_tolerance

    # certify names what is wrong with the others; a tensor of no rows has nothing to check
    if p.ndim < 2 or p.numel() == 0 or not p.dtype.is_floating_point or not -p.ndim <= dim < p.ndim:
        return
    if not bool(p.isfinite().all()):
        return
    limit = default_sum_tolerance(p.dtype) if tolerance is None else tolerance
    wide = p.to(torch.float64)
    off = float((wide.sum(dim) - 1).abs().max())
    if off <= limit:
        return
    for axis in range(p.ndim):
        if axis != dim % p.ndim and float((wide.sum(axis) - 1).abs().max()) <= limit:
            raise InputError(
                f"the rows of {file} along --dim {dim} do not sum to 1 (off by up to {off:.3g}), those along axis "
                f"{axis} do; pass --dim {axis} (or --normalize to certify renormalised rows along --dim {dim})"
            )


WARM_UP_ROWS = 64
"""Rows of the block certified before the timed call: as many select the thread-pool kernels (``PARALLEL_MIN_ROWS``)."""


def _load_kernels(p: torch.Tensor, dim: int, precision: str) -> None:
    """Certify a block of uniform rows shaped and typed like the rows of ``p`` (at most ``WARM_UP_ROWS``), so that
    loading (or, the first time, compiling) the kernels is not counted in the certificate's seconds."""
    import torch

    from attnsens.errors import AttnsensError
    from attnsens.theta import certify
    from attnsens.theta.certificate import MAX_TOLERANCE

    if p.dim() == 0 or not -p.dim() <= dim < p.dim() or not p.is_floating_point():
        return  # certify names the problem
    n_keys = p.shape[dim]
    n_rows = min(WARM_UP_ROWS, p.numel() // max(n_keys, 1))
    if n_keys == 0 or n_rows == 0:
        return
    uniform = torch.full((n_rows, n_keys), 1.0 / n_keys, dtype=p.dtype, device=p.device)
    with contextlib.suppress(AttnsensError):  # e.g. 1/n rounded in float16 beyond the sum tolerance: not the file's
        certify(uniform, precision=precision, tolerance=MAX_TOLERANCE)  # type: ignore[arg-type]


def summarize(cert: ThetaCertificate, *, seconds: float) -> dict[str, Any]:
    """Rows, exact and dominant fractions, quantiles of the lower bound, widest interval, methods used."""
    import torch

    from attnsens.theta import ThetaMethod

    lower = cert.lower.flatten().cpu()
    n_rows = lower.numel()
    if n_rows == 0:
        return {"rows": 0, "seconds": seconds}
    quantiles = torch.quantile(lower, torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64))
    counts = torch.bincount(cert.method.flatten().cpu().long(), minlength=len(ThetaMethod) + 1)
    return {
        "rows": n_rows,
        "exact_fraction": float(cert.exact.float().mean()),
        "dominant_fraction": float(cert.dominant.float().mean()),
        "theta_lower_bound": {
            "min": float(lower.min()),
            **{f"q{int(q * 100)}": float(v) for q, v in zip((0.1, 0.25, 0.5, 0.75, 0.9), quantiles, strict=True)},
            "max": float(lower.max()),
        },
        "max_width": float(cert.width.max()),
        "width_at_most_2^-25_fraction": float((cert.width <= 2.0**-25).float().mean()),
        "methods": {m.name: int(counts[m.value]) for m in ThetaMethod if int(counts[m.value]) > 0},
        "seconds": seconds,
    }


def short_rows_not_exact(p: torch.Tensor, dim: int, cert: ThetaCertificate) -> int:
    """How many rows of at most ``EXACT_SUPPORT_MAX`` (48) non-zero keys the certificate leaves unproved: the rows
    ``--exact-support 48`` would prove exact (docs/theta-algorithms.md §5)."""
    from attnsens.theta.certificate import EXACT_SUPPORT_MAX

    open_rows = ~cert.exact
    if not bool(open_rows.any()):
        return 0
    support = (p != 0).sum(dim).to(open_rows.device)
    return int((open_rows & (support <= EXACT_SUPPORT_MAX)).sum())


PROGRESS_MIN_ELEMENTS = 1 << 26
"""Tensors of at least this many entries (256 MiB of float32, about a second to certify on two cores) show the
certificate's progress, as do calls with ``--exact-support`` from ``ENUMERATION_NOTE_SUPPORT`` on."""

ENUMERATION_NOTE_SUPPORT = 33
"""--exact-support at or above this prints how many rows it may enumerate: from 33 keys on, one enumeration takes
up to milliseconds, and from 41 keys up to tens or hundreds of milliseconds (real rows of 45–48 keys, one core: a
median of 7 ms on SmolLM2's, 42 ms on the tiny GPT's near-uniform ones, at most about 0.25 s)."""


def _note_enumeration(p: torch.Tensor, dim: int, exact_support: int) -> None:
    """One line on stderr: how many rows --exact-support may enumerate at a cost of milliseconds or more each."""
    from attnsens.cli.app import error_console
    from attnsens.theta.certificate import EXACT_SUPPORT_MAX

    if not ENUMERATION_NOTE_SUPPORT <= exact_support <= EXACT_SUPPORT_MAX:  # below: cheap; above: refused
        return
    if p.dim() == 0 or not -p.dim() <= dim < p.dim():
        return
    support = (p != 0).sum(dim)
    count = int(((support >= ENUMERATION_NOTE_SUPPORT) & (support <= exact_support)).sum())
    if count:
        error_console.print(
            f"note: {count:,} rows have {ENUMERATION_NOTE_SUPPORT}–{exact_support} non-zero keys; --exact-support "
            f"enumerates those that no cheaper proof settles (up to milliseconds each, ~0.25 s at 48 keys)",
            soft_wrap=True,
        )


def write_rows(cert: ThetaCertificate, out: Path, summary: dict[str, Any]) -> None:
    """One Parquet row per attention row, written atomically, with the audit rows table's names and encoding.

    Columns are ``ThetaCertificate.to_pandas()``: the row's index along each leading axis (batch, head, query for
    up to three; axis_0, … beyond), theta_lower, theta_upper, theta_exact, theta_method (the int8 ``ThetaMethod``
    code), row_sum, p_max, dominant; every column the rows table also has gets that table's Arrow type, so a theta
    file and an audit's rows read and join alike. The metadata names the method codes.
    """
    import pyarrow as pa

    from attnsens.store.parquet import write_parquet
    from attnsens.store.schema import get_schema
    from attnsens.theta import ThetaMethod

    table = pa.Table.from_pandas(cert.to_pandas(), preserve_index=False)
    rows_types = {column.name: column.dtype for column in get_schema("rows").columns}
    fields = [pa.field(name, rows_types.get(name, table.schema.field(name).type)) for name in table.column_names]
    meta = {k: summary[k] for k in ("file", "key", "dim", "precision", "exact_support", "shape")}
    meta["theta_method_codes"] = {str(method.value): method.name for method in ThetaMethod}
    write_parquet(table.cast(pa.schema(fields)), out, metadata=meta)


def print_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"θ certificates — {summary['file']} {tuple(summary['shape'])}, key axis {summary['dim']}")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    table.add_row("rows", f"{summary['rows']:,}")
    reasons: set[str | None] = set()
    if summary["rows"] > 0:
        table.add_row("exact fraction", f"{summary['exact_fraction']:.4f}")
        table.add_row("dominant-atom fraction", f"{summary['dominant_fraction']:.4f}")
        for name, value in summary["theta_lower_bound"].items():
            # format_float: the digits that separate a bound from 1 (or from 0: −2.2e-16, not −0.00000000)
            text, reason = format_theta_lower(value)
            reasons.add(reason)
            table.add_row(f"θ lower bound {name}", text)
        table.add_row("max interval width", f"{summary['max_width']:.3g}")
        table.add_row("width ≤ 2^-25 fraction", f"{summary['width_at_most_2^-25_fraction']:.4f}")
        table.add_row("methods", ", ".join(f"{k}: {v:,}" for k, v in summary["methods"].items()))
        if summary.get("short_rows_not_exact"):
            from attnsens.theta.certificate import EXACT_SUPPORT_MAX

            table.add_row(
                f"rows of ≤ {EXACT_SUPPORT_MAX} keys not proved exact",
                f"{summary['short_rows_not_exact']:,} (--exact-support {EXACT_SUPPORT_MAX} proves them)",
            )
    table.add_row("seconds", f"{summary['seconds']:.3f}")
    if "kernel_load_seconds" in summary:
        table.add_row("seconds to load the kernels, before", f"{summary['kernel_load_seconds']:.3f}")
    console.print(table)
    footnote = theta_footnote(reasons)
    if footnote is not None:
        console.print(footnote, soft_wrap=True)
    if "out" in summary:
        console.print(f"per-row results written to {summary['out']}")
