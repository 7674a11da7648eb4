"""``attnsens theta FILE``: summaries for .npy/.pt/.safetensors, per-row Parquet, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from attnsens.cli import app
from tests.unit.theta.rows import softmax_rows

runner = CliRunner()


def _probabilities() -> torch.Tensor:
    return softmax_rows(15, 29, 2.0, seed=1).reshape(3, 5, 29)


def _invoke(*args: str):
    return runner.invoke(app, ["theta", *args])


@pytest.mark.parametrize("suffix", [".npy", ".pt", ".safetensors"])
def test_summary_json_for_each_format(tmp_path: Path, suffix: str) -> None:
    p = _probabilities()
    path = tmp_path / f"attention{suffix}"
    if suffix == ".npy":
        np.save(path, p.numpy())
    elif suffix == ".pt":
        torch.save({"attention": p, "other": torch.ones(2)}, path)
    else:
        save_file({"attention": p}, str(path))
    extra = ["--key", "attention"] if suffix == ".pt" else []
    result = _invoke(str(path), "--json", *extra)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["rows"] == 15 and summary["shape"] == [3, 5, 29]
    assert 0.0 <= summary["exact_fraction"] <= 1.0
    assert summary["theta_lower_bound"]["q50"] > 0.9
    assert summary["width_at_most_2^-25_fraction"] == 1.0


def _short_and_long_rows() -> torch.Tensor:
    """Near-uniform rows of 30–47 keys (zeros pad them to 64), where the default leaves a few unproved, and 8 rows of
    64 keys."""
    rows = []
    for i, n in enumerate(range(30, 48)):
        for sigma in (0.3, 0.6):
            rows.append(torch.nn.functional.pad(softmax_rows(1, n, sigma, seed=100 + i), (0, 64 - n)))
    rows.append(softmax_rows(8, 64, 1.0, seed=5))
    return torch.cat(rows)


def test_summary_counts_the_short_rows_exact_support_48_would_prove(tmp_path: Path) -> None:
    path = tmp_path / "p.npy"
    np.save(path, _short_and_long_rows().T.contiguous().numpy())  # keys on axis 0: the count follows --dim
    default = json.loads(_invoke(str(path), "--dim", "0", "--json").stdout)
    proved = json.loads(_invoke(str(path), "--dim", "0", "--json", "--exact-support", "48").stdout)
    open_short = default["short_rows_not_exact"]
    assert open_short > 0, "the rows must include short ones the default leaves unproved"
    assert proved["short_rows_not_exact"] == 0
    # Exactly the rows counted become exact: rows of more than 48 keys are certified alike either way.
    assert round((proved["exact_fraction"] - default["exact_fraction"]) * default["rows"]) == open_short
    table = _invoke(str(path), "--dim", "0")
    assert "rows of ≤ 48 keys not proved exact" in table.stdout and "--exact-support 48" in table.stdout
    assert "not proved exact" not in _invoke(str(path), "--dim", "0", "--exact-support", "48").stdout


def test_table_shows_the_digits_that_separate_a_bound_from_0_and_1(tmp_path: Path) -> None:
    """A one-hot row's lower bound lies a rounding step below 0 (θ = 0): the table shows −2.2e-16, not
    −0.00000000, and near-uniform rows' bounds keep the digits that separate them from 1."""
    from attnsens.cli.app import format_float
    from attnsens.theta import certify

    p = torch.cat([softmax_rows(20, 300, 0.05, seed=3), torch.eye(1, 300)])
    path = tmp_path / "p.npy"
    np.save(path, p.numpy())
    result = _invoke(str(path))
    assert result.exit_code == 0, result.output
    lower = certify(p).lower
    assert float(lower.min()) < 0.0 and "-0.00000000" not in result.stdout
    assert format_float(float(lower.min())) in result.stdout
    assert format_float(float(lower.median())) in result.stdout


def test_table_and_parquet_rows(tmp_path: Path) -> None:
    path = tmp_path / "p.npy"
    np.save(path, _probabilities().numpy())
    out = tmp_path / "rows.parquet"
    result = _invoke(str(path), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "exact fraction" in result.stdout and "rows" in result.stdout
    table = pq.read_table(out).to_pydict()
    assert list(zip(table["head"], table["query"], strict=True)) == [(h, q) for h in range(3) for q in range(5)]
    assert all(lo <= hi for lo, hi in zip(table["theta_lower"], table["theta_upper"], strict=True))


def test_dim_option(tmp_path: Path) -> None:
    path = tmp_path / "p.npy"
    np.save(path, _probabilities().permute(2, 0, 1).contiguous().numpy())
    result = _invoke(str(path), "--dim", "0", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == 15


def _bad_file(tmp_path: Path, kind: str) -> Path:
    p = _probabilities()
    path = tmp_path / "bad.npy"
    if kind == "missing":
        return tmp_path / "missing.npy"
    if kind == "not_a_tensor":
        path.write_text("hello")
        return path
    if kind == "nan":
        p[1, 2, 3] = float("nan")
    elif kind == "negative":
        p[0, 0, 0] = -0.5
    elif kind == "empty":
        p[2, 4] = 0.0
    elif kind == "bad_sum":
        p[1, 1] *= 2
    np.save(path, p.numpy())
    return path


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("missing", "does not exist"),
        ("not_a_tensor", "cannot read"),
        ("nan", "finite"),
        ("negative", "negative"),
        ("empty", "empty"),
        ("bad_sum", "normalize=True"),
    ],
)
def test_bad_files_one_red_line(tmp_path: Path, kind: str, needle: str) -> None:
    result = _invoke(str(_bad_file(tmp_path, kind)))
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]
    assert "Traceback" not in result.output


def test_key_errors(tmp_path: Path) -> None:
    path = tmp_path / "two.pt"
    torch.save({"a": torch.ones(2) / 2, "b": torch.ones(3) / 3}, path)
    result = _invoke(str(path))
    assert result.exit_code == 1 and "--key" in result.output
    assert _invoke(str(path), "--key", "b", "--json").exit_code == 0


def test_the_kernels_load_before_the_timed_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call certifies uniform rows typed and shaped like the file's, so ``seconds`` times the certificate
    alone; the load is reported beside it."""
    import attnsens.theta

    calls = []
    certify = attnsens.theta.certify

    def recording(p, *args, **kwargs):
        calls.append((tuple(p.shape), p.dtype, float(p.max()), float(p.min())))
        return certify(p, *args, **kwargs)

    monkeypatch.setattr(attnsens.theta, "certify", recording)
    path = tmp_path / "attention.npy"
    np.save(path, _probabilities().to(torch.float16).numpy())
    result = _invoke(str(path), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["kernel_load_seconds"] >= 0.0 and summary["seconds"] >= 0.0
    (warm_shape, warm_dtype, high, low), (shape, dtype, _, _) = calls
    assert warm_shape == (15, 29) and warm_dtype == dtype == torch.float16 and high == low
    assert shape == (3, 5, 29)


def test_long_calls_show_progress_and_short_ones_do_not(tmp_path: Path) -> None:
    path = tmp_path / "attention.npy"
    np.save(path, _probabilities().numpy())
    quick = _invoke(str(path))
    assert quick.exit_code == 0 and "certifying" not in quick.stderr
    enumerating = _invoke(str(path), "--exact-support", "33")  # a call that may enumerate rows: progress shown
    assert enumerating.exit_code == 0, enumerating.output
    assert "certifying: 15/15 rows" in enumerating.stderr
    assert json.loads(_invoke(str(path), "--exact-support", "33", "--json").stdout)["rows"] == 15
