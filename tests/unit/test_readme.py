"""The README's Python snippets run as written: the quick tour and the worked audit-and-query example."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import torch

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
SHOWN_REPR = re.compile(r"^(?P<expr>.+?)\s+#\s+(?P<repr>tensor\(.*\))\s*$")


def readme_blocks() -> list[str]:
    return BLOCK.findall(README.read_text(encoding="utf-8"))


def block_with(text: str) -> str:
    """The one Python block of the README containing ``text``."""
    (block,) = [b for b in readme_blocks() if text in b]
    return block


def run(block: str, namespace: dict[str, Any]) -> list[Any]:
    """Execute ``block`` statement by statement; return the values of its top-level expressions, in order."""
    values = []
    for node in ast.parse(block).body:
        if isinstance(node, ast.Expr):
            values.append(eval(compile(ast.Expression(node.value), "README.md", "eval"), namespace))
        else:
            exec(compile(ast.Module([node], type_ignores=[]), "README.md", "exec"), namespace)
    return values


def test_theta_tour_runs_and_shows_true_values() -> None:
    block = block_with("A.theta.certify(p)")
    namespace: dict[str, Any] = {}
    values = run(block, namespace)
    cert = namespace["cert"]
    assert cert.shape == (2, 12, 256)
    assert bool((cert.lower <= cert.upper).all())
    median, exact_fraction, widest = values[0]
    assert 0.99 < float(median) <= 1.0 and 0.0 <= float(exact_fraction) <= 1.0 and float(widest) <= 2.0**-25
    for line in block.splitlines():  # a value the README prints in a comment is the value the code returns
        if shown := SHOWN_REPR.match(line):
            assert repr(eval(shown["expr"], namespace)) == shown["repr"]
    exact_theta, jacobian = values[-2:]
    torch.testing.assert_close(exact_theta, torch.tensor(1.0, dtype=torch.float64))  # {0.4, 0.1} vs {0.3, 0.2}
    assert float(jacobian.lower) <= float(jacobian.upper) <= 1 / 8.0 + 1e-12  # θ/τ ≤ 1/τ, up to the softmax's rounding


@pytest.mark.slow
@pytest.mark.timeout(1800)  # bound_model on SmolLM2's 30 layers takes minutes on a busy 2-core machine
def test_model_tour_runs_on_smollm2() -> None:
    namespace: dict[str, Any] = {}
    run(block_with("A.theta.certify(p)"), namespace)
    run(block_with('A.models.load("smollm2")'), namespace)
    assert len(namespace["result"].rows) > 0 and len(namespace["table"]) > 0
    assert namespace["C"].applicable


def test_worked_example_audits_and_queries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    layer_summary, queried = run(block_with('query("runs/toy"'), namespace)
    assert (tmp_path / "runs" / "toy" / "manifest.json").is_file()
    # The prose under the example: 96 rows per layer, median certified θ ≈ 1.0, no dominant rows.
    assert list(layer_summary["n_rows"]) == [96, 96] and list(queried["n"]) == [96, 96]
    assert list(queried["theta"]) == list(layer_summary["theta_lower_median"])
    assert queried["theta"].tolist() == pytest.approx([1.0, 1.0], abs=1e-6)  # float32 rows: s ≠ 1 by rounding
    assert list(layer_summary["fraction_dominant"]) == [0.0, 0.0]
