"""The one way every bench/ script keeps its figures: one JSON line per run, appended to bench/results/*.jsonl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` to ``path`` as one JSON line (parent folders created; values JSON lacks written as str)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(record, default=str) + "\n")
