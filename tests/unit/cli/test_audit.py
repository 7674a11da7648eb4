"""``attnsens audit``: layer/head selection, the per-head table, default --seq-len and --out."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnsens.cli import app

runner = CliRunner()


def test_layers_heads_and_per_head_table(run_dir: Path, text_file: Path, tmp_path: Path) -> None:
    args = ["audit", str(run_dir), "--text", str(text_file), "--seq-len", "8", "--out", str(tmp_path / "o")]
    result = runner.invoke(app, [*args, "--layers", "1", "--heads", "0", "--per-head", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["n_rows"] == 8 and [r["layer"] for r in payload["layers"]] == [1]
    assert [(r["layer"], r["head"]) for r in payload["heads"]] == [(1, 0)]
    table = runner.invoke(app, [*args[:-1], str(tmp_path / "p"), "--per-head"], env={"COLUMNS": "160"})
    assert table.exit_code == 0, table.output
    assert "attention audit of micro@2, per head" in table.stdout
    assert sum(line.startswith("│") for line in table.stdout.splitlines()) == 2 * 2 + 2  # (layer, head) + layers


def test_the_table_shows_every_digit_of_theta_in_80_columns(monkeypatch) -> None:
    """The digits that tell a median θ bound of 0.99999999048… from 1 are never cut to an ellipsis, and the
    table's right border stays inside 80 columns, per head and per layer."""
    import pandas as pd
    from rich.console import Console

    from attnsens.cli import audit as audit_cli
    from attnsens.cli.app import format_float

    summary = pd.DataFrame({
        "layer": [0, 0, 29], "head": [0, 1, 8], "n_rows": [512, 512, 512],
        "theta_lower_median": [0.9999999904805, 0.999999984401, 0.696538],
        "fraction_dominant": [0.026, 0.117, 0.799], "p_max_median": [0.0499, 0.1462, 0.7754],
        "entropy_mean": [4.478, 3.338, 1.177],
    })  # fmt: skip
    for by_head in (True, False):
        console = Console(width=80, record=True, file=io.StringIO(), markup=False)
        monkeypatch.setattr(audit_cli, "console", console)
        audit_cli._print_table("smollm2", summary, by_head=by_head)
        text = console.export_text()
        rows = [line for line in text.splitlines() if line.startswith("│")]
        assert len(rows) == 3 and all(line.endswith("│") and len(line) <= 80 for line in rows), text
        for value in summary["theta_lower_median"]:
            assert format_float(value) in text, text


def test_indices_outside_the_model(run_dir: Path, text_file: Path, tmp_path: Path) -> None:
    args = ["audit", str(run_dir), "--text", str(text_file), "--seq-len", "8", "--out", str(tmp_path / "o")]
    result = runner.invoke(app, [*args, "--layers", "0,5"])
    assert result.exit_code == 1
    assert result.output.strip() == "error: --layers [5] outside the model's 2 layers; use indices 0 to 1"
    result = runner.invoke(app, [*args, "--heads", "x"])
    assert result.exit_code == 1
    assert result.output.strip() == "error: --heads must be comma-separated 0-based indices such as 0,2, got 'x'"


