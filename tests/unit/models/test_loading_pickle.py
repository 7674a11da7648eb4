"""A model folder whose weights are a pickle that torch.load(weights_only=True) refuses: one line, no traceback."""

from __future__ import annotations

import os
import pickle

import pytest
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.errors import FileFormatError
from attnsens.models import load
from tests.unit.models.tiny_models import tiny_model


class _Payload:
    def __reduce__(self):
        return (os.getcwd, ())


def test_an_unsafe_pickled_checkpoint_is_refused_in_one_line(tmp_path) -> None:
    folder = tmp_path / "model"
    tiny_model("gpt2").save_pretrained(folder, safe_serialization=False)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": _Payload()}, protocol=2))
    with pytest.raises(FileFormatError, match=r"cannot load the weights of .*safetensors"):
        load(str(folder))
    text = tmp_path / "text.txt"
    text.write_text("the king the queen " * 20)
    for command in (["bounds", str(folder)], ["audit", str(folder), "--text", str(text), "--out", str(tmp_path / "o")]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert isinstance(result.exception, SystemExit) and "cannot load the weights of" in result.output
    assert not (tmp_path / "o").exists()
