"""Models larger than memory: a model loaded with a ``device_map`` that keeps some blocks on disk (accelerate's
big-model loading) audits the same rows and gets the same bounds as the model in memory, reading each offloaded
layer's weights only while that layer is read."""

from __future__ import annotations

import pytest
import torch

import attnsens.models as M
from attnsens.capture import capture_row_statistics
from attnsens.errors import ConfigError
from attnsens.models.offload import LayerSequence, is_offloaded
from attnsens.study.bounds import bound_model
from tests.unit.models.tiny_models import VOCAB, tiny_model

IDS = torch.randint(2, VOCAB, (2, 13), generator=torch.Generator().manual_seed(7))
ON_DISK = {"embed_tokens": "disk", "layers.0": "cpu", "layers.1": "disk", "layers.2": "disk", "layers.3": "cpu",
           "norm": "cpu", "rotary_emb": "cpu"}  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("llama")
    tiny_model("llama", num_hidden_layers=4).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def offloaded(saved: str, tmp_path_factory: pytest.TempPathFactory) -> M.ModelAdapter:
    return M.load(saved, device_map=ON_DISK, offload_folder=tmp_path_factory.mktemp("offload"))


def test_an_offloaded_model_keeps_its_blocks_on_disk_and_reads_them_layer_by_layer(offloaded) -> None:
    blocks = offloaded.module.layers
    assert is_offloaded(offloaded.module) and is_offloaded(blocks[1]) and not is_offloaded(blocks[0])
    assert offloaded.device == torch.device("cpu")
    layers = offloaded.layers
    assert isinstance(layers, LayerSequence) and len(layers) == 4
    w_q = layers[1].attention.w_q
    assert w_q.device.type == "cpu" and bool(w_q.abs().sum() > 0)  # read from disk while asked for
    assert blocks[1].self_attn.q_proj.weight.device.type == "meta"  # and dropped again


def test_rows_and_bounds_equal_those_of_the_model_in_memory(saved: str, offloaded) -> None:
    in_memory = M.load(saved)
    for a, b in zip(in_memory.stream_attention(IDS), offloaded.stream_attention(IDS), strict=True):
        assert torch.equal(a.probs, b.probs)
    for a, b in zip(capture_row_statistics(in_memory, IDS), capture_row_statistics(offloaded, IDS), strict=True):
        assert torch.equal(a.stats.theta_lower, b.stats.theta_lower) and torch.equal(a.stats.p_max, b.stats.p_max)
    expected = bound_model(in_memory, IDS[:1], n_queries=3, iterations=4)
    seen = bound_model(offloaded, IDS[:1], n_queries=3, iterations=4)
    numbers = expected.select_dtypes("number").columns
    assert len(expected) == 4 * (1 + in_memory.spec.n_head)
    assert expected[numbers].equals(seen[numbers])


def test_placement_applies_to_models_read_from_disk(saved: str) -> None:
    with pytest.raises(ConfigError, match="place the weights of a model read from a folder or the hub"):
        M.load(tiny_model("llama"), device_map="auto")
    with pytest.raises(ConfigError, match="without device"):
        M.load(saved, device_map="auto", device="cpu")
    with pytest.raises(ConfigError, match="'smollm2' is a model attnsens ships, loaded whole"):
        M.load("smollm2", device_map="auto")
    with pytest.raises(ConfigError, match=r"names foo, which .* does not place as a module; name .*embed_tokens"):
        M.load(saved, device_map={"foo": "cpu"})  # transformers would drop the map and load the model whole


def test_a_tied_weight_sent_to_disk_apart_from_its_twin_is_refused_in_one_line(tmp_path) -> None:
    from transformers import T5Config, T5Model

    from tests.unit.models.tiny_models import stock_config

    sizes = {"num_layers": 1, "num_heads": 2, "d_model": 16, "d_kv": 8, "d_ff": 24}
    config = stock_config(T5Config, **sizes, checkpoint_fields={"decoder_start_token_id": 0})
    T5Model(config).save_pretrained(tmp_path / "t5")  # its decoder's embedding is the encoder's, tied
    placed = {"shared": "cpu", "encoder": "cpu", "decoder": "disk"}
    with pytest.raises(ConfigError, match="cannot be offloaded apart from it; keep both tied modules off the disk"):
        M.load(str(tmp_path / "t5"), device_map=placed, offload_folder=tmp_path / "offload")


def test_the_audit_command_places_blocks_on_disk_and_removes_their_folder(saved: str, tmp_path) -> None:
    from typer.testing import CliRunner

    from attnsens.cli import app
    from attnsens.store import read_table

    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join(" ".join(str(int(t)) for t in row) for row in IDS))
    placed = ",".join(f"{module}={device}" for module, device in ON_DISK.items())
    runner = CliRunner()
    for out, extra in (("memory", []), ("disk", ["--device-map", placed])):
        done = runner.invoke(
            app, ["audit", saved, "--ids", str(ids), "--batch", "2", "--out", str(tmp_path / out), *extra]
        )
        assert done.exit_code == 0, done.output
    rows = [read_table(tmp_path / out / "rows").drop(columns="model") for out in ("memory", "disk")]
    assert rows[0].equals(rows[1])
    assert not list((tmp_path / "disk").glob(".offload-*"))  # the offload folder lived inside --out, and is gone
    done = runner.invoke(app, ["audit", saved, "--ids", str(ids), "--device-map", "layers.0"])
    assert done.exit_code != 0 and "is not MODULE=DEVICE" in done.output


def test_the_bounds_command_bounds_an_offloaded_model_as_the_model_in_memory(saved: str, tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from attnsens.cli import app

    placed = ",".join(f"{module}={device}" for module, device in ON_DISK.items())
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str(int(t)) for t in IDS[0]))
    command = ["bounds", saved, "--ids", str(ids), "--seq-len", "9", "--json"]
    runner = CliRunner()
    memory = runner.invoke(app, command)
    disk = runner.invoke(app, [*command, "--device-map", placed, "--offload-folder", str(tmp_path / "weights")])
    assert memory.exit_code == 0 and disk.exit_code == 0, disk.output
    records = [json.loads(done.stdout)["records"] for done in (memory, disk)]
    assert len(records[0]) == 4 * (1 + 6) and records[0] == records[1]
