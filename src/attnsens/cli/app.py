"""The ``attnsens`` typer application and the pieces every command shares.

Commands live one per module in this package and call the Python API; heavy imports happen inside the
command functions so that ``attnsens --help`` stays fast.
"""

from __future__ import annotations

import decimal
import functools
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from typer import _click as click
from typer.core import TyperArgument, TyperCommand, TyperGroup

from attnsens.errors import AttnsensError

EXPLICIT_FLAG_VALUES = {"true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}
"""Values a user may write after an on/off flag, as Hugging Face's argument parser accepts them (``--fp16 True``)."""


def explicit_flag_values(command: click.Command, args: list[str]) -> list[str]:
    """``args`` with ``--flag true`` / ``--flag=false`` (any case, see ``EXPLICIT_FLAG_VALUES``) written as the flag
    alone or left out, for every on/off flag of ``command``; ``--flag/--no-flag`` pairs take the ``--no-`` form.

    >>> from typer.main import get_command
    >>> demo = typer.Typer()
    >>> @demo.command()
    ... def run(path: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None: ...
    >>> explicit_flag_values(get_command(demo), ["x.npy", "--json", "True", "--json=no"])
    ['x.npy', '--json']
    """
    flags = {}
    for param in command.params:
        if getattr(param, "is_bool_flag", False):
            on, off = list(param.opts), list(param.secondary_opts)
            for name in on:
                flags[name] = (name, off[0] if off else None)
            for name in off:
                flags[name] = (name, on[0] if on else None)
    out: list[str] = []
    pending = list(args)
    while pending:
        arg = pending.pop(0)
        if arg == "--":
            return [*out, arg, *pending]
        name, equals, value = arg.partition("=")
        if name in flags and not equals and pending and pending[0].lower() in EXPLICIT_FLAG_VALUES:
            value, equals = pending.pop(0), "="
        if name in flags and equals and value.lower() in EXPLICIT_FLAG_VALUES:
            same, opposite = flags[name]
            if EXPLICIT_FLAG_VALUES[value.lower()]:
                out.append(same)
            elif opposite is not None:
                out.append(opposite)
            continue
        out.append(arg)
    return out


class _AttnsensHelp:
    """Help as attnsens writes it: arguments in the usage line as MODEL / [OUT] (typer writes ``{model}``, which a
    shell reads as a brace expansion), and ``--help`` without a ``<bool>`` value."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []  # type: ignore[attr-defined]
        for param in self.get_params(ctx):  # type: ignore[attr-defined]
            if isinstance(param, TyperArgument):
                name = (param.metavar or param.name or "").upper()
                name = name if param.required else f"[{name}]"
                pieces.append(name + ("..." if param.nargs != 1 else ""))
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


class AttnsensCommand(_AttnsensHelp, TyperCommand):
    """Every ``attnsens`` command: the help above, and on/off flags that also take an explicit true/false."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, explicit_flag_values(self, args))


class AttnsensGroup(_AttnsensHelp, TyperGroup):
    """The ``attnsens`` group, with its commands' help."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), self.subcommand_metavar]


class _Typer(typer.Typer):
    """A typer application whose commands are ``AttnsensCommand``s."""

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", AttnsensCommand)
        return super().command(*args, **kwargs)


app = _Typer(
    cls=AttnsensGroup,
    name="attnsens",
    help="Certified attention sensitivity: θ(p) certificates, bounds, audits, studies and influence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(requested: bool) -> None:
    if requested:
        import attnsens

        sys.stdout.write(f"attnsens {attnsens.__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, metavar="", help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Certified attention sensitivity: θ(p) certificates, bounds, audits, studies and influence."""


# Markup off: paths, model names and messages are printed literally (a path may contain "[/]"); styled
# pieces are built as rich Text.
console = Console(markup=False, highlight=False)
error_console = Console(stderr=True, markup=False, highlight=False)


def console_note(message: str) -> None:
    """``note: message`` on stderr: the ``note`` callback commands give the Python API."""
    error_console.print(f"note: {message}", soft_wrap=True)


def silent_note(message: str) -> None:
    """A ``note`` callback that prints nothing: with --json, a command prints no notes."""


def flag(*names: str, help: str) -> Any:
    """An on/off option shown without a value in the help (typer would print ``<bool>`` after it, which reads as
    if ``--json true`` were accepted)."""
    return typer.Option(*names, help=help, metavar="")


# Options defined once and reused by every command that takes them.
JsonOption = Annotated[bool, flag("--json", help="Print machine-readable JSON instead of tables.")]
OutDirOption = Annotated[Path, typer.Option("--out", help="Directory to write results into.")]
ForceOption = Annotated[
    bool, flag("--force", help="Read a run folder that fails its manifest check (the problems are listed).")
]
ModelArgument = Annotated[
    str,
    typer.Argument(
        help="Model: alias (smollm2, minilm, builtin:lnfree), a run, checkpoint or study folder written by "
        "attnsens train/study, a local path, .gguf file or hub id."
    ),
]
PlacementOption = Annotated[
    str | None,
    typer.Option("--placement", help="Block placement of a study's run (pre, post, ...) when it trained several."),
]
StepOption = Annotated[
    int | None,
    typer.Option("--step", min=0, help="Checkpoint step of a training run or study (default: the last one)."),
]
DeviceMapOption = Annotated[
    str | None,
    typer.Option(
        "--device-map",
        help="Spread a model larger than one device over the GPUs, the CPU and the disk (accelerate's big-model "
        "loading): auto, balanced, sequential, or MODULE=DEVICE pairs separated by commas (a device: cpu, disk, "
        "N or cuda:N). Weights sent to disk are read when their layer runs (docs/scale.md).",
    ),
]
OffloadOption = Annotated[
    Path | None,
    typer.Option(
        "--offload-folder",
        help="Where weights offloaded to disk are kept (default: a folder inside --out, removed at the end).",
    ),
]

F = TypeVar("F", bound=Callable[..., Any])


def domain_errors_exit(func: F) -> F:
    """Turn an AttnsensError into one red line on stderr and exit code 1 (no traceback).

    A file-system error that no command turned into an AttnsensError (a full disk, a vanished folder) is
    reported the same way, naming the file.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AttnsensError as err:
            print_error(str(err))
            raise typer.Exit(code=1) from err
        except OSError as err:
            where = f" ({err.filename})" if err.filename else ""
            print_error(f"{err.strerror or err}{where}; check the path, its permissions and the free space")
            raise typer.Exit(code=1) from err
        except (MemoryError, RuntimeError) as err:
            message = out_of_memory_message(err, LESS_MEMORY.get(func.__name__, "smaller inputs"))
            if message is None:
                raise
            print_error(message)
            raise typer.Exit(code=1) from err

    return wrapper  # type: ignore[return-value]


LESS_MEMORY = {
    "audit": "a shorter --seq-len or a smaller --max-memory",
    "bounds": "a shorter --seq-len",
    "influence": "shorter --lengths or fewer --samples",
    "train": "a smaller --batch-size or --config",
    "study": "a smaller --batch-size or --config",
    "theta": "a smaller tensor, or fewer rows a file",
}
"""What each command can be given to hold less at once, named when an allocation fails."""

_ALLOCATION = re.compile(r"tried to allocate (\d+) bytes|Tried to allocate ([\d.]+ [KMGT]?i?B)")


def out_of_memory_message(err: BaseException, less: str) -> str | None:
    """One line for an allocation that failed (torch's CPU or CUDA allocator, or Python's MemoryError) naming its
    size where the error does and ``less``, what to give the command instead; None for any other error.

    >>> torch_error = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 34359738368 "
    ...                            "bytes. Error code 12 (Cannot allocate memory)")
    >>> out_of_memory_message(torch_error, "a shorter --seq-len")
    'out of memory: one allocation of 32 GiB failed; give the command less to hold at once: a shorter --seq-len'
    >>> out_of_memory_message(RuntimeError("shapes cannot be multiplied"), "a shorter --seq-len") is None
    True
    """
    text = str(err)
    if not (
        isinstance(err, MemoryError)
        or type(err).__name__ == "OutOfMemoryError"
        or "can't allocate memory" in text
        or "out of memory" in text.lower()
    ):
        return None
    found = _ALLOCATION.search(text)
    size = ""
    if found and found.group(1):
        size = f" one allocation of {int(found.group(1)) / 2**30:.3g} GiB failed;"
    elif found:
        size = f" one allocation of {found.group(2)} failed;"
    return f"out of memory:{size} give the command less to hold at once: {less}"


def print_error(message: str) -> None:
    """One red ``error:`` line on stderr; ``message`` is printed literally."""
    from rich.text import Text

    error_console.print(Text.assemble(("error:", "bold red"), " ", message.replace("\n", " ")), soft_wrap=True)


def warn_unverified(check: Any) -> None:
    """One yellow line on stderr when a forced read goes ahead on a folder that failed its check or has no
    manifest to check against."""
    from rich.text import Text

    if check is None or (check.ok and check.has_manifest):
        return
    if check.ok:
        message = f"read with --force: {str(check.run_dir)!r} has no manifest.json; its files are not verified"
    else:
        message = f"read with --force: {check.problem_list()}"
    error_console.print(Text.assemble(("warning:", "bold yellow"), " ", message), soft_wrap=True)


def print_json(payload: Any) -> None:
    """Write ``payload`` as strict JSON on stdout (NaN and ±Inf become null; no rich markup, safe to pipe)."""
    sys.stdout.write(json.dumps(jsonable(payload), indent=2, allow_nan=False) + "\n")


def jsonable(value: Any) -> Any:
    """``value`` with numpy/torch scalars and arrays, paths and non-finite floats made JSON-ready (NaN → None).

    >>> jsonable({"x": float("nan"), "y": [1.5, float("inf")]})
    {'x': None, 'y': [1.5, None]}
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str | bool | int) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    if hasattr(value, "item"):
        return jsonable(value.item())
    if str(value) in ("NaT", "<NA>"):  # pandas' missing values
        return None
    if hasattr(value, "isoformat"):  # dates and times (query results)
        return value.isoformat()
    if isinstance(value, decimal.Decimal):  # DuckDB DECIMAL
        return jsonable(float(value))
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


