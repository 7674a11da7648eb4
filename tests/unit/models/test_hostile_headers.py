"""Hostile model files: a GGUF header or a config.json that claims more than its file holds is refused in one line
naming the file and what is wrong, before transformers parses it (no traceback, no allocation, no memory advice)."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.errors import FileFormatError
from attnsens.models import gguf_cache
from attnsens.models.loading import check_declared_size, context_length
from tests.helpers.gguf import write_tiny_llama_gguf


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def _gguf(tensors: int, entries: int, body: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, entries) + body


ARCHITECTURE = _string("general.architecture") + struct.pack("<I", 8) + _string("llama")

HOSTILE_GGUF = {
    "absurd_counts": (
        _gguf(2**63, 2**63),
        "claims 9,223,372,036,854,775,808 metadata entries, more than the 0 bytes left",
    ),
    "long_string": (_gguf(0, 1, struct.pack("<Q", 10**12) + b"general.architecture"), "claims 1,000,000,000,000 bytes"),
    "long_array": (
        _gguf(0, 2, ARCHITECTURE + _string("tokens") + struct.pack("<IIQ", 9, 8, 2**62)),
        "claims 4,611,686,018,427,387,904 array elements",
    ),
    "absurd_tensor_count": (_gguf(2**40, 1, ARCHITECTURE), "claims 1,099,511,627,776 tensors"),
    "huge_tensor": (
        _gguf(1, 1, ARCHITECTURE + _string("token_embd.weight") + struct.pack("<IQQIQ", 2, 10**12, 10**6, 0, 0)),
        "tensor 'token_embd.weight' claims 1,000,000,000,000,000,000 elements",
    ),
    "deep_dimensions": (
        _gguf(1, 1, ARCHITECTURE + _string("w") + struct.pack("<I", 2**31) + bytes(16)),
        "tensor 'w' claims 2147483648 dimensions",
    ),
    "unknown_type": (_gguf(0, 1, _string("k") + struct.pack("<I", 77)), "unknown GGUF metadata type 77"),
    "cut_short": (_gguf(0, 1, _string("general.architecture")), "ends early"),
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSENS_MODEL_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("case", sorted(HOSTILE_GGUF))
def test_a_hostile_gguf_header_is_one_line_naming_the_file_and_the_fault(tmp_path, cache, case):
    data, fault = HOSTILE_GGUF[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(data)
    with pytest.raises(FileFormatError) as refused:
        gguf_cache.check_gguf_header(path)
    assert str(path) in str(refused.value) and fault in str(refused.value)
    assert context_length(str(path)) is None  # the context check leaves the refusal to the load
    result = CliRunner().invoke(app, ["audit", str(path), "--seq-len", "8", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: GGUF file") and str(path) in lines[0], result.output
    assert fault in lines[0] and "memory" not in lines[0]
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_a_well_formed_gguf_passes_the_header_check(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(path)
    gguf_cache.check_gguf_header(path)
    assert gguf_cache.gguf_context_length(path) == 64


def _folder(tmp_path, name: str, vocab_size: int, embedding: tuple[int, int]) -> str:
    folder = tmp_path / name
    folder.mkdir()
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size, "hidden_size": 8,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"model.embed_tokens.weight": torch.zeros(embedding)}, str(folder / "model.safetensors"))
    return str(folder)


@pytest.mark.parametrize("embedding", [(4, 8), (0, 8)], ids=["small_embedding", "no_embedding"])
def test_a_config_with_a_vocabulary_of_a_trillion_tokens_is_one_line(tmp_path, embedding):
    folder = _folder(tmp_path, "huge", 10**12, embedding)
    result = CliRunner().invoke(app, ["bounds", folder, "--seq-len", "4"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert f"config.json of {folder!r} declares a vocabulary of 1,000,000,000,000 tokens" in lines[0]
    assert "memory" not in lines[0] and "Traceback" not in result.output


def test_a_smaller_embedding_missing_from_the_weights_is_refused_after_the_load(tmp_path):
    folder = _folder(tmp_path, "missing", 10**6, (0, 8))
    (tmp_path / "missing" / "model.safetensors").unlink()
    save_file({"model.norm.weight": torch.ones(8)}, str(tmp_path / "missing" / "model.safetensors"))
    result = CliRunner().invoke(app, ["bounds", folder, "--seq-len", "4"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "declares a vocabulary of 1,000,000 tokens × 8 dimensions" in lines[0], result.output


def test_weights_whose_shapes_differ_from_the_config_are_one_line(tmp_path):
    folder = _folder(tmp_path, "mixed", 16, (5, 8))
    result = CliRunner().invoke(app, ["bounds", folder, "--seq-len", "4"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "their shapes differ from those its configuration declares" in lines[0], result.output


def test_the_size_check_leaves_plausible_and_remote_configs_alone(tmp_path):
    class Config:
        vocab_size, hidden_size = 16, 8

    check_declared_size(Config(), _folder(tmp_path, "fine", 16, (16, 8)), "fine")
    check_declared_size(Config(), "org/hub-id", "hub")
    Config.vocab_size = 10**12
    check_declared_size(Config(), str(tmp_path / "missing"), "missing")
    with pytest.raises(FileFormatError, match="declares a vocabulary of 1,000,000,000,000 tokens"):
        check_declared_size(Config(), str(tmp_path / "fine"), "fine")
