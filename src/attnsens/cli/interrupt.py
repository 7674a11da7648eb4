"""SIGINT and SIGTERM end a long command with one line saying how to go on, not a traceback or silence.

A command decorated with :func:`on_interrupt` turns SIGTERM into an exception for its duration (Python's default
ends the process at once), so that both signals unwind the same way Ctrl-C does: the writes under way remove their
temporary files, the writer lock is released, and the finished units stay where they are. The command then prints
one line — what the signal was and how to rerun it — and exits with 128 + the signal's number, as a shell reports a
process ended by that signal.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import signal
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])

chosen_out: ContextVar[Path | None] = ContextVar("chosen_out", default=None)
"""The folder a command chose for its results when it was given no ``--out`` (named in the rerun advice)."""


class Terminated(BaseException):
    """SIGTERM, raised where the process was when it arrived (a BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` swallows it)."""


def on_interrupt(advice: Callable[[dict[str, Any]], str]) -> Callable[[F], F]:
    """Decorator: on SIGINT or SIGTERM the command prints ``interrupted: SIG…; <advice>`` on stderr and exits with
    128 + the signal number. ``advice`` gets the command's arguments by name."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            token = chosen_out.set(None)
            try:
                with _terminate_raises():
                    return func(*args, **kwargs)
            except (KeyboardInterrupt, Terminated) as err:
                number = signal.SIGTERM if isinstance(err, Terminated) else signal.SIGINT
                arguments = dict(signature.bind(*args, **kwargs).arguments)
                _say(f"{number.name}; {advice(arguments)}")
                raise typer.Exit(code=128 + int(number)) from None
            finally:
                chosen_out.reset(token)

        # What a test of the wiring looks for.
        wrapper.resume_advice = advice  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


@contextlib.contextmanager
def _terminate_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread while the block runs, unless someone else set a handler
    (the previous one is restored afterwards)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _say(message: str) -> None:
    from rich.text import Text

    from attnsens.cli.app import error_console

    error_console.print(Text.assemble(("interrupted:", "bold yellow"), " ", message), soft_wrap=True)


def rerun_to_resume(arguments: dict[str, Any]) -> str:
    """The advice of a command that resumes from the units it finished (audit, study)."""
    out = arguments.get("out")
    if out is None and chosen_out.get() is not None:
        return f"rerun the command with --out {chosen_out.get()} to resume from what it finished there"
    where = f" in {out}" if out is not None else ""
    return f"what was finished is kept{where}; rerun the same command to resume"


def rerun_training(arguments: dict[str, Any]) -> str:
    """The advice of ``attnsens train``: it continues from its last checkpoint with ``--resume``."""
    if arguments.get("resume"):
        return f"rerun the same command to resume from the last checkpoint in {arguments.get('out')}"
    return f"rerun the command with --resume to continue from the last checkpoint in {arguments.get('out')}"


def rerun_bounds(arguments: dict[str, Any]) -> str:
    """The advice of ``attnsens bounds``: it writes its one file at the end, so a rerun starts over."""
    kept = "; nothing was written to --out" if arguments.get("out") is not None else ""
    return f"bounds keep no partial results{kept}; rerun the same command to compute them again"
