"""Which modules an import pulls in, measured in a fresh interpreter (the import rule of
docs/architecture.md, "Layers and import direction")."""

from __future__ import annotations

import json
import subprocess
import sys


def modules_loaded_by(modules: str, watched: tuple[str, ...]) -> list[str]:
    """The names in ``watched`` present in ``sys.modules`` after ``import <modules>`` in a new Python process."""
    code = f"import json, sys, {modules}\nprint(json.dumps([m for m in {watched!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)