def format_float(value: float, *, wide: bool = False) -> str:
    """6 significant digits, plus those that separate ``value`` from its nearest integer; all of them if ``wide``.

    >>> format_float(0.12345678), format_float(0.99999987), format_float(1.0), format_float(0.99999987, wide=True)
    ('0.123457', '0.99999987', '1', '0.99999987')
    """
    if wide or not math.isfinite(value):
        return repr(value)
    distance = abs(value - round(value))
    digits = 6
    if 0 < distance < 1e-5 * max(1.0, abs(value)):
        whole = len(str(abs(round(value))))
        digits = whole + 3 + math.ceil(-math.log10(distance))
        if digits >= 16:  # beyond float64's resolution: the shortest text that reads back as the value
            return repr(value)
    return f"{value:.{digits}g}"


THETA_MARK = "†"


def format_theta_lower(value: float) -> tuple[str, str | None]:
    """A θ lower bound for a table, kept within θ's range [0, 1] or marked: (text, None), or (text + " †", why)
    where ``why`` ("above 1" or "below 0") selects the footnote (``theta_footnote``).

    A bound above 1 is shown as 1, which is still a lower bound; one below 0 is shown as it is, as lifting it to 0
    could exceed the θ of the stored row it bounds.

    >>> format_theta_lower(0.99999987), format_theta_lower(1.00000008)
    (('0.99999987', None), ('1 †', 'above 1'))
    """
    if value > 1.0:
        return f"{format_float(1.0)} {THETA_MARK}", "above 1"
    if value < 0.0:
        return f"{format_float(value)} {THETA_MARK}", "below 0"
    return format_float(value), None


def theta_footnote(reasons: set[str | None]) -> str | None:
    """The note under a table whose θ lower bounds ``format_theta_lower`` marked, or None."""
    shown = []
    if "above 1" in reasons:
        shown.append("lower bounds above 1 are shown as 1, still lower bounds")
    if "below 0" in reasons:
        shown.append("those below 0 as they are")
    if not shown:
        return None
    return (
        f"{THETA_MARK} θ of a probability row lies in [0, 1]; these bounds are certified for the rows as stored, "
        "whose float sums can exceed 1 by rounding, and θ of a row of sum s > 1 can reach s or fall below 0: "
        f"{'; '.join(shown)}. --json and the Parquet files keep the certified values."
    )
