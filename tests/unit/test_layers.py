"""One-way layers: no module of attnsens imports from a layer above its own.

The order is docs/architecture.md, "Layers and import direction". Imports are read from the source with ``ast``,
so function-level imports (the lazy ones that keep ``import attnsens`` cheap) and ``TYPE_CHECKING`` imports count
as much as module-level ones, and so do ``"attnsens.package.module:name"`` strings, which registries such as
``models.loading.ALIASES`` import on first use.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import attnsens

SOURCE = Path(attnsens.__file__).parent

LAYERS: tuple[tuple[str, ...], ...] = (
    ("attnsens", "errors", "provenance", "_threads", "_memory", "_numba_cache", "_encoding", "seeding"),  # foundation
    ("theta",),  # θ kernels
    ("_rounding",),  # directed rounding of the certified bounds
    ("weights",),  # the normalized weights: what adapters produce and bounds consume
    ("geometry",),  # norms, Jacobians, bounds
    ("store",),  # table schemas, Parquet, manifests
    ("train",),  # attnsens' own GPT, its data, trainer and checkpoints
    ("models",),  # adapters over transformers models and the own GPT
    ("capture",),  # row statistics while a model runs
    ("influence",),  # inverse-length influence
    ("report",),  # figures, findings, HTML
    ("study", "warmup"),  # pipelines; compiling every kernel ahead
    ("cli", "__main__"),  # commands
)
"""Lowest first; a module may import from its own layer and the layers before it. ``attnsens`` is the root
package (its subpackages load lazily, by name)."""

LAYER_OF = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}

_REFERENCE = re.compile(r"attnsens(?:\.\w+)+:\w+")
"""A ``"module:attribute"`` string naming something of attnsens to import later."""


@dataclass(frozen=True)
class Edge:
    """``source`` (a module of attnsens) imports ``target`` at ``line``."""

    source: str
    target: str
    line: int

    def describe(self) -> str:
        return f"{self.source}:{self.line} imports {self.target} ({unit_of(self.source)} → {unit_of(self.target)})"


def unit_of(module: str) -> str:
    """The layer unit of a dotted module name: its subpackage or top-level module, ``attnsens`` for the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, *, is_package: bool = False) -> list[tuple[str, int]]:
    """Every attnsens module that ``source`` (the text of ``module``) imports, anywhere in it, with the line."""
    found: list[tuple[str, int]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from attnsens import geometry` imports the subpackage, `from attnsens import __version__` the root.
            names = [f"{base}.{alias.name}" for alias in node.names] if base == "attnsens" else [base]
            found += [(name, node.lineno) for name in names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _REFERENCE.fullmatch(node.value):
            found.append((node.value.partition(":")[0], node.lineno))
    return [(name, line) for name, line in found if name == "attnsens" or name.startswith("attnsens.")]


def _resolve(target: str) -> str:
    """``attnsens.__version__`` (a name imported from the root) is the root package itself."""
    if target.count(".") == 1 and unit_of(target) not in LAYER_OF:
        return "attnsens"
    return target


def back_edges(modules: dict[str, str], packages: frozenset[str] = frozenset()) -> list[Edge]:
    """The imports among ``modules`` (dotted name → source) that go from a lower layer up to a higher one."""
    edges = []
    for module, source in sorted(modules.items()):
        for target, line in imported_modules(source, module, is_package=module in packages):
            target = _resolve(target)
            if LAYER_OF[unit_of(target)] > LAYER_OF[unit_of(module)]:
                edges.append(Edge(module, target, line))
    return edges


def package_sources() -> tuple[dict[str, str], frozenset[str]]:
    paths = sorted(SOURCE.rglob("*.py"))
    modules = {module_name(path): path.read_text(encoding="utf-8") for path in paths}
    return modules, frozenset(module_name(p) for p in paths if p.name == "__init__.py")


def test_every_package_and_module_has_a_layer() -> None:
    modules, _ = package_sources()
    missing = sorted({unit_of(module) for module in modules} - set(LAYER_OF))
    assert not missing, f"add {missing} to LAYERS (and to docs/architecture.md, 'Layers and import direction')"


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    edges = back_edges(*package_sources())
    assert not edges, "back-edges:\n" + "\n".join(edge.describe() for edge in edges)


@pytest.mark.parametrize(
    "source",
    [
        "from attnsens.cli.app import app\n",
        "import attnsens.study.audit\n",
        "def lazy():\n    from attnsens.report import build_report\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from attnsens.store import Manifest\n",
        "from attnsens import models\n",
        "from ..models import load\n",
        'LOADERS = {"x": "attnsens.influence.measure:measure"}\n',
    ],
)
def test_a_back_edge_is_found_in_every_form(source: str) -> None:
    edges = back_edges({"attnsens.geometry.probe": source})
    assert len(edges) == 1 and edges[0].line >= 1, edges


def test_imports_from_below_and_from_outside_are_allowed() -> None:
    source = (
        "import torch\nfrom attnsens.errors import ConfigError\nfrom attnsens import __version__\n"
        "from attnsens.theta import certify\nfrom . import norms\n"
        "NOTE = 'attnsens.models is loaded later'\n"
    )
    assert back_edges({"attnsens.geometry.probe": source}) == []
