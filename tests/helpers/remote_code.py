"""The loading calls of attnsens that leave out ``trust_remote_code``."""

from __future__ import annotations

import ast
from pathlib import Path

import attnsens

SOURCE = Path(attnsens.__file__).parent

# transformers' entry points that may import a repository's code (``auto_map``), and attnsens' own wrapper of them.
LOADERS = {"from_pretrained", "_from_pretrained", "pipeline", "get_class_from_dynamic_module"}


def _calls_without_the_keyword() -> list[str]:
    missing = []
    for file in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in LOADERS and not any(k.arg == "trust_remote_code" for k in node.keywords):
                missing.append(f"{file.relative_to(SOURCE)}:{node.lineno} {name}")
    return missing
