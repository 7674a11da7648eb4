"""attnsens.study.audit and ``attnsens audit``: Parquet rows and summary, resume, per-layer table, errors."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import attnsens as A
from attnsens.capture import RowSelection
from attnsens.cli import app
from attnsens.store import Manifest, read_table
from attnsens.store.schema import ROWS, SUMMARY
from tests.unit.models.tiny_models import VOCAB, tiny_model

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " * 30


def test_audit_writes_rows_and_summary_and_resumes(tmp_path, monkeypatch) -> None:
    model = tiny_model("gpt2")
    tokens = torch.randint(0, VOCAB, (100,))
    ticks = []
    result = A.study.audit(model, tokens, seq_len=31, out_dir=tmp_path, progress=lambda d, t: ticks.append((d, t)))
    assert ticks[-1] == (3 * 2, 3 * 2)  # 3 sequences × 2 layers
    assert list(result.rows.columns) == list(ROWS.names)
    assert list(result.summary.columns) == list(SUMMARY.names)
    assert len(result.rows) == 3 * 2 * 3 * 31
    assert sorted(result.rows["batch"].unique()) == [0, 1, 2]
    assert (result.rows["theta_lower"] <= result.rows["theta_upper"]).all()
    manifest = Manifest.load(tmp_path)
    assert sorted(manifest.units) == [*(f"rows/sequence={i:06d}.parquet" for i in range(3)), "summary/summary.parquet"]
    pd.testing.assert_frame_equal(
        read_table(tmp_path / "rows").sort_values(list(ROWS.key), ignore_index=True),
        result.rows.sort_values(list(ROWS.key), ignore_index=True),
    )
    layers = result.layer_summary()
    assert layers["layer"].tolist() == [0, 1] and (layers["n_rows"] == 3 * 3 * 31).all()

    def no_recompute(*args, **kwargs):
        raise AssertionError("a finished sequence was recomputed")

    monkeypatch.setattr(sys.modules["attnsens.study.auditing"], "capture_row_statistics", no_recompute)
    again = A.study.audit(model, tokens, seq_len=31, out_dir=tmp_path)
    pd.testing.assert_frame_equal(again.rows, result.rows)


def test_an_audit_written_to_a_folder_holds_one_layer_of_rows_at_a_time(tmp_path, monkeypatch) -> None:
    """Written to a run folder, the rows go to disk layer by layer (a row group each) and the summary is built a
    layer at a time, yet both equal an in-memory audit's; the rows are read back only when asked for."""
    import pyarrow.parquet as pq

    from attnsens.study.auditing import RowColumns

    model = tiny_model("llama", num_hidden_layers=3)
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(2))
    held = []
    add = RowColumns.add

    def counting_add(self, block):
        add(self, block)
        held.append(self._count)

    in_memory = A.study.audit(model, tokens)
    monkeypatch.setattr(RowColumns, "add", counting_add)
    written = A.study.audit(model, tokens, out_dir=tmp_path)
    heads = model.config.num_attention_heads
    assert max(held) == heads * 40  # one layer of one sequence, never more
    assert written.n_rows == in_memory.n_rows == 2 * 3 * heads * 40
    assert "rows" not in vars(written)  # not read back yet
    theta = in_memory.layer_summary()["theta_lower_median"]
    assert repr(in_memory) == (
        f"AuditResult(n_rows={2 * 3 * heads * 40}, layers=3, heads={heads}, median θ lower bound by layer "
        f"{theta.min():.9g}–{theta.max():.9g}, rows in memory)"
    )
    assert repr(written).endswith(f"rows in 2 file(s) under {str(tmp_path)!r})") and "rows" not in vars(written)
    assert written.row_files == tuple(tmp_path / f"rows/sequence={i:06d}.parquet" for i in range(2))
    for file in written.row_files:
        layers = [pq.ParquetFile(file).read_row_group(g).column("layer").unique().to_pylist() for g in range(3)]
        assert layers == [[0], [1], [2]]
    pd.testing.assert_frame_equal(written.summary, in_memory.summary, check_exact=True)
    pd.testing.assert_frame_equal(read_table(tmp_path / "summary"), in_memory.summary)
    pd.testing.assert_frame_equal(written.rows, in_memory.rows, check_exact=True)

    # A budget that holds one layer's rows at a time: three summaries of a layer each, the same summary.
    import attnsens.store

    audit_module = sys.modules["attnsens.study.auditing"]
    monkeypatch.setattr(audit_module, "TABLE_BYTES_PER_ROW", RowSelection().max_memory)
    summarized = []
    summarize = attnsens.store.summarize_rows
    monkeypatch.setattr(attnsens.store, "summarize_rows", lambda rows: summarized.append(len(rows)) or summarize(rows))
    layer_by_layer = A.study.audit(model, tokens, out_dir=tmp_path / "by_layer")
    assert summarized == [2 * heads * 40] * 3
    pd.testing.assert_frame_equal(layer_by_layer.summary, in_memory.summary, check_exact=True)

    # The summary's own cap, whatever the budget: two layers' rows fit it here, so two summaries (2 + 1 layers).
    monkeypatch.setattr(audit_module, "TABLE_BYTES_PER_ROW", 1)
    monkeypatch.setattr(audit_module, "SUMMARY_MEMORY", 2 * 2 * heads * 40)
    summarized.clear()
    capped = A.study.audit(model, tokens, out_dir=tmp_path / "capped")
    assert summarized == [2 * 2 * heads * 40, 2 * heads * 40]
    pd.testing.assert_frame_equal(capped.summary, in_memory.summary, check_exact=True)


