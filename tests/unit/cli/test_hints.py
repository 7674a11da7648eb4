"""Each hint names what is wrong with the input at hand and the command or option that fixes it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attnsens.cli import app
from tests.helpers.cli import _one_line_error

runner = CliRunner()


def _rows(n_rows: int, n_keys: int, seed: int = 0) -> torch.Tensor:
    return torch.softmax(torch.randn(n_rows, n_keys, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_a_nested_pt_names_its_nested_tensors_and_the_key_that_picks_one(tmp_path: Path) -> None:
    path = tmp_path / "attn.pt"
    torch.save({"layer0": {"attn": _rows(3, 5)}, "layer1": {"attn": _rows(4, 6, 1)}, "meta": {"n": 3}}, path)
    assert _one_line_error(["theta", str(path)]) == (
        f"{path} holds no tensor at its top level, only nested ones: ['layer0.attn', 'layer1.attn']; "
        "choose one with --key and its dotted path, e.g. --key layer0.attn"
    )
    picked = runner.invoke(app, ["theta", str(path), "--key", "layer1.attn", "--json"])
    assert picked.exit_code == 0, picked.output
    assert '"shape": [\n    4,\n    6\n  ]' in picked.stdout

    mixed = tmp_path / "mixed.pt"
    torch.save({"a": _rows(2, 3), "outputs": {"attentions": [_rows(2, 4), _rows(2, 4, 1)]}}, mixed)
    assert _one_line_error(["theta", str(mixed)]) == (
        f"{mixed} holds tensors ['a', 'outputs.attentions.0', 'outputs.attentions.1']; choose one with --key NAME "
        "(a nested one by its dotted path, e.g. --key outputs.attentions.0)"
    )
    empty = tmp_path / "empty.pt"
    torch.save({"meta": {"n": 3}}, empty)
    assert _one_line_error(["theta", str(empty)]) == (
        f"{empty} holds a dict with no tensor in it, at any depth; save the attention tensor itself or a dict of "
        "tensors"
    )


def test_a_missing_local_path_is_named_as_missing_not_as_an_offline_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    for model in ("./models/mine", str(tmp_path / "nowhere"), "models/deep/mine", "mine.gguf"):
        message = _one_line_error(["bounds", model])
        assert message.startswith(f"MODEL {model}: no file or folder {Path(model).absolute()} exists; check the path")
        assert "offline" not in message
    # A name that could also be a hub id: both readings are answered.
    message = _one_line_error(["bounds", "models/mine"])
    assert message == (
        f"MODEL models/mine: no file or folder {tmp_path / 'models' / 'mine'} exists; check the path; nor is "
        "'models/mine' a hub id in the local cache, and the hub is offline (HF_HUB_OFFLINE=1)"
    )
    text = tmp_path / "t.txt"
    text.write_text("some words to audit")
    message = _one_line_error(["audit", "./models/mine", "--text", str(text), "--out", str(tmp_path / "o")])
    assert message.startswith("MODEL ./models/mine: no file or folder")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("encoding", "prefix", "name", "described"),
    [
        ("utf-16", b"", "UTF-16", "UTF-16 (little-endian, with a byte-order mark)"),  # Python writes the LE mark
        ("utf-16-le", b"", "UTF-16LE", "UTF-16 (little-endian, no byte-order mark)"),
        ("utf-16-be", b"", "UTF-16BE", "UTF-16 (big-endian, no byte-order mark)"),
        ("utf-16-be", b"\xfe\xff", "UTF-16", "UTF-16 (big-endian, with a byte-order mark)"),
        ("utf-32", b"", "UTF-32", "UTF-32 (little-endian, with a byte-order mark)"),
    ],
)
def test_utf16_text_is_named_with_its_own_iconv(
    tmp_path: Path, encoding: str, prefix: bytes, name: str, described: str
) -> None:
    from attnsens.errors import FileFormatError
    from attnsens.train.data import read_documents

    path = tmp_path / "verse.txt"
    path.write_bytes(prefix + "Shall I compare thee to a summer's day?\n".encode(encoding))
    advice = f"is {described} text, not UTF-8; convert it: `iconv -f {name} -t UTF-8 verse.txt > verse.utf8.txt`"
    assert _one_line_error(["bounds", "builtin:lnfree", "--text", str(path)]) == f"--text {path} {advice}"
    with pytest.raises(FileFormatError) as caught:
        read_documents(path)
    assert str(caught.value) == f"training text {path} {advice}"


def test_latin1_and_utf8_text_are_unchanged(tmp_path: Path) -> None:
    from attnsens.cli.inputs import read_text_file

    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café naïve".encode("latin1"))
    assert _one_line_error(["bounds", "builtin:lnfree", "--text", str(latin)]).endswith(
        "`iconv -f latin1 -t utf-8 latin1.txt`"
    )
    plain = tmp_path / "plain.txt"
    plain.write_bytes("naïve\r\nline ☃\n".encode())
    assert read_text_file(plain) == "naïve\nline ☃\n"


def test_exact_support_help_and_docs_state_the_code_s_constants() -> None:
    from attnsens.theta import certify
    from attnsens.theta._constants import ENUMERATED_AFTER_PROOFS
    from attnsens.theta.certificate import EXACT_SUPPORT_MAX, MITM_MAX_SUPPORT

    root = Path(__file__).resolve().parents[3]
    default = f"rows of up to {ENUMERATED_AFTER_PROOFS} keys on the CPU ({MITM_MAX_SUPPORT} on the GPU and torch paths)"
    for command in ("theta", "audit"):
        result = runner.invoke(app, [command, "--help"], terminal_width=400)
        help_text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
        assert f"({MITM_MAX_SUPPORT}–{EXACT_SUPPORT_MAX};" in help_text
        assert f"Default: {default}" in help_text
    index = " ".join((root / "docs" / "index.md").read_text(encoding="utf-8").split())
    assert f"Rows of up to {ENUMERATED_AFTER_PROOFS} keys are always exact ({MITM_MAX_SUPPORT} on the GPU" in index
    # What the help says is what the certificate does by default.
    rows = torch.softmax(3 * torch.randn(400, ENUMERATED_AFTER_PROOFS, generator=torch.Generator().manual_seed(0)), -1)
    assert bool(certify(rows).exact.all())
    short = rows[:, :MITM_MAX_SUPPORT] / rows[:, :MITM_MAX_SUPPORT].sum(-1, keepdim=True)
    assert bool(certify(short, backend="torch").exact.all())


def test_theta_bounds_above_one_are_shown_as_one_with_a_note(tmp_path: Path) -> None:
    from attnsens.cli.app import format_theta_lower, theta_footnote

    assert format_theta_lower(1.00000008) == ("1 †", "above 1")
    assert format_theta_lower(-2.2e-16) == ("-2.2e-16 †", "below 0")
    assert format_theta_lower(0.99999987) == ("0.99999987", None)
    assert theta_footnote({None}) is None

    path = tmp_path / "over.npy"  # float32 rows summing to 1 + 6e-8: θ of the stored row is above 1
    np.save(path, np.array([[0.25, 0.25, 0.25, 0.25000006]] * 3, dtype=np.float32))
    shown = runner.invoke(app, ["theta", str(path)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    values = re.findall(r"θ lower bound \w+\s*│\s*(\S+ ?†?)\s*│", shown.stdout)
    assert values and all(value.strip() == "1 †" for value in values)
    note = " ".join(shown.stdout.split("┘")[-1].split())
    assert note.startswith("† θ of a probability row lies in [0, 1]")
    assert "lower bounds above 1 are shown as 1, still lower bounds" in note
    raw = runner.invoke(app, ["theta", str(path), "--json"])
    assert '"min": 1.00000005960464' in raw.stdout


def test_theta_bounds_within_range_have_no_note(tmp_path: Path) -> None:
    path = tmp_path / "p.npy"
    np.save(path, _rows(5, 7).numpy())
    shown = runner.invoke(app, ["theta", str(path)], terminal_width=200)
    assert shown.exit_code == 0 and "†" not in shown.stdout
