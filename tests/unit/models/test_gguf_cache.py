"""A GGUF file is converted once into a safetensors folder; later loads read the folder (models/gguf_cache.py)."""

from __future__ import annotations

import os

import pytest
import torch

import attnsens.models as M
from attnsens.models import gguf_cache
from attnsens.models.loading import context_length
from tests.helpers.gguf import write_tiny_llama_gguf


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSENS_MODEL_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(path)
    return path


def _refuse_gguf_parse(monkeypatch) -> None:
    import gguf

    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF file was parsed again")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)


def test_second_load_reads_the_converted_folder_with_the_same_weights(tiny_gguf, monkeypatch) -> None:
    first = M.load(str(tiny_gguf))
    folder = gguf_cache.cached_conversion(tiny_gguf)
    assert folder is not None and (folder / "model.safetensors").is_file()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no staging folder left behind
    _refuse_gguf_parse(monkeypatch)
    second = M.load(str(tiny_gguf))
    assert context_length(str(tiny_gguf)) == 64
    for a, b in zip(first.module.state_dict().values(), second.module.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    ids = torch.tensor([[1, 4, 2, 9, 3]])
    with torch.no_grad():
        assert torch.equal(first.module(ids).last_hidden_state, second.module(ids).last_hidden_state)


def test_the_conversion_parses_the_file_once_and_converts_the_same_weights(tiny_gguf, monkeypatch) -> None:
    """transformers reads the file three times (configuration, tokenizer, weights); during the conversion the
    reads share one parse and one tensor-name table, the weights are those of a plain transformers load, and
    gguf's own functions are back in place afterwards."""
    import gguf
    from transformers import AutoModel

    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map
    parses, tables = [], []

    def counting_reader(path, mode="r"):
        parses.append(str(path))
        return original_reader(path, mode)

    def counting_map(arch, n_blocks):
        tables.append((arch, n_blocks))
        return original_map(arch, n_blocks)

    monkeypatch.setattr(gguf, "GGUFReader", counting_reader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", counting_map)
    converted = M.load(str(tiny_gguf))
    assert len(parses) == 1 and len(tables) == 1
    assert gguf.GGUFReader is counting_reader and gguf.get_tensor_name_map is counting_map  # restored
    parses.clear()
    plain = AutoModel.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    assert len(parses) >= 2  # what the shared parse saves
    for a, b in zip(converted.module.state_dict().values(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_the_folder_keeps_float32_whatever_dtype_the_first_load_asked_for(tiny_gguf) -> None:
    from safetensors import safe_open

    adapter = M.load(str(tiny_gguf), dtype=torch.bfloat16)
    assert next(adapter.module.parameters()).dtype == torch.bfloat16
    folder = gguf_cache.cached_conversion(tiny_gguf)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        assert {handle.get_tensor(key).dtype for key in handle.keys()} == {torch.float32}


def test_an_edited_file_gets_a_new_folder(tiny_gguf) -> None:
    before = gguf_cache.converted_folder(tiny_gguf)
    status = tiny_gguf.stat()
    os.utime(tiny_gguf, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))
    assert gguf_cache.converted_folder(tiny_gguf) != before


def test_a_failed_conversion_leaves_nothing_and_an_unwritable_root_costs_nothing(tiny_gguf, tmp_path, monkeypatch):
    def fail(folder):
        (folder / "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    assert gguf_cache.save_conversion(tiny_gguf, fail) is None
    assert gguf_cache.cached_conversion(tiny_gguf) is None
    assert list((tmp_path / "cache").iterdir()) == []
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ATTNSENS_MODEL_CACHE", str(blocker / "cache"))
    assert M.load(str(tiny_gguf)).spec.n_layer == 1
    assert gguf_cache.cached_conversion(tiny_gguf) is None


def test_the_context_length_is_read_from_the_header_alone(tmp_path) -> None:
    """The header read skips every other field (string arrays, scalars of each width) and agrees with the
    configuration transformers builds from the whole file; a truncated header gives None, not an error."""
    import gguf
    from transformers import AutoConfig

    path = tmp_path / "fields.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"] * 50)
    writer.add_array("test.scores", [0.5, 1.5])
    writer.add_uint16("test.u16", 7)
    writer.add_float64("test.f64", 2.5)
    writer.add_context_length(123)
    writer.add_embedding_length(16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert gguf_cache.gguf_context_length(path) == 123
    tiny = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(tiny)
    expected = AutoConfig.from_pretrained(str(tmp_path), gguf_file="tiny.gguf").max_position_embeddings
    assert gguf_cache.gguf_context_length(tiny) == expected == 64
    truncated = tmp_path / "cut" / "cut.gguf"
    truncated.parent.mkdir()
    truncated.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match="ends early"):
        gguf_cache.gguf_context_length(truncated)
    assert context_length(str(truncated)) is None
