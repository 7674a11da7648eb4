"""The bounds pipeline: LayerWeights → bounds table; safetensors layout round trip; the ``bounds`` CLI."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from attnsens.cli import app
from attnsens.errors import FileFormatError
from attnsens.store.layer_weights import load_layer_weights, save_layer_weights
from attnsens.store.parquet import conform, read_table
from attnsens.study.bounds import bound_model
from tests.unit.geometry.tiny_layers import tiny_layers

FAST = {"seq_len": 7, "n_queries": 3, "iterations": 6}


@pytest.mark.parametrize(
    "kwargs",
    [{"placement": "pre"}, {"placement": "post"},
     {"placement": "pre", "gated": True, "norm": "rmsnorm", "rotary": True, "n_kv_head": 1, "biases": False},
     {"placement": "pre", "out_norms": True, "gated": True, "norm": "rmsnorm", "rotary": True},
     {"placement": "none", "out_norms": True, "gated": True, "norm": "rmsnorm", "rotary": True}],
)  # fmt: skip
def test_bound_model_is_sound_and_fits_the_schema(kwargs: dict) -> None:
    layers = tiny_layers(**kwargs, n_layer=2)
    table = bound_model(layers, **FAST)
    conform(table, "bounds")  # raises on unknown columns or wrong dtypes
    layer_rows = table[table["head"] == -1]
    head_rows = table[table["head"] >= 0]
    assert len(layer_rows) == 2 and len(head_rows) == 2 * layers[0].attention.n_head
    for row in layer_rows.to_dict("records"):
        assert row["mha_jacobian_estimate"] <= row["mha_local_jacobian_upper_bound"]
        assert row["mha_local_jacobian_upper_bound"] <= row["mha_local_paper_form_upper_bound"] * (1 + 1e-12)
        assert row["mha_local_paper_form_upper_bound"] <= row["mha_length_dependent_upper_bound"]
        assert row["block_jacobian_estimate"] <= row["residual_jacobian_upper_bound"]
        assert row["residual_jacobian_upper_bound"] <= row["block_lipschitz_upper_bound"]
        assert row["tightness_ratio"] >= 1
        if kwargs["placement"] != "none":
            assert 0 <= row["ln_condition_fraction"] <= 1
    labels = {"pre": "sandwich", "none": "post_sublayer"} if kwargs.get("out_norms") else {"pre": "pre_ln"}
    assert set(layer_rows["norm_placement"]) == {labels.get(kwargs["placement"], "post_ln")}
    if kwargs["placement"] == "pre":
        assert (layer_rows["mha_local_jacobian_upper_bound"] <= layer_rows["mha_lipschitz_upper_bound"]).all()
    assert (head_rows["theta_tilde"] <= 1 + 1e-12).all()


def test_safetensors_layout_round_trip(tmp_path) -> None:
    layers = tiny_layers("pre", gated=True, norm="rmsnorm", rotary=True, n_kv_head=1, biases=False)
    path = save_layer_weights(layers, tmp_path / "w.safetensors")
    loaded = load_layer_weights(path)
    assert len(loaded) == len(layers)
    for a, b in zip(layers, loaded, strict=True):
        torch.testing.assert_close(a.attention.w_k, b.attention.w_k)
        torch.testing.assert_close(a.mlp.w_gate, b.mlp.w_gate)
        assert a.attention.rotary == b.attention.rotary and a.attn_norm.kind == b.attn_norm.kind
        assert b.attention.b_q is None and a.placement == b.placement
    with pytest.raises(FileFormatError):
        load_layer_weights(tmp_path / "missing.safetensors")


def test_cli_bounds_on_a_weights_file(tmp_path) -> None:
    path = save_layer_weights(tiny_layers("post", n_layer=2), tmp_path / "tiny.safetensors")
    runner = CliRunner()
    args = ["bounds", str(path), "--seq-len", "6", "--queries", "2", "--iterations", "4"]
    result = runner.invoke(app, [*args, "--json", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["norm"] == "block_rms"
    layer_records = [r for r in payload["records"] if r["head"] == -1]
    assert [r["layer"] for r in layer_records] == [0, 1]
    stored = read_table(tmp_path / "out" / "bounds.parquet")
    assert len(stored) == len(payload["records"])
    verified = runner.invoke(app, ["verify", str(tmp_path / "out")])  # recorded in the folder's manifest
    assert verified.exit_code == 0 and "1 unit(s) match manifest.json" in verified.output
    table_result = runner.invoke(app, args)
    assert table_result.exit_code == 0 and "certified bounds of tiny.safetensors" in table_result.output


def test_cli_bounds_placements_are_opt_in_and_threads_are_restored(tmp_path, monkeypatch) -> None:
    """The pre/post-LN estimates (three more Jacobians per layer) run only with --placements; --threads sets torch's
    thread count for the bounds alone, and bound_model runs under it."""
    import attnsens.study.bounds as study_bounds

    seen = []
    original = study_bounds.bound_model

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(study_bounds, "bound_model", recording)
    path = save_layer_weights(tiny_layers("pre", n_layer=1), tmp_path / "tiny.safetensors")
    args = ["bounds", str(path), "--seq-len", "5", "--queries", "2", "--iterations", "2", "--json"]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        plain = CliRunner().invoke(app, args)
        assert torch.get_num_threads() == 2
        compared = CliRunner().invoke(app, [*args, "--placements", "--threads", "2"])
    finally:
        torch.set_num_threads(before)
    assert plain.exit_code == 0 and compared.exit_code == 0, plain.output + compared.output
    assert seen == [1, 2]
    plain_row = next(r for r in json.loads(plain.output)["records"] if r["head"] == -1)
    compared_row = next(r for r in json.loads(compared.output)["records"] if r["head"] == -1)
    assert plain_row.get("pre_ln_residual_jacobian_estimate") is None
    assert compared_row["pre_ln_residual_jacobian_estimate"] > 0


def test_cli_bounds_reports_domain_errors(tmp_path) -> None:
    result = CliRunner().invoke(app, ["bounds", str(tmp_path / "absent.safetensors")])
    assert result.exit_code == 1
    assert "does not exist" in result.output


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_bound_model_on_an_own_gpt_adapter(norm: str) -> None:
    """The adapter path: layer inputs from the real model; the reference block forward reproduces them."""
    from attnsens.geometry.layers import block_forward
    from attnsens.models import load
    from attnsens.train.model import GPT, preset

    torch.manual_seed(0)
    adapter = load(GPT(preset("tiny", n_layer=2, d_model=24, n_head=2, vocab_size=50, max_positions=16, norm=norm)))
    input_ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(0))
    inputs = adapter.layer_inputs(input_ids)
    torch.testing.assert_close(
        block_forward(inputs[0].block_input.double(), adapter.layers[0]), inputs[1].block_input.double(),
        rtol=1e-4, atol=1e-5,
    )  # fmt: skip
    table = bound_model(adapter, input_ids, n_queries=3, iterations=5, compare_placements=False)
    layer_rows = table[table["head"] == -1]
    assert list(layer_rows["layer"]) == [0, 1]
    assert (layer_rows["mha_jacobian_estimate"] <= layer_rows["mha_local_jacobian_upper_bound"]).all()
    assert (layer_rows["block_jacobian_estimate"] <= layer_rows["residual_jacobian_upper_bound"]).all()


def _saved_with_tokenizer(model: torch.nn.Module, directory) -> str:
    """``model`` saved with a word-level tokenizer over its vocabulary, loadable by ``attnsens bounds DIR``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(model.config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0").save_pretrained(directory)
    model.save_pretrained(directory)
    return str(directory)


def test_cli_bounds_gates_a_model_directory(tmp_path) -> None:
    from tests.unit.models.tiny_models import tiny_model

    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{i % 50}" for i in range(3, 40)), encoding="utf-8")
    args = ["--text", str(text), "--seq-len", "12", "--queries", "2", "--iterations", "3", "--json"]
    bounded = CliRunner().invoke(app, ["bounds", _saved_with_tokenizer(tiny_model("mistral"), tmp_path / "m"), *args])
    assert bounded.exit_code == 0, bounded.output
    assert [r["layer"] for r in json.loads(bounded.output)["records"] if r["head"] == -1] == [0, 1]
    audit_only = _saved_with_tokenizer(tiny_model("deepseek_v3"), tmp_path / "s")
    refused = CliRunner().invoke(app, ["bounds", audit_only, *args])
    assert refused.exit_code == 1
    assert "has no block layout" in refused.output and "Traceback" not in refused.output


def test_bound_model_returns_exactly_the_bounds_table_columns() -> None:
    """Records are built through the schema: every column in order, none extra (post-LN lacks the pre-LN
    expansion remainder, which is then null)."""
    from attnsens.store.schema import BOUNDS

    frame = bound_model(tiny_layers("post", n_layer=2), seq_len=8)
    assert tuple(frame.columns) == BOUNDS.names
    assert frame["expansion_remainder_upper_bound"].isna().all()


def test_schema_refuses_a_misspelt_field() -> None:
    from attnsens.errors import ConfigError
    from attnsens.store.schema import BOUNDS

    with pytest.raises(ConfigError, match="mha_local_jacobian_uper_bound"):
        BOUNDS.frame([{"run_id": "r", "mha_local_jacobian_uper_bound": 1.0}])
