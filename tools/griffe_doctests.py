"""A griffe extension of the documentation site (mkdocs.yml): docstrings' doctests render as code, and an item
that names several parameters renders under all their names.

attnsens' docstrings carry doctests (``>>> certify(...)`` and the value it prints) in the running text, as pytest's
``--doctest-modules`` reads them. Markdown would render the ``>>>`` lines as nested quotes; this fences each run of
prompt lines, with the output lines that follow it, as a ``pycon`` block.

An Args or Attributes item may describe several names at once (``lower, upper: float64 bounds …``); the Google
parser would read ``upper`` as the type of ``lower,``, so the names are joined without spaces (``lower,upper``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

SHARED_ITEM = re.compile(r"^(?P<indent>\s+)(?P<names>[A-Za-z_]\w*(?:, [A-Za-z_]\w*)+):(?=\s)", re.MULTILINE)


def join_shared_items(text: str) -> str:
    """``a, b: …`` item lines written as ``a,b: …``."""
    return SHARED_ITEM.sub(lambda m: f"{m['indent']}{m['names'].replace(', ', ',')}:", text)


def fence_doctests(text: str) -> str:
    lines = text.splitlines()
    out: list[str] = []
    k = 0
    while k < len(lines):
        stripped = lines[k].lstrip()
        if not stripped.startswith(">>>"):
            out.append(lines[k])
            k += 1
            continue
        indent = lines[k][: len(lines[k]) - len(stripped)]
        block: list[str] = []
        while k < len(lines) and lines[k].strip() and lines[k].startswith(indent):
            block.append(lines[k][len(indent) :])
            k += 1
        if out and out[-1].strip():
            out.append("")
        out += [f"{indent}```pycon", *(indent + line for line in block), f"{indent}```"]
        if k < len(lines) and lines[k].strip():
            out.append("")
    return "\n".join(out)


class FenceDoctests(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is None:
            return
        if ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
        obj.docstring.value = join_shared_items(obj.docstring.value)
