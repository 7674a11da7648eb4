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


# The README's paragraph on what attnsens runs and writes: each claim, by a phrase of it, and a check that it holds.
SECURITY_OPENING = "Nothing runs unless you ask:"


def security_paragraph() -> str:
    text = " ".join(README.read_text(encoding="utf-8").split())
    start = text.index(SECURITY_OPENING)
    return text[start : text.index(" ## ", start)]


def _source_calls(module: str, function: str) -> list[ast.Call]:
    import attnsens

    calls = []
    for file in sorted(Path(attnsens.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            func = getattr(node, "func", None)
            if isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and func.attr == function:
                if isinstance(func.value, ast.Name) and func.value.id == module:
                    calls.append(node)
    return calls


def _keyword(call: ast.Call, name: str) -> Any:
    found = [k.value for k in call.keywords if k.arg == name]
    return found[0].value if found and isinstance(found[0], ast.Constant) else "<not a constant>"


def _no_pickled_objects(tmp_path: Path) -> None:
    import pickle

    from typer.testing import CliRunner

    from attnsens.cli import app

    assert _source_calls("torch", "load") and _source_calls("np", "load")
    assert all(_keyword(call, "weights_only") is True for call in _source_calls("torch", "load"))
    assert all(_keyword(call, "allow_pickle") is False for call in _source_calls("np", "load"))

    class Payload:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "MARKER",))

    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"x": Payload()}))
    result = CliRunner().invoke(app, ["theta", str(tmp_path / "evil.pt")])
    assert result.exit_code == 1 and "holds pickled Python objects" in result.output
    assert not (tmp_path / "MARKER").exists()


def _no_remote_code(tmp_path: Path) -> None:
    from tests.helpers.remote_code import _calls_without_the_keyword

    assert _calls_without_the_keyword() == []


def _hostile_headers(tmp_path: Path) -> None:
    import struct

    from attnsens.errors import FileFormatError
    from attnsens.models.gguf_cache import check_gguf_header
    from attnsens.models.loading import check_declared_size

    path = tmp_path / "evil.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**63, 2**63))
    with pytest.raises(FileFormatError, match="claims 9,223,372,036,854,775,808 metadata entries") as refused:
        check_gguf_header(path)
    assert str(path) in str(refused.value)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(bytes(64))

    class Config:
        vocab_size, hidden_size = 10**12, 8

    with pytest.raises(FileFormatError, match="declares a vocabulary of 1,000,000,000,000 tokens"):
        check_declared_size(Config(), str(tmp_path / "model"), str(tmp_path / "model"))


def _query_confined(tmp_path: Path) -> None:
    from attnsens.errors import QueryError
    from attnsens.store.query import query
    from tests.unit.store.synthetic import write_synthetic_run

    run = write_synthetic_run(tmp_path / "run")
    assert len(query(run, "SELECT count(*) AS n FROM rows")) == 1
    outside = tmp_path / "outside.csv"
    outside.write_text("a\n1\n")
    for sql in (f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'", f"SELECT * FROM read_csv('{outside}')"):
        with pytest.raises(QueryError):
            query(run, sql)
    assert not (tmp_path / "x.csv").exists()


def _locks_not_followed(tmp_path: Path) -> None:
    from attnsens.errors import FileFormatError
    from attnsens.store import Manifest
    from attnsens.store.lock import LOCK_NAME, writer_lock

    for name in (LOCK_NAME, ".manifest.lock"):
        run, target = tmp_path / f"run{name}", tmp_path / f"target{name}"
        run.mkdir()
        (run / name).symlink_to(target)
        with pytest.raises(FileFormatError, match="is a symbolic link"):
            with writer_lock(run, command="audit"):
                Manifest.open(run, config={"a": 1})
        assert not target.exists()


def _interrupts_say_how_to_resume(tmp_path: Path) -> None:
    from attnsens.cli import app

    advice = {}
    for command in app.registered_commands:
        callback = command.callback
        while callback is not None and not hasattr(callback, "resume_advice"):
            callback = getattr(callback, "__wrapped__", None)
        if callback is not None:
            name = getattr(command.callback, "__name__", "")
            advice[name] = callback.resume_advice({"out": Path("r"), "resume": True})
    for name in ("train", "study", "audit"):
        assert "rerun the same command to resume" in advice[name], advice


def _verify_names_what_is_lacking(tmp_path: Path) -> None:
    import json
    import os
    import socket
    import subprocess
    import sys

    from attnsens.store import Manifest
    from attnsens.store.lock import LOCK_NAME
    from attnsens.store.verify import verify_run
    from tests.unit.store.synthetic import write_synthetic_run

    run = write_synthetic_run(tmp_path / "run")
    manifest = Manifest.load(run)
    damaged = sorted(manifest.units)[0]
    (run / damaged).write_bytes((run / damaged).read_bytes() + b"x")
    manifest.plan([*manifest.units, "rows/seed=9/step=000000.parquet"])
    checkpoints = run / "runs" / "placement=pre" / "seed=0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    entry = {"step": 0, "files": {"model.safetensors": "0" * 64}}
    (checkpoints / "manifest.json").write_text(json.dumps({"step_000000": entry}))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = {"pid": sleeper.pid, "host": socket.gethostname(), "command": "study", "started_utc": "now"}
        (run / LOCK_NAME).write_text(json.dumps(record) + "\n")
        check = verify_run(run)
        assert check.writer is not None and f"pid {sleeper.pid}" in check.writer
    finally:
        sleeper.kill()
        sleeper.wait()
    assert os.path.exists(run / damaged)
    assert {p.unit: p.kind for p in check.problems} == {
        damaged: "unreadable",  # its Parquet footer no longer ends the file
        "runs/placement=pre/seed=0/checkpoints/step_000000/model.safetensors": "missing",
    }
    assert check.absent == ("rows/seed=9/step=000000.parquet",)


SECURITY_CLAIMS = {
    "tensor files are read with `torch.load(weights_only=True)`, NumPy's without `allow_pickle`, so a pickle of "
    "Python objects is refused": _no_pickled_objects,
    "no model folder's or hub repository's code runs without `--trust-remote-code`, and transformers is never left "
    "to ask on stdin": _no_remote_code,
    "a GGUF header or config that claims more than its files hold is refused in one line naming the file": (
        _hostile_headers
    ),
    "`attnsens query` runs only SELECT, over the run's own Parquet files": _query_confined,
    "A run folder's lock files are never followed through a link": _locks_not_followed,
    "Ctrl-C or SIGTERM ends `train`, `study` and `audit` with a line saying how to resume": (
        _interrupts_say_how_to_resume
    ),
    "`attnsens verify` names a run's damaged units and checkpoints, the planned units it still lacks and a writer "
    "still running": _verify_names_what_is_lacking,
}


def test_the_security_paragraph_makes_only_the_claims_checked_here() -> None:
    paragraph = security_paragraph()
    rest = paragraph.removeprefix(SECURITY_OPENING)
    for claim in SECURITY_CLAIMS:
        assert claim in paragraph, f"the README no longer says: {claim}"
        rest = rest.replace(claim, "")
    left = rest.replace(", and ", "").replace(" and ", "")
    assert set(left) <= set(" ;.,"), f"a claim of the README's security paragraph is not checked here: {rest!r}"


@pytest.mark.parametrize("claim", list(SECURITY_CLAIMS), ids=[f.__name__[1:] for f in SECURITY_CLAIMS.values()])
def test_each_security_claim_of_the_readme_holds(claim: str, tmp_path: Path) -> None:
    SECURITY_CLAIMS[claim](tmp_path)
