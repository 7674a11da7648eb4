"""A griffe extension of the documentation site (mkdocs.yml): docstrings' doctests render as code.

attnsens' docstrings carry doctests (``>>> certify(...)`` and the value it prints) in the running text, as pytest's
``--doctest-modules`` reads them. Markdown would render the ``>>>`` lines as nested quotes; this fences each run of
prompt lines, with the output lines that follow it, as a ``pycon`` block.
"""

from __future__ import annotations

from typing import Any

import griffe


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
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
