"""The package surface: lazy subpackages, errors hierarchy, CLI help."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

import attnsens
from attnsens import errors
from attnsens.cli import app
from tests.imports import modules_loaded_by


def test_every_error_is_an_attnsens_value_error() -> None:
    classes = [obj for obj in vars(errors).values() if isinstance(obj, type) and issubclass(obj, Exception)]
    assert len(classes) >= 5
    for cls in classes:
        assert issubclass(cls, errors.AttnsensError)
        assert issubclass(cls, ValueError)


SURFACE = sorted(
    [f"attnsens.{path.parent.name}" for path in Path(attnsens.__file__).parent.glob("*/__init__.py")]
    + ["attnsens", "attnsens.errors", "attnsens.weights"]
)
"""Every package and the top-level modules users import names from."""


@pytest.mark.parametrize("name", SURFACE)
def test_the_surface_declares_its_names_and_only_its_own(name: str) -> None:
    module = importlib.import_module(name)
    assert "__all__" in vars(module), f"{name} has no __all__"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ lists names it does not have: {missing}"
    objects = {n: getattr(module, n) for n in module.__all__}
    foreign = [
        n
        for n, obj in objects.items()
        if (isinstance(obj, ModuleType) and not obj.__name__.startswith("attnsens"))
        or ((inspect.isclass(obj) or inspect.isfunction(obj)) and not obj.__module__.startswith("attnsens"))
    ]
    assert not foreign, f"{name}.__all__ exports what attnsens does not define: {foreign}"


def test_import_is_lazy() -> None:
    assert modules_loaded_by("attnsens", ("transformers", "numba")) == []


def test_unknown_attribute_raises() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        attnsens.nope  # noqa: B018


def test_version_command_prints_version() -> None:
    result = CliRunner().invoke(app, ["version", "--json"])
    assert result.exit_code == 0, result.output
    assert f'"attnsens": "{attnsens.__version__}"' in result.output


def test_the_version_is_the_one_pyproject_declares_and_the_changelog_releases() -> None:
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    declared = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert attnsens.__version__ == declared
    assert f"## [{declared}] - " in (root / "CHANGELOG.md").read_text(encoding="utf-8")


def test_every_command_has_help() -> None:
    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0
    for command in app.registered_commands:
        name = command.name or command.callback.__name__
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, f"{name}: {result.output}"
        assert "Usage" in result.output
