"""Progress of long commands: a rich bar on a terminal, plain timestamped lines otherwise (logs, CI, pipes).

Both go to stderr, so ``--json`` output on stdout stays parseable. Without a terminal a line is printed for the
first update, then at most every ``interval`` seconds, and for the last one.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from rich.console import Console


def format_duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s`` or ``2 h 07 min``.

    >>> format_duration(185)
    '3 min 05 s'
    """
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class ProgressReport:
    """``with ProgressReport("bounds", "layers") as report: report.update(done, total, detail)``."""

    def __init__(
        self, label: str, unit: str, *, console: Console | None = None, enabled: bool = True, interval: float = 5.0
    ) -> None:
        self.label, self.unit, self.enabled, self.interval = label, unit, enabled, interval
        self.console = console or Console(stderr=True, markup=False, highlight=False)
        self._bar: Any = None
        self._task: Any = None
        self._started = time.perf_counter()
        self._last_line: float | None = None
        self._baseline = 0

    def __enter__(self) -> ProgressReport:
        self.restart(0)
        if self.enabled and self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[detail]}", markup=False),
                console=self.console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=None, detail="")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def restart(self, done: int) -> None:
        """Count ETA and rates from now, ``done`` units being finished already (a resumed run)."""
        self._started, self._baseline = time.perf_counter(), done
        if self._bar is not None:
            self._bar.reset(self._task, completed=done)

    def update(self, done: int, total: int | None = None, detail: str = "") -> None:
        """``done`` of ``total`` units finished; ``detail`` (e.g. ``loss 4.21``) is shown beside the count."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total, detail=detail, description=self.label)
            return
        now = time.perf_counter()
        finished = total is not None and done >= total
        if self._last_line is not None and now - self._last_line < self.interval and not finished:
            return
        self._last_line = now
        elapsed = now - self._started
        parts = [f"{self.label}: {done}" + (f"/{total}" if total is not None else "") + f" {self.unit}"]
        parts.append(f"{format_duration(elapsed)} elapsed")
        if total is not None and self._baseline < done < total:
            parts.append(f"ETA {format_duration(elapsed * (total - done) / (done - self._baseline))}")
        if detail:
            parts.append(detail)
        self.console.print(", ".join(parts), soft_wrap=True)