def test_default_seq_len_and_out(run_dir: Path, text_file: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["audit", str(run_dir), "--text", str(text_file), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["seq_len"] == 16  # the micro GPT's whole context
    out = Path(payload["out"])
    assert out.parent == Path("runs") and out.name.startswith("audit-micro-")
    assert (tmp_path / out / "rows").is_dir()


def test_device_and_dtype(run_dir: Path, text_file: Path, tmp_path: Path) -> None:
    args = ["audit", str(run_dir), "--text", str(text_file), "--seq-len", "8", "--json"]
    result = runner.invoke(app, [*args, "--device", "cpu", "--dtype", "bf16", "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["n_rows"] == 2 * 2 * 8  # 2 layers x 2 heads x 8 queries, from bfloat16 weights
    result = runner.invoke(app, [*args, "--dtype", "int8", "--out", str(tmp_path / "i")])
    assert result.exit_code == 1
    assert "--dtype 'int8' is not a float type; use float32, bfloat16, float16 or float64" in result.output


def test_revision_reaches_from_pretrained(monkeypatch) -> None:
    import transformers

    from attnsens.errors import FileFormatError
    from attnsens.models import load

    seen = {}

    def refuse(source: str, **kwargs: object) -> None:
        seen.update(kwargs, source=source)
        raise OSError("offline")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", refuse)
    with pytest.raises(FileFormatError, match="cannot load model 'EleutherAI/pythia-70m'"):
        load("EleutherAI/pythia-70m", revision="step1000")
    assert seen["source"] == "EleutherAI/pythia-70m" and seen["revision"] == "step1000"


def test_max_memory_sizes_the_chunks_and_is_recorded(run_dir: Path, text_file: Path, tmp_path: Path) -> None:
    base = ["audit", str(run_dir), "--text", str(text_file), "--seq-len", "8", "--json"]
    small = runner.invoke(app, [*base, "--out", str(tmp_path / "small"), "--max-memory", "1"])
    default = runner.invoke(app, [*base, "--out", str(tmp_path / "default")])
    assert small.exit_code == 0 and default.exit_code == 0, small.output + default.output
    assert json.loads(small.stdout)["layers"] == json.loads(default.stdout)["layers"]

    def recorded(name: str) -> int:
        return json.loads((tmp_path / name / "manifest.json").read_text())["config"]["selection"]["max_memory"]

    assert (recorded("small"), recorded("default")) == (2**20, 128 * 2**20)
    refused = runner.invoke(app, [*base, "--out", str(tmp_path / "zero"), "--max-memory", "0"])
    assert refused.exit_code != 0


def test_theta_out_and_audit_rows_share_names_types_and_method_codes(
    run_dir: Path, text_file: Path, tmp_path: Path
) -> None:
    """The attention of one layer, audited and certified by ``theta --out``: every column of the theta file is a
    rows-table column of the same Arrow type, and the two agree row for row, the method code included."""
    import pyarrow.parquet as pq
    import torch

    import attnsens as A

    args = ["audit", str(run_dir), "--text", str(text_file), "--seq-len", "8", "--layers", "1", "--json"]
    audited = runner.invoke(app, [*args, "--out", str(tmp_path / "audit")])
    assert audited.exit_code == 0, audited.output
    adapter = A.models.load(run_dir)
    ids = adapter.encode(text_file.read_text(), max_length=8)
    (chunk,) = adapter.stream_attention(ids, layers=[1])
    torch.save(chunk.probs.contiguous(), tmp_path / "attention.pt")
    certified = runner.invoke(app, ["theta", str(tmp_path / "attention.pt"), "--out", str(tmp_path / "theta.parquet")])
    assert certified.exit_code == 0, certified.output

    theta = pq.read_table(tmp_path / "theta.parquet")
    rows = pq.read_table(next((tmp_path / "audit" / "rows").rglob("*.parquet")))
    assert theta.column_names == ["batch", "head", "query", "theta_lower", "theta_upper", "theta_exact",
                                  "theta_method", "row_sum", "p_max", "dominant"]  # fmt: skip
    assert all(theta.schema.field(name).type == rows.schema.field(name).type for name in theta.column_names)
    key = ["batch", "head", "query"]
    joined = theta.to_pandas().merge(rows.to_pandas(), on=key, suffixes=("", "_audit"))
    assert len(joined) == theta.num_rows == rows.num_rows == 2 * 8
    for name in ("theta_lower", "theta_upper", "theta_exact", "theta_method", "dominant"):
        assert (joined[name] == joined[f"{name}_audit"]).all(), name
    codes = pq.read_metadata(tmp_path / "theta.parquet").metadata[b"attnsens"]
    assert b"theta_method_codes" in codes


def _score_bytes(n: int) -> int:
    """builtin:lnfree's forward holds 2 heads × n² scores of 12 bytes and an n² mask (OwnGPTAdapter)."""
    return 2 * n * n * 12 + n * n


def test_a_seq_len_whose_attention_scores_exceed_the_memory_is_refused(monkeypatch, tmp_path: Path) -> None:
    import attnsens._memory

    monkeypatch.setattr(attnsens._memory, "memory_budget", lambda: 2**30)
    limit = next(n for n in range(6000, 7000) if _score_bytes(n + 1) > 2**30)
    result = runner.invoke(app, ["audit", "builtin:lnfree", "--seq-len", "60000", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: --seq-len 60000 needs about 83.8 GiB for the attention scores that builtin:lnfree's forward pass "
        f"holds for one layer (2 heads × n²), more than half of this machine's memory (2 GiB); use --seq-len {limit} "
        "or less"
    ]


def test_the_default_seq_len_fits_the_attention_scores_in_memory(monkeypatch, tmp_path: Path) -> None:
    """builtin:lnfree's context is 65,536 positions, and its forward pass holds a layer's n² scores: without
    --seq-len the corpus is audited in the longest window whose scores fit, and the command says so."""
    import attnsens._memory

    monkeypatch.setattr(attnsens._memory, "memory_budget", lambda: 2**21)
    limit = next(n for n in range(1, 1000) if _score_bytes(n + 1) > 2**21)
    result = runner.invoke(app, ["audit", "builtin:lnfree", "--layers", "0", "--out", str(tmp_path / "o"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["seq_len"] == limit and _score_bytes(limit) <= 2**21
    result = runner.invoke(app, ["audit", "builtin:lnfree", "--layers", "0", "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert f"note: auditing windows of {limit:,} tokens: builtin:lnfree's forward pass holds" in result.stderr


def test_running_out_of_memory_is_one_line(monkeypatch, tmp_path: Path) -> None:
    import importlib

    audit_module = importlib.import_module("attnsens.study.auditing")

    def fails(*_args, **_kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 34359738368 bytes. Error code 12 (Cannot allocate memory)"
        )

    monkeypatch.setattr(audit_module, "audit", fails)
    result = runner.invoke(app, ["audit", "builtin:lnfree", "--seq-len", "16", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: out of memory: one allocation of 32 GiB failed; give the command less to hold at once: a shorter "
        "--seq-len or a smaller --max-memory"
    )
    monkeypatch.setattr(audit_module, "audit", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    result = runner.invoke(app, ["audit", "builtin:lnfree", "--seq-len", "16", "--out", str(tmp_path / "p")])
    assert isinstance(result.exception, RuntimeError) and str(result.exception) == "a bug"  # other errors stay loud


def test_token_ids_stand_in_for_text_for_a_model_without_a_tokenizer(tmp_path: Path) -> None:
    """--ids reads a .pt, .npy or text file of token ids: a stream cut into --seq-len windows, or sequences of
    their own, each cut to --seq-len; audit and bounds run on them where text is refused, and bad files are one
    line naming the fix."""
    import numpy as np
    import torch

    from tests.unit.models.tiny_models import VOCAB, tiny_model

    folder = tmp_path / "granite"
    tiny_model("granite").save_pretrained(folder)
    stream = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(3))
    (tmp_path / "stream.txt").write_text(" ".join(map(str, stream.tolist())))
    torch.save(stream.reshape(3, 10), tmp_path / "rows.pt")
    np.save(tmp_path / "rows.npy", stream.reshape(3, 10).numpy())

    def audit(ids: str, *extra: str) -> dict:
        out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        result = runner.invoke(app, ["audit", str(folder), "--ids", str(tmp_path / ids), "--out", str(out), *extra,
                                     "--json"])  # fmt: skip
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    # A stream: windows of --seq-len; 2 layers × 6 heads × 8 queries × 3 windows.
    assert audit("stream.txt", "--seq-len", "8", "--batch", "3")["n_rows"] == 2 * 6 * 8 * 3
    # Sequences of their own (.pt and .npy alike): each cut to --seq-len, never joined into a stream.
    for name in ("rows.pt", "rows.npy"):
        payload = audit(name, "--seq-len", "7", "--batch", "3")
        assert (payload["seq_len"], payload["n_rows"]) == (7, 2 * 6 * 7 * 3)
    assert audit("rows.pt")["seq_len"] == 10  # whole sequences by default, one by default
    bounds = runner.invoke(app, ["bounds", str(folder), "--ids", str(tmp_path / "stream.txt"), "--seq-len", "9",
                                 "--json"])  # fmt: skip
    assert bounds.exit_code == 0, bounds.output
    assert {record["layer"] for record in json.loads(bounds.stdout)["records"]} == {0, 1}

    (tmp_path / "ragged.txt").write_text("1 2 3\n4 5\n")
    (tmp_path / "words.txt").write_text("1 2 three")
    torch.save(torch.rand(5), tmp_path / "floats.pt")
    (tmp_path / "large.txt").write_text(f"1 2 {VOCAB}")
    for name, message in [
        ("ragged.txt", "different numbers of token ids"),
        ("words.txt", "integer token ids separated by spaces or commas"),
        ("floats.pt", "token ids are integers"),
        ("large.txt", f"token ids must lie in [0, {VOCAB})"),
        ("missing.npy", "does not exist"),
    ]:
        result = runner.invoke(app, ["audit", str(folder), "--ids", str(tmp_path / name), "--out", str(tmp_path / "x")])
        assert result.exit_code == 1 and message in result.output, (name, result.output)
    both = runner.invoke(app, ["audit", str(folder), "--ids", str(tmp_path / "rows.pt"), "--corpus", "shakespeare"])
    assert both.exit_code == 1 and "give one of --ids" in both.output


def test_the_python_api_audits_the_rows_the_command_audits(
    run_dir: Path, text_file: Path, tmp_path: Path, monkeypatch
) -> None:
    """``attnsens.study.audit(model, text_or_ids, ...)`` chooses the command's default window (the text up to the
    context; no longer than the attention scores' memory allows) and cuts as it does (text and a stream into
    windows, each [batch, n] row to --seq-len): the same rows, statistic for statistic, and the same refusal of a
    --batch the input cannot fill."""
    import pandas as pd
    import torch

    import attnsens as A
    import attnsens._memory
    from attnsens.capture import RowSelection
    from attnsens.errors import InputError
    from attnsens.store import read_table
    from attnsens.train.data import read_documents

    rows_2d = torch.randint(0, 300, (3, 10), generator=torch.Generator().manual_seed(5))
    torch.save(rows_2d, tmp_path / "rows.pt")
    text = text_file.read_text()
    cases = [  # (command arguments, model, tokens, keyword arguments of the API)
        (["--text", str(text_file)], run_dir, text, {"n_sequences": 1}),
        (["--text", str(text_file), "--seq-len", "8", "--batch", "3"], run_dir, text, {"seq_len": 8, "n_sequences": 3}),
        (["--ids", str(tmp_path / "rows.pt"), "--seq-len", "7", "--batch", "3"], run_dir, rows_2d,
         {"seq_len": 7, "n_sequences": 3}),
        (["--layers", "0"], "builtin:lnfree", "\n\n".join(read_documents(None)),
         {"n_sequences": 1, "selection": RowSelection(layers=(0,))}),
    ]  # fmt: skip
    monkeypatch.setattr(attnsens._memory, "memory_budget", lambda: 2**21)  # lnfree's default window: the memory's
    stamped = ["step", "seed"]  # the command stamps the checkpoint's step and seed; the API's defaults are 0
    for index, (args, model, tokens, kwargs) in enumerate(cases):
        out = tmp_path / f"command-{index}"
        result = runner.invoke(app, ["audit", str(model), *args, "--out", str(out), "--json"])
        assert result.exit_code == 0, result.output
        command_rows = read_table(out / "rows").drop(columns=stamped)
        api = A.study.audit(model, tokens, **kwargs)
        assert api.rows["batch"].nunique() == kwargs["n_sequences"]
        assert api.rows["query"].max() + 1 == json.loads(result.stdout)["seq_len"]
        pd.testing.assert_frame_equal(api.rows.drop(columns=stamped), command_rows, check_exact=True)
    with pytest.raises(InputError, match=r"^the text gives \d+ sequence\(s\) of 8 tokens, fewer than --batch 5000"):
        A.study.audit(run_dir, text, seq_len=8, n_sequences=5000)