def test_one_sequence_written_to_a_folder_is_summarized_layer_by_layer_without_reading_back(
    tmp_path, monkeypatch
) -> None:
    """One sequence: each layer's summary records come from its rows before they go to disk, so nothing is read
    back, and the summary is the in-memory audit's bit for bit; a rerun over the finished folder reads it back."""
    import attnsens.store
    from attnsens.study.auditing import _summary_by_layers

    model = tiny_model("llama")
    tokens = torch.randint(0, VOCAB, (1, 37), generator=torch.Generator().manual_seed(4))
    in_memory = A.study.audit(model, tokens)
    read_back = []
    summarize = attnsens.store.summarize_rows
    monkeypatch.setattr(attnsens.store, "summarize_rows", lambda rows: read_back.append(len(rows)) or summarize(rows))
    written = A.study.audit(model, tokens, out_dir=tmp_path)
    assert read_back == []
    pd.testing.assert_frame_equal(written.summary, in_memory.summary, check_exact=True)
    pd.testing.assert_frame_equal(read_table(tmp_path / "summary"), in_memory.summary, check_exact=True)
    layers = list(range(model.config.num_hidden_layers))
    from_disk = _summary_by_layers(written.row_files, layers, n_rows=written.n_rows, max_memory=2**30)
    pd.testing.assert_frame_equal(from_disk, written.summary, check_exact=True)

    read_back.clear()
    again = A.study.audit(model, tokens, out_dir=tmp_path)  # the sequence is recorded: its rows are read back
    assert read_back == [written.n_rows]
    pd.testing.assert_frame_equal(again.summary, in_memory.summary, check_exact=True)

    # However many finished layers are summarized together: each alone, or all at once.
    import attnsens.store.summary

    audit_module = sys.modules["attnsens.study.auditing"]
    summarized = []
    by_columns = attnsens.store.summary.summarize_columns
    monkeypatch.setattr(
        attnsens.store.summary,
        "summarize_columns",
        lambda c, **k: summarized.append(len(c["layer"])) or by_columns(c, **k),
    )
    layer_rows = written.n_rows // len(layers)
    for budget, calls in ((1, [layer_rows] * len(layers)), (2**30, [written.n_rows])):
        monkeypatch.setattr(audit_module, "LAYER_SUMMARY_MEMORY", budget)
        summarized.clear()
        result = A.study.audit(model, tokens, out_dir=tmp_path / f"budget-{budget}")
        assert summarized == calls and read_back == [written.n_rows]
        pd.testing.assert_frame_equal(result.summary, in_memory.summary, check_exact=True)


