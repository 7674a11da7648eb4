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
    result = CliRunner().invoke(app, ["bounds", str(folder)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
