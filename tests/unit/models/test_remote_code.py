"""No model folder's Python runs unless asked: every transformers call passes ``trust_remote_code`` explicitly,
nothing is read from stdin, and a folder that names code of its own is refused in one line naming the flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import attnsens.models as M
from attnsens.errors import UnsupportedModelError
from attnsens.models.loading import context_length
from tests.helpers.remote_code import _calls_without_the_keyword


def test_every_loading_call_passes_trust_remote_code_explicitly() -> None:
    """Left out, transformers asks "Do you wish to run the custom code? [y/N]" on stdin and runs it on "y"."""
    assert _calls_without_the_keyword() == []


def test_the_call_site_check_finds_a_call_without_the_keyword(tmp_path, monkeypatch) -> None:
    (tmp_path / "bad.py").write_text("AutoConfig.from_pretrained(path, revision=None)\n")
    monkeypatch.setattr("tests.helpers.remote_code.SOURCE", tmp_path)
    assert _calls_without_the_keyword() == ["bad.py:1 from_pretrained"]


def _hostile_folder(root: Path, marker: Path, *, file: str = "config.json") -> Path:
    """A gpt2 folder whose ``file`` maps a class to configuration_evil.py, which writes ``marker`` when imported."""
    folder = root / "hostile"
    folder.mkdir()
    config = {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "vocab_size": 11, "n_positions": 32}
    mapping = {"auto_map": {"AutoConfig": "configuration_evil.EvilConfig", "AutoTokenizer": ["tok_evil.T", None]}}
    (folder / "config.json").write_text(json.dumps({**config, **(mapping if file == "config.json" else {})}))
    if file != "config.json":
        (folder / file).write_text(json.dumps(mapping))
    (folder / "configuration_evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import GPT2Config\nclass EvilConfig(GPT2Config):\n    pass\n"
    )
    return folder


@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json"])
def test_a_folder_naming_its_own_code_is_refused_without_running_it(tmp_path, file) -> None:
    marker = tmp_path / "marker"
    folder = _hostile_folder(tmp_path, marker, file=file)
    with pytest.raises(UnsupportedModelError, match=rf"{file} \(auto_map\).*--trust-remote-code") as caught:
        M.load(str(folder))
    assert "\n" not in str(caught.value)
    with pytest.raises(UnsupportedModelError, match="--trust-remote-code"):
        context_length(str(folder))
    assert not marker.exists()


def test_a_hub_repository_with_code_is_refused_naming_the_flag(monkeypatch) -> None:
    """transformers refuses a hub repository's code when told False; attnsens says so in its own words."""
    import transformers

    def refuse(source, *, trust_remote_code, **_):
        assert trust_remote_code is False
        raise ValueError(f"The repository {source} contains custom code ... pass `trust_remote_code=True`")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", refuse)
    with pytest.raises(UnsupportedModelError, match=r"'org/custom' runs Python code.*--trust-remote-code"):
        M.load("org/custom")


def test_the_cli_refuses_a_hostile_folder_with_yes_on_stdin(tmp_path) -> None:
    """``yes y | attnsens audit ./folder``: the answer on stdin is never read, the folder's code never runs."""
    marker = tmp_path / "marker"
    _hostile_folder(tmp_path, marker)
    (tmp_path / "t.txt").write_text("To be, or not to be, that is the question. " * 8)
    command = [sys.executable, "-m", "attnsens", "audit", "./hostile", "--text", "t.txt", "--out", "o"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for extra in (["--seq-len", "16"], []):  # refused before the load (context check), and by the load itself
        result = subprocess.run(
            command + extra, cwd=tmp_path, input="y\n" * 16, capture_output=True, text=True, env=env, timeout=300
        )
        assert result.returncode == 1, result.stderr
        assert not marker.exists()
        assert "--trust-remote-code" in result.stderr
        assert "Traceback" not in result.stderr and "[y/N]" not in result.stdout + result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
