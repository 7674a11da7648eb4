"""attnsens.models.load: what it accepts, what it refuses, and that importing the package stays light."""

from __future__ import annotations

import pytest
import torch

import attnsens.models as M
from attnsens.errors import ConfigError, FileFormatError, InputError, UnsupportedModelError
from tests.imports import modules_loaded_by
from tests.unit.models.tiny_models import tiny_model


def test_unknown_family_lists_the_supported_ones() -> None:
    from transformers import GPTNeoConfig, GPTNeoModel

    config = GPTNeoConfig(num_layers=1, num_heads=2, hidden_size=8, vocab_size=11, attention_types=[[["global"], 1]])
    model = GPTNeoModel(config)
    listed = r"'gpt_neo'.*apertus, arcee, bamba, bert, biogpt, bloom, .*, falcon, .*, llama, .*, mpt, "
    with pytest.raises(UnsupportedModelError, match=listed):
        M.load(model)


def test_plain_torch_module_is_refused() -> None:
    with pytest.raises(UnsupportedModelError, match="neither a transformers PreTrainedModel"):
        M.load(torch.nn.Linear(3, 5))
    with pytest.raises(UnsupportedModelError, match="cannot load a int"):
        M.load(7)


def test_missing_paths_and_offline_ids_are_file_format_errors(tmp_path) -> None:
    with pytest.raises(FileFormatError, match="does not exist"):
        M.load(str(tmp_path / "absent.gguf"))
    with pytest.raises(FileFormatError, match="not a directory"):
        M.load(str(tmp_path / "absent"))
    with pytest.raises(FileFormatError, match="offline"):
        M.load("no-such-org/no-such-model")


def test_local_directory_round_trip(tmp_path) -> None:
    model = tiny_model("gpt2")
    model.save_pretrained(tmp_path)
    adapter = M.load(str(tmp_path))
    assert adapter.family == "gpt2"
    torch.testing.assert_close(adapter.layers[1].attention.w_o, M.load(model).layers[1].attention.w_o)


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_a_folder_without_tokenizer_files_loads_without_a_tokenizer(tmp_path, family) -> None:
    """transformers builds an empty tokenizer for some model types (Qwen2: one special token, every text → no ids);
    attnsens loads none, so text is refused by name instead of becoming an empty sequence."""
    from typer.testing import CliRunner

    from attnsens.cli import app

    tiny_model(family).save_pretrained(tmp_path / "model")
    adapter = M.load(str(tmp_path / "model"))
    assert adapter.tokenizer is None
    with pytest.raises(InputError, match="was loaded without a tokenizer"):
        adapter.encode("To be, or not to be")
    result = CliRunner().invoke(app, ["audit", str(tmp_path / "model"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "was loaded without a tokenizer (none beside its weights)" in result.output


def test_alias_registry_is_extensible() -> None:
    sentinel = M.load(tiny_model("bert"))
    M.register_alias("test:tiny-bert", lambda *, device, dtype: sentinel)
    try:
        assert M.load("test:tiny-bert") is sentinel
    finally:
        del M.ALIASES["test:tiny-bert"]
    assert {"smollm2", "minilm"} <= set(M.ALIASES)


def test_an_alias_is_registered_once() -> None:
    with pytest.raises(ConfigError, match="'smollm2' is already registered"):
        M.register_alias("smollm2", lambda *, device, dtype: None)
    loader = M.ALIASES["smollm2"]
    M.register_alias("smollm2", loader)  # the same loader again changes nothing
    assert M.ALIASES["smollm2"] is loader


def test_an_unknown_built_in_model_is_named_with_those_there_are() -> None:
    with pytest.raises(
        UnsupportedModelError, match="no built-in model 'builtin:lnfre'; the built-in models are builtin:lnfree"
    ):
        M.load("builtin:lnfre")


def test_the_own_gpt_is_recognised_by_its_class_wherever_it_is_defined() -> None:
    from attnsens.train.model import GPT, GPTConfig

    class Probe(GPT):  # a subclass defined outside attnsens.train
        pass

    adapter = M.load(Probe(GPTConfig(vocab_size=11, n_layer=1, n_head=2, d_model=8, max_positions=6)))
    assert adapter.family == "own_gpt" and len(adapter.layers) == 1


def test_adapter_passes_through_and_checks_inputs() -> None:
    adapter = M.load(tiny_model("gpt2"))
    assert M.load(adapter) is adapter
    with pytest.raises(Exception, match="exceeds the context"):
        adapter.layer_inputs(torch.zeros(1, 42, dtype=torch.long))
    with pytest.raises(Exception, match="integer token ids"):
        adapter.layer_inputs(torch.zeros(1, 4))
    with pytest.raises(Exception, match="layer selection"):
        list(adapter.stream_attention(torch.zeros(1, 4, dtype=torch.long), layers=[2]))


def test_importing_models_does_not_import_transformers() -> None:
    assert modules_loaded_by("attnsens.models, attnsens.capture", ("transformers",)) == []
