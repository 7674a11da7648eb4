"""One-way layers: no module of attnsens imports from a layer above its own, nor another package's private parts.

The order is docs/architecture.md, "Layers and import direction". Imports are read from the source with ``ast``,
so function-level imports (the lazy ones that keep ``import attnsens`` cheap) and ``TYPE_CHECKING`` imports count
as much as module-level ones, and so do ``"attnsens.package.module:name"`` strings, which registries such as
``models.loading.ALIASES`` import on first use.

A name or module that starts with an underscore belongs to its layer unit (a subpackage such as ``theta``, or a
top-level module such as ``weights``): ``from attnsens.theta._numba_kernels import x`` and
``from attnsens.theta.kernels import _x`` are refused outside ``theta``. The top-level private modules
(``attnsens._rounding``, ``attnsens._threads``, …) are package-internal to attnsens and open to all of it; their
private names are not.
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
    # foundation
    (
        "attnsens",
        "errors",
        "provenance",
        "_float64",
        "_threads",
        "_ranks",
        "_memory",
        "_numba_cache",
        "_encoding",
        "seeding",
    ),
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


def imported_names(source: str, module: str, *, is_package: bool = False) -> list[tuple[str, str | None, int]]:
    """Every attnsens module that ``source`` (the text of ``module``) imports, anywhere in it, with the name it
    takes from that module (None for ``import module``) and the line."""
    found: list[tuple[str, str | None, int]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from attnsens import geometry` imports the subpackage, `from attnsens import __version__` the root.
            if base == "attnsens":
                found += [(f"{base}.{alias.name}", None, node.lineno) for alias in node.names]
            else:
                found += [(base, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _REFERENCE.fullmatch(node.value):
            target, _, name = node.value.partition(":")
            found.append((target, name, node.lineno))
    return [(target, name, line) for target, name, line in found if target.partition(".")[0] == "attnsens"]


def imported_modules(source: str, module: str, *, is_package: bool = False) -> list[tuple[str, int]]:
    """Every attnsens module that ``source`` (the text of ``module``) imports, anywhere in it, with the line."""
    found = imported_names(source, module, is_package=is_package)
    return list(dict.fromkeys((target, line) for target, _, line in found))


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


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reaches(modules: dict[str, str], packages: frozenset[str] = frozenset()) -> list[Edge]:
    """The imports among ``modules`` of a private module or name of another layer unit: a module below a
    subpackage whose name starts with ``_`` (``attnsens.theta._numba_kernels``), or a name starting with ``_``
    (``from attnsens.theta.kernels import _x``, ``from attnsens.capture import _numba_moments``)."""
    edges = []
    for module, source in sorted(modules.items()):
        for target, name, line in imported_names(source, module, is_package=module in packages):
            target = _resolve(target)
            if unit_of(target) == unit_of(module):
                continue
            private_module = any(_private(part) for part in target.split(".")[2:])
            if private_module or (name is not None and _private(name)):
                edges.append(Edge(module, target if name is None else f"{target}.{name}", line))
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


def test_no_module_imports_another_units_private_module_or_name() -> None:
    edges = private_reaches(*package_sources())
    assert not edges, (
        "private parts reached from outside their package (import a public name of the package, such as "
        "attnsens.theta.kernels, instead):\n" + "\n".join(edge.describe() for edge in edges)
    )


@pytest.mark.parametrize(
    "source",
    [
        "from attnsens.theta._numba_kernels import ROW_BLOCK\n",
        "from attnsens.theta.kernels import _certify_block\n",
        "def lazy():\n    from attnsens.theta._validation import raise_for_status\n",
        "import attnsens.theta._numba_scan\n",
        "from attnsens.theta import _numba_kernels\n",
        "from attnsens.store.checkpoint_files import _SHA256\n",
        "from attnsens._rounding import _infinity\n",
        "from ..theta._constants import K_SMALL\n",
        'KERNELS = {"x": "attnsens.theta._numba_kernels:certify_rows"}\n',
    ],
)
def test_a_private_reach_is_found_in_every_form(source: str) -> None:
    edges = private_reaches({"attnsens.capture.probe": source})
    assert len(edges) == 1 and edges[0].line >= 1, edges


def test_own_private_parts_and_the_shared_private_modules_are_allowed() -> None:
    source = (
        "from attnsens.capture._numba_moments import row_moments\nfrom . import _numba_row_statistics\n"
        "from attnsens.theta.kernels import certify_block\nfrom attnsens._rounding import add_up\n"
        "import attnsens._threads\nfrom attnsens import __version__\nfrom attnsens.capture.statistics import _x\n"
    )
    assert private_reaches({"attnsens.capture.probe": source}) == []


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