def test_a_sequence_moved_into_another_place_with_a_matching_hash_is_recomputed(tmp_path, capsys) -> None:
    """The rerun that the verification error advises must not keep a unit whose contents disagree with its key."""
    from attnsens.store import sha256_file
    from attnsens.store.verify import verify_run

    model = tiny_model("gpt2")
    tokens = torch.randint(0, VOCAB, (100,), generator=torch.Generator().manual_seed(1))
    first = A.study.audit(model, tokens, seq_len=31, out_dir=tmp_path)
    moved = "rows/sequence=000001.parquet"
    (tmp_path / "rows/sequence=000000.parquet").replace(tmp_path / moved)
    payload = json.loads((tmp_path / "manifest.json").read_text())
    payload["units"][moved]["sha256"] = sha256_file(tmp_path / moved)
    (tmp_path / "manifest.json").write_text(json.dumps(payload))
    assert "holds batch 0, its path says 1" in verify_run(tmp_path).message()
    again = A.study.audit(model, tokens, seq_len=31, out_dir=tmp_path)
    assert f"note: rebuilding {moved} (holds batch 0, its path says 1)" in capsys.readouterr().err
    assert verify_run(tmp_path, rehash=True).ok
    pd.testing.assert_frame_equal(again.rows, first.rows)


def test_sampled_audit_differs_per_sequence_and_is_reproducible() -> None:
    model = tiny_model("llama")
    tokens = torch.randint(0, VOCAB, (2, 37))
    selection = RowSelection(query_start=5, sample_per_sequence=4, seed=3)
    first = A.study.audit(model, tokens, selection=selection).rows
    second = A.study.audit(model, tokens, selection=selection).rows
    pd.testing.assert_frame_equal(first, second)
    queries = first.groupby("batch")["query"].apply(lambda q: tuple(sorted(set(q))))
    assert queries[0] != queries[1] and all(len(q) == 4 and min(q) >= 5 for q in queries)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "hamlet.txt"
    path.write_text(TEXT)
    return path


def test_cli_audit_minilm_prints_a_table_per_layer(tmp_path, text_file) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["audit", "minilm", "--text", str(text_file), "--seq-len", "48", "--batch", "2", "--out", str(out)],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output
    assert "median θ lower bound" in result.output and "dominant fraction" in result.output
    assert f"6,912 rows written to {out}/rows" in result.output
    rows = read_table(out / "rows")
    assert len(rows) == 2 * 6 * 12 * 48  # sequences × layers × heads × rows
    assert set(rows["n_keys"]) == {48}  # bidirectional: every key allowed
    summary = read_table(out / "summary")
    assert set(summary["head"]) == {-1, *range(12)}


def test_cli_audit_json(tmp_path, text_file) -> None:
    result = CliRunner().invoke(
        app,
        [
            "audit",
            "minilm",
            "--text",
            str(text_file),
            "--seq-len",
            "16",
            "--sample",
            "4",
            "--out",
            str(tmp_path),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["n_rows"] == 6 * 12 * 4
    assert [layer["layer"] for layer in payload["layers"]] == list(range(6))


def test_cli_audit_without_a_text_audits_the_built_in_corpus(tmp_path) -> None:
    tables = {}
    for name, source in (("default", []), ("corpus", ["--corpus", "shakespeare"])):
        out = tmp_path / name
        arguments = ["audit", "minilm", *source, "--seq-len", "12", "--layers", "0", "--out", str(out), "--json"]
        result = CliRunner().invoke(app, arguments)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["n_rows"] == 12 * 12
        tables[name] = read_table(out / "rows").drop(columns=["run_id"])
    pd.testing.assert_frame_equal(tables["default"], tables["corpus"])


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["minilm", "--text", "MISSING", "--seq-len", "8"], "does not exist"),
        (["minilm", "--text", "EMPTY", "--seq-len", "8"], "is empty"),
        (["minilm", "--text", "TEXT", "--seq-len", "600"], "exceeds the context"),
        (["no-such/model", "--text", "TEXT", "--seq-len", "8"], "no file or folder"),
        (["minilm", "--text", "TEXT", "--corpus", "shakespeare", "--seq-len", "8"], "not both"),
        (["minilm", "--corpus", "poetry", "--seq-len", "8"], "unknown corpus"),
        (["minilm", "--text", "SHORT", "--seq-len", "64"], "the text has 1 token, fewer than the 62 of one window"),
    ],
)
def test_cli_audit_bad_input_is_one_line_exit_1(tmp_path, text_file, arguments, message) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    short = tmp_path / "short.txt"
    short.write_text("hello")
    swap = {"MISSING": str(tmp_path / "missing.txt"), "EMPTY": str(empty), "TEXT": str(text_file), "SHORT": str(short)}
    arguments = [swap.get(a, a) for a in arguments]
    result = CliRunner().invoke(app, ["audit", *arguments, "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
