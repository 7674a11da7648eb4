"""Families of the declarative layout table (models/layouts.py) and the BERT-layout encoders: the gate passes on
each, mutations are refused, families the geometry cannot bound are refused by name while their rows stay
auditable."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import attnsens.models as M
from attnsens.capture import RowSelection, capture_row_statistics
from attnsens.errors import InputError, UnsupportedModelError, WeightsFidelityError
from attnsens.geometry.layers import norm_forward
from attnsens.models.fidelity import FIELDS, IDENTIFICATION_FIELDS
from attnsens.models.hf import is_vision, split_bias, split_heads
from attnsens.models.layouts import alibi_slopes, mpt_alibi_slopes
from attnsens.study.bounds import bound_model
from tests.unit.models.tiny_models import (
    DECODER_FAMILIES,
    ENCODER_FAMILIES,
    MORE_LAYOUT_FAMILIES,
    OUT_NORM_FAMILIES,
    VOCAB,
    eager_attentions,
    tiny_model,
)

IDS = torch.randint(2, VOCAB, (2, 13), generator=torch.Generator().manual_seed(7))
WINDOWS = {"mistral": [5, 5], "qwen2": [None, 5], "qwen3": [None, None], "phi3": [5, 5], "gemma": [None, None],
           "gemma2": [5, None], "gemma3_text": [5, None], "olmo2": [None, None], "opt": [None, None],
           "opt_post": [None, None], "gptj": [None, None], "bloom": [None, None], "mpt": [None, None],
           "phi": [None, None], "stablelm": [None, None], "starcoder2": [5, 5], "cohere": [None, None],
           "ministral": [5, None], "seed_oss": [None, None], "internlm3": [None, None],
           "olmo3": [5, None], "gpt_bigcode": [None, None], "smollm3": [5, None], "helium": [None, None],
           "ernie4_5": [None, None], "vaultgemma": [5, None], "glm": [None, None], "glm4": [None, None],
           "cohere2": [5, None], "biogpt": [None, None], "granite": [None, None],
           "olmo": [None, None]}  # fmt: skip
OUT_NORM_FIELDS = {"attn_out_norm", "mlp_out_norm"}


EAGER_ONLY = ("gemma2", "vaultgemma", "bloom", "mpt")  # transformers has no sdpa path for them (softcaps, ALiBi)


def _model(family: str) -> torch.nn.Module:
    return tiny_model(family, attn_implementation="eager" if family in EAGER_ONLY else "sdpa")


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_every_decoder_family_passes_the_gate(family: str) -> None:
    adapter = M.load(_model(family))
    assert adapter.family == family.removesuffix("_post")
    assert [layer.attention.sliding_window for layer in adapter.layers] == WINDOWS[family]
    _, results = M.weights_fidelity(adapter, IDS)
    expected = set(FIELDS) - (set() if family in OUT_NORM_FAMILIES else OUT_NORM_FIELDS)
    if adapter.spec.placement == "none":  # OLMo 2: norms after the sublayers only
        expected -= {"attn_norm", "mlp_norm"}
    assert {r.field for r in results} == expected | set(IDENTIFICATION_FIELDS)
    assert max(r.relative_error for r in results) < 1e-5


def _assert_rows_are(reference: tuple[torch.Tensor, ...], adapter: M.ModelAdapter, inputs: torch.Tensor = IDS) -> None:
    """Every row the adapter recomputes on ``inputs`` is the model's own (``reference``: its eager attentions)."""
    for chunk in adapter.stream_attention(inputs):
        torch.testing.assert_close(chunk.probs, reference[chunk.layer], rtol=1e-5, atol=1e-6)


def _vit_and_its_attentions() -> tuple[torch.nn.Module, torch.Tensor, tuple[torch.Tensor, ...]]:
    """A tiny ViT (sdpa), two seeded 12 × 12 images and its eager attentions on them."""
    model = tiny_model("vit")
    pixels = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(pixel_values=pixels, output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    return model, pixels, attentions


def _set(adapter: M.ModelAdapter, layer: int, part: str, **changes) -> None:
    weights = adapter.layers[layer]
    adapter.layers[layer] = replace(weights, **{part: replace(getattr(weights, part), **changes)})


def _drop(adapter: M.ModelAdapter, layer: int, norm: str) -> None:
    adapter.layers[layer] = replace(adapter.layers[layer], **{norm: None})


def _swap(adapter: M.ModelAdapter, layer: int, first: str, second: str) -> None:
    weights = adapter.layers[layer]
    adapter.layers[layer] = replace(weights, **{first: getattr(weights, second), second: getattr(weights, first)})


def _uncentred(adapter: M.ModelAdapter) -> None:
    """Layer 0's query and key projections as the module holds them, without the LayerNorm QK-norm's centring
    folded in (``layouts._layernorm_qk``)."""
    w_q, w_k, _, b_q, b_k, _ = adapter._projections(adapter.blocks()[0].self_attn)
    n_head, n_kv = adapter.spec.n_head, adapter.spec.n_kv_head
    _set(adapter, 0, "attention", w_q=split_heads(w_q, n_head), b_q=split_bias(b_q, n_head),
         w_k=split_heads(w_k, n_kv), b_k=split_bias(b_k, n_kv))  # fmt: skip


def _reread(adapter: M.ModelAdapter, **layout: object) -> None:
    """Read every layer again under a layout with ``layout``'s changes."""
    adapter.layout = replace(adapter.layout, **layout)
    adapter._layers = None


MUTATIONS = {
    "bloom: no ALiBi": ("bloom", 0, "attention", lambda a: _set(a, 0, "attention", alibi_slopes=None)),
    "bloom: ALiBi slopes in reverse head order": ("bloom", 0, "attention", lambda a: _set(
        a, 0, "attention", alibi_slopes=a.layers[0].attention.alibi_slopes.flip(0))
    ),
    "mpt: ALiBi slopes doubled": ("mpt", 0, "attention", lambda a: _set(
        a, 0, "attention", alibi_slopes=a.layers[0].attention.alibi_slopes * 2)
    ),
    "phi: sequential residual": (
        "phi", 0, "mlp_norm", lambda a: a.layers.__setitem__(0, replace(a.layers[0], parallel_residual=False))
    ),
    "cohere: RoPE on halves": ("cohere", 1, "attention", lambda a: _set(
        a, 1, "attention", rotary=replace(a.layers[1].attention.rotary, interleaved=False))
    ),
    "starcoder2: no MLP bias": ("starcoder2", 0, "mlp", lambda a: _set(a, 0, "mlp", b_in=None)),
    "stablelm: rotary on every dimension": ("stablelm", 0, "attention", lambda a: _set(
        a, 0, "attention", rotary=replace(a.layers[0].attention.rotary, rotary_dim=a.layers[0].attention.d_head))
    ),
    "gemma2: no softcap": ("gemma2", 0, "attention", lambda a: _set(a, 0, "attention", softcap=None)),
    "gemma3: full layer with the sliding layers' RoPE": ("gemma3_text", 1, "attention", lambda a: _set(
        a, 1, "attention", rotary=a.layers[0].attention.rotary)
    ),
    "olmo2: the all-heads QK-norm read per head": ("olmo2", 0, "attention", lambda a: _set(
        a, 0, "attention", q_norm=replace(a.layers[0].attention.q_norm, gamma=a.layers[0].attention.q_norm.gamma[:6]),
        k_norm=replace(a.layers[0].attention.k_norm, gamma=a.layers[0].attention.k_norm.gamma[:6]))
    ),
    "mistral: no sliding window": ("mistral", 1, "attention", lambda a: _set(a, 1, "attention", sliding_window=None)),
    "qwen2: drop the key bias": ("qwen2", 0, "attention", lambda a: _set(a, 0, "attention", b_k=None)),
    "gemma: γ without the 1 + w offset": (
        "gemma", 1, "attn_norm", lambda a: _set(a, 1, "attn_norm", gamma=a.layers[1].attn_norm.gamma - 1.0)
    ),
    "qwen3: drop the QK-norm": ("qwen3", 0, "attention", lambda a: _set(a, 0, "attention", q_norm=None, k_norm=None)),
    "qwen3: keys normed with the queries' γ": (
        "qwen3", 1, "attention", lambda a: _set(a, 1, "attention", k_norm=a.layers[1].attention.q_norm)
    ),
    "phi3: gate and up halves swapped": (
        "phi3", 0, "mlp", lambda a: _set(a, 0, "mlp", w_in=a.layers[0].mlp.w_gate, w_gate=a.layers[0].mlp.w_in)
    ),
    "opt: query scaling not folded": (
        "opt", 0, "attention", lambda a: _set(a, 0, "attention", tau=a.layers[0].attention.tau * 2.0)
    ),
    "gptj: sequential residual": (
        "gptj", 0, "mlp_norm", lambda a: a.layers.__setitem__(0, replace(a.layers[0], parallel_residual=False))
    ),
    "gptj: rotate halves": ("gptj", 1, "attention", lambda a: _set(
        a, 1, "attention", rotary=replace(a.layers[1].attention.rotary, interleaved=False))
    ),
    "opt_post: drop the second norm's bias": ("opt_post", 1, "mlp_norm", lambda a: _set(a, 1, "mlp_norm", beta=None)),
    "gemma2: no norm after attention": ("gemma2", 0, "mlp_norm", lambda a: _drop(a, 0, "attn_out_norm")),
    "gemma2: attention output norm swapped with its pre-norm": (
        "gemma2", 1, "attn_norm", lambda a: _swap(a, 1, "attn_norm", "attn_out_norm")
    ),
    "gemma2: post_attention_layernorm read as the MLP pre-norm (as in Llama)": (
        "gemma2", 0, "attn_out_norm", lambda a: _swap(a, 0, "mlp_norm", "attn_out_norm")
    ),
    "gemma2: no norm after the MLP": ("gemma2", 1, "block", lambda a: _drop(a, 1, "mlp_out_norm")),
    "ministral: no window on its sliding layer": (
        "ministral", 0, "attention", lambda a: _set(a, 0, "attention", sliding_window=None)
    ),
    "olmo3: no window on its sliding layer": (
        "olmo3", 0, "attention", lambda a: _set(a, 0, "attention", sliding_window=None)
    ),
    "olmo3: a window on its full layer": ("olmo3", 1, "attention", lambda a: _set(a, 1, "attention", sliding_window=5)),
    "seed_oss: drop the query bias": ("seed_oss", 0, "attention", lambda a: _set(a, 0, "attention", b_q=None)),
    "smollm3: RoPE on its NoPE layer": (
        "smollm3", 1, "attention", lambda a: _set(a, 1, "attention", rotary=a.layers[0].attention.rotary)
    ),
    "helium: rotate halves": ("helium", 0, "attention", lambda a: _set(
        a, 0, "attention", rotary=replace(a.layers[0].attention.rotary, interleaved=False))
    ),
    "ernie4_5: rotate halves": ("ernie4_5", 1, "attention", lambda a: _set(
        a, 1, "attention", rotary=replace(a.layers[1].attention.rotary, interleaved=False))
    ),
    "glm: RoPE on every dimension": ("glm", 0, "attention", lambda a: _set(
        a, 0, "attention", rotary=replace(a.layers[0].attention.rotary, rotary_dim=8))
    ),
    "glm4: no norm after attention": ("glm4", 0, "mlp_norm", lambda a: _drop(a, 0, "attn_out_norm")),
    "cohere2: RoPE on its full layer": (
        "cohere2", 1, "attention", lambda a: _set(a, 1, "attention", rotary=a.layers[0].attention.rotary)
    ),
    "biogpt: drop the first norm's bias": ("biogpt", 0, "attn_norm", lambda a: _set(a, 0, "attn_norm", beta=None)),
    "vaultgemma: no softcap": ("vaultgemma", 0, "attention", lambda a: _set(a, 0, "attention", softcap=None)),
    "internlm3: drop the output bias": ("internlm3", 1, "attention", lambda a: _set(a, 1, "attention", b_o=None)),
    # Read as Llama (no residual multiplier): the attention output the MLP's norm sees is 1/0.22 times the model's.
    "granite: no residual multiplier": ("granite", 0, "mlp_norm", lambda a: _reread(a, residual_multiplier=None)),
    "olmo: a LayerNorm with a bias of 0.1": ("olmo", 1, "attn_norm", lambda a: _set(
        a, 1, "attn_norm", beta=torch.full_like(a.layers[1].attn_norm.gamma, 0.1))
    ),
    "granite: 1/√d_head in place of the attention multiplier": ("granite", 0, "attention", lambda a: _set(
        a, 0, "attention", tau=a.layers[0].attention.d_head ** 0.5)
    ),
}  # fmt: skip


def test_gpt_bigcode_reads_its_fused_qkv_as_its_config_lays_it_out() -> None:
    """Multi-query: [q; k; v] blocks, one head of keys and values; multi-head: per head, [head, (q, k, v), d_head]."""
    adapter = M.load(tiny_model("gpt_bigcode", multi_query=False))
    assert (adapter.spec.n_kv_head, adapter.layout.qkv_order) == (3, "heads")
    M.check_weights_fidelity(adapter, IDS)
    _reread(adapter, qkv_order="blocks")
    with pytest.raises(WeightsFidelityError):
        M.check_weights_fidelity(adapter, IDS)
    crossed = M.load(tiny_model("gpt_bigcode", multi_query=False, add_cross_attention=True))
    assert capture_row_statistics(crossed, IDS)  # its self-attention rows
    with pytest.raises(UnsupportedModelError, match="sets add_cross_attention"):
        M.check_weights_fidelity(crossed, IDS)


@pytest.mark.parametrize("name", MUTATIONS)
def test_the_gate_refuses_mutated_decoder_weights(name: str) -> None:
    family, layer, field, mutate = MUTATIONS[name]
    adapter = M.load(_model(family))
    mutate(adapter)
    with pytest.raises(WeightsFidelityError) as caught:
        M.check_weights_fidelity(adapter, IDS)
    assert (caught.value.family, caught.value.layer, caught.value.field) == (adapter.family, layer, field)


@pytest.mark.parametrize(
    "family",
    ["mistral", "ministral", "smollm3", "vaultgemma", "qwen2", "qwen3", "olmo2", "olmo3", "phi3", "bloom", "mpt"],
)
def test_rows_match_eager_attention_with_sliding_windows_and_qk_norm(family: str) -> None:
    model = _model(family)
    adapter = M.load(model)
    reference = eager_attentions(model, IDS)
    for chunk in adapter.stream_attention(IDS, chunk_size=6):
        index = chunk.query_positions[:, None, :, None].expand(-1, len(chunk.heads), -1, IDS.shape[1])
        expected = torch.gather(reference[chunk.layer], 2, index)
        torch.testing.assert_close(chunk.probs, expected, rtol=1e-5, atol=1e-6)
        window = adapter.attention_window(chunk.layer)
        if window is not None:
            assert int(chunk.n_keys.max()) == window
    blocks = capture_row_statistics(adapter, IDS, selection=RowSelection(chunk_size=6))
    n_keys = {block.layer: int(block.stats.n_keys.max()) for block in blocks}
    assert n_keys == {i: WINDOWS.get(family, [None, None])[i] or IDS.shape[1] for i in range(2)}


@pytest.mark.parametrize("family", ["olmo2", "olmo3", "gemma3_text", "glm4"])
def test_norms_after_the_sublayers_reproduce_what_the_model_adds_to_the_stream(family: str) -> None:
    """The norms the layout reads around the sublayers, checked on the model's own attention and MLP outputs
    (independently of attnsens' attention forward)."""
    adapter = M.load(_model(family))
    found: dict[int, dict[str, torch.Tensor]] = {0: {}, 1: {}}
    with adapter.inference(), adapter.layer_input_taps(lambda i, f, t: found[i].__setitem__(f, t.double())):
        with adapter.layer_output_taps(lambda i, f, t: found[i].__setitem__(f, t.double())):
            adapter.forward(IDS)
    close = {"rtol": 1e-5, "atol": 1e-5}
    for index, block in enumerate(adapter.blocks()):
        seen, lay = found[index], adapter.layout
        attn_norm, mlp_norm = adapter.read_norm(block, lay.attn_norm), adapter.read_norm(block, lay.mlp_norm)
        attn_out_norm, mlp_out_norm = (adapter.read_norm(block, name) for name in (lay.attn_out_norm, lay.mlp_out_norm))
        assert attn_out_norm is not None and mlp_out_norm is not None
        assert (attn_norm is None) == (family in ("olmo2", "olmo3")) == (adapter.spec.placement == "none")
        x, added = seen["block_input"], norm_forward(seen["attention_output"], attn_out_norm)
        torch.testing.assert_close(added, seen["normed_attention_output"], **close)
        if attn_norm is not None and mlp_norm is not None:
            torch.testing.assert_close(norm_forward(x, attn_norm), seen["attention_input"], **close)
            torch.testing.assert_close(norm_forward(x + added, mlp_norm), seen["mlp_input"], **close)
        else:
            torch.testing.assert_close(x + added, seen["mlp_input"], **close)
        mlp_added = norm_forward(seen["mlp_output"], mlp_out_norm)
        torch.testing.assert_close(x + added + mlp_added, seen["block_output"], **close)


def test_softcapped_attention_rows_match_eager_with_the_cap_that_matters() -> None:
    """A cap of 2 changes the rows (uncapped rows differ by more than 0.05), and the recomputed rows follow it."""
    capped = tiny_model("gemma2", attn_implementation="eager", attn_logit_softcapping=2.0)
    uncapped = tiny_model("gemma2", attn_implementation="eager", attn_logit_softcapping=None)
    reference = eager_attentions(capped, IDS)
    plain = eager_attentions(uncapped, IDS)
    assert max(float((r - p).abs().max()) for r, p in zip(reference, plain, strict=True)) > 0.05
    _assert_rows_are(reference, M.load(capped))


def test_a_sublayer_computed_outside_its_module_is_refused_by_name() -> None:
    """BLOOM with pretraining_tp > 1 and slow_but_exact multiplies slices of W_O and of the MLP's down projection
    outside their modules (and without their biases): the taps never see those outputs, so the gate refuses the
    bounds by name instead of failing on a missing tensor, while the rows stay auditable."""
    model = tiny_model("bloom", attn_implementation="eager", pretraining_tp=3, slow_but_exact=True)
    adapter = M.load(model)
    _assert_rows_are(eager_attentions(model, IDS), adapter)
    with pytest.raises(UnsupportedModelError, match="layer 0 computed its attention_output, mlp_output without"):
        M.check_weights_fidelity(adapter, IDS)
    M.check_weights_fidelity(M.load(tiny_model("bloom", attn_implementation="eager", pretraining_tp=3)), IDS)


def test_bloom_with_the_normed_input_as_its_residual_is_refused_by_name() -> None:
    model = tiny_model("bloom", attn_implementation="eager", apply_residual_connection_post_layernorm=True)
    adapter = M.load(model)
    _assert_rows_are(eager_attentions(model, IDS), adapter)
    with pytest.raises(UnsupportedModelError, match="bloom sets apply_residual_connection_post_layernorm"):
        M.check_weights_fidelity(adapter, IDS)


def test_gemma_3_is_read_without_the_softcap_it_never_applies() -> None:
    """Gemma 3 keeps attn_logit_softcapping in its config but never applies it: its rows are the uncapped model's,
    and the adapter reads no cap, so the gate passes (reading the config's cap, it refused a faithful model)."""
    capped = tiny_model("gemma3_text", attn_implementation="eager", attn_logit_softcapping=2.0)
    uncapped = tiny_model("gemma3_text", attn_implementation="eager", attn_logit_softcapping=None)
    for with_cap, without in zip(eager_attentions(capped, IDS), eager_attentions(uncapped, IDS), strict=True):
        torch.testing.assert_close(with_cap, without, rtol=0, atol=0)
    adapter = M.load(capped)
    assert [layer.attention.softcap for layer in adapter.layers] == [None, None]
    M.check_weights_fidelity(adapter, IDS)


@pytest.mark.parametrize(
    "family", ["mistral", "qwen3", "gemma2", "gemma3_text", "olmo2", "phi3", "opt_post", "bloom", "mpt"]
)
def test_bounds_of_decoder_families_hold(family: str) -> None:
    table = bound_model(M.load(_model(family)), IDS[:1], n_queries=4, iterations=8)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["mha_jacobian_estimate"] <= layer_rows["mha_local_jacobian_upper_bound"]).all()
    assert (layer_rows["block_jacobian_estimate"] <= layer_rows["residual_jacobian_upper_bound"]).all()


@pytest.mark.parametrize("family", ENCODER_FAMILIES)
def test_encoders_pass_the_gate_and_refuse_a_dropped_bias(family: str) -> None:
    adapter = M.load(tiny_model(family))
    assert (adapter.family, adapter.spec.placement, adapter.spec.causal) == (family, "post", False)
    _, results = M.weights_fidelity(adapter, IDS)
    assert max(r.relative_error for r in results) < 1e-5
    _set(adapter, 1, "mlp", b_in=None)
    with pytest.raises(WeightsFidelityError, match=f"{family} .*layer 1 mlp"):
        M.check_weights_fidelity(adapter, IDS)


def test_qk_norm_survives_the_weights_file_and_is_bounded_from_it(tmp_path) -> None:
    from attnsens.store.layer_weights import load_layer_weights, save_layer_weights

    layers = M.load(_model("qwen3")).layers
    back = load_layer_weights(save_layer_weights(layers, tmp_path / "w.safetensors"))
    for name in ("q_norm", "k_norm"):
        original, read = getattr(layers[1].attention, name), getattr(back[1].attention, name)
        assert read is not None and read.eps == original.eps
        torch.testing.assert_close(read.gamma, original.gamma)
    table = bound_model(back, seq_len=11, n_queries=2, iterations=3)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["mha_jacobian_estimate"] <= layer_rows["mha_local_jacobian_upper_bound"]).all()


def test_alibi_survives_the_weights_file(tmp_path) -> None:
    from attnsens.store.layer_weights import load_layer_weights, save_layer_weights

    layers = M.load(_model("bloom")).layers
    back = load_layer_weights(save_layer_weights(layers, tmp_path / "w.safetensors"))
    slopes = back[0].attention.alibi_slopes
    assert slopes is not None
    torch.testing.assert_close(slopes, layers[0].attention.alibi_slopes)
    table = bound_model(back, seq_len=9, n_queries=2, iterations=3)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["mha_jacobian_estimate"] <= layer_rows["mha_local_jacobian_upper_bound"]).all()


def test_mpt_with_clipped_qkv_is_audited_but_not_bounded() -> None:
    model = tiny_model("mpt", attn_implementation="eager", attn_config={"clip_qkv": 0.5})
    adapter = M.load(model)
    _assert_rows_are(eager_attentions(model, IDS), adapter)
    with pytest.raises(UnsupportedModelError, match="clamps its fused q, k, v"):
        bound_model(adapter, IDS[:1])


@pytest.mark.parametrize("n_head", [1, 3, 4, 6, 8, 12, 16, 20])
def test_alibi_slopes_are_the_families_own(n_head: int) -> None:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    bloom = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), n_head, torch.float32).view(n_head, 2)[:, 1]
    torch.testing.assert_close(alibi_slopes(n_head), bloom, rtol=0, atol=0)
    mpt = build_mpt_alibi_tensor(n_head, 2).view(n_head, 2)[:, 0].neg()
    torch.testing.assert_close(mpt_alibi_slopes(n_head), mpt, rtol=0, atol=0)


def test_stablelm_with_a_parallel_residual_reads_one_norm() -> None:
    model = tiny_model("stablelm", use_parallel_residual=True)
    adapter = M.load(model)
    assert adapter.layout.parallel_residual and adapter.layout.mlp_norm == "input_layernorm"
    M.check_weights_fidelity(adapter, IDS)


@pytest.mark.parametrize(("family", "flag"), [("stablelm", "qk_layernorm"), ("cohere", "use_qk_norm")])
def test_layernorm_qk_norms_with_weights_per_head_are_audited_but_not_bounded(family: str, flag: str) -> None:
    model = tiny_model(family, **{flag: True})
    adapter = M.load(model)
    _assert_rows_are(eager_attentions(model, IDS), adapter)
    with pytest.raises(UnsupportedModelError, match=f"{family} sets {flag}: a LayerNorm of each head"):
        bound_model(adapter, IDS[:1])


@pytest.mark.parametrize("parallel", [True, False])
def test_gpt_neox_reads_its_residual_arrangement_from_the_config(parallel: bool) -> None:
    """GPT-NeoX (Pythia) is a layout entry: the parallel block keeps both LayerNorms, the sequential one chains them."""
    adapter = M.load(tiny_model("gpt_neox", use_parallel_residual=parallel))
    assert all(layer.parallel_residual == parallel for layer in adapter.layers)
    assert adapter.layout.mlp_norm == "post_attention_layernorm"
    M.check_weights_fidelity(adapter, IDS)
    wrong = replace(adapter.layers[0], parallel_residual=not parallel)
    adapter.layers[0] = wrong
    with pytest.raises(WeightsFidelityError, match="layer 0"):
        M.check_weights_fidelity(adapter, IDS)


def test_vit_is_bounded_on_images() -> None:
    """ViT is a layout entry read on pixel_values: rows, the gate (on given images or a seeded probe image), a
    mutation swapping its two LayerNorms refused, and bounds that hold."""
    model, pixels, reference = _vit_and_its_attentions()
    adapter = M.load(model)
    _assert_rows_are(reference, adapter, pixels)
    _, results = M.weights_fidelity(adapter, pixels)
    assert max(r.relative_error for r in results) < 1e-5
    M.check_weights_fidelity(adapter)  # the seeded probe image
    table = bound_model(adapter, pixels[:1], n_queries=3, iterations=6)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["mha_jacobian_estimate"] <= layer_rows["mha_local_jacobian_upper_bound"]).all()
    assert (layer_rows["block_jacobian_estimate"] <= layer_rows["residual_jacobian_upper_bound"]).all()
    layer = adapter.layers[1]
    adapter.layers[1] = replace(layer, attn_norm=layer.mlp_norm, mlp_norm=layer.attn_norm)
    with pytest.raises(WeightsFidelityError, match="layer 1 attn_norm"):
        M.check_weights_fidelity(adapter, pixels)


def test_vit_images_are_audited_like_token_ids(tmp_path) -> None:
    """study.audit takes a vision model's pixel_values as it takes token ids: every row of every image, layer and
    head (10 positions: 9 patches and [CLS]), each row's p_max the model's own, in memory and to a folder."""
    import attnsens.study

    model, pixels, attentions = _vit_and_its_attentions()
    result = attnsens.study.audit(model, pixels)
    rows = result.rows.sort_values(["batch", "layer", "head", "query"])
    assert len(rows) == 2 * 2 * 3 * 10
    expected = torch.stack(attentions).amax(-1).permute(1, 0, 2, 3).reshape(-1)  # [batch, layer, head, position]
    torch.testing.assert_close(torch.tensor(rows["p_max"].to_numpy(), dtype=torch.float32), expected)
    on_disk = attnsens.study.audit(model, pixels[0], out_dir=tmp_path / "audit")
    assert on_disk.n_rows == 2 * 3 * 10
    with pytest.raises(InputError, match="drop attention_mask and seq_len"):
        attnsens.study.audit(model, pixels, seq_len=4)


@pytest.mark.parametrize("family", ["opt", "opt_post"])
def test_opt_without_an_elementwise_affine_norm_is_read_with_unit_gains(family: str) -> None:
    adapter = M.load(tiny_model(family, layer_norm_elementwise_affine=False))
    norm = adapter.layers[0].attn_norm
    assert norm is not None and norm.beta is None and bool((norm.gamma == 1).all())
    M.check_weights_fidelity(adapter, IDS)
    table = bound_model(adapter, IDS[:1], n_queries=3, iterations=4)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["mha_jacobian_estimate"] <= layer_rows["mha_local_jacobian_upper_bound"]).all()


@pytest.mark.parametrize(("family", "name"), [("mistral", "gelu_python"), ("qwen3", "gelu_accurate")])
def test_gelus_under_other_names_pass_the_gate(family: str, name: str) -> None:
    """transformers' gelu_python is the erf GELU and gelu_accurate the tanh GELU, under other names: read as those,
    the models pass the gate (they were refused as unknown activations)."""
    adapter = M.load(tiny_model(family, hidden_act=name))
    assert adapter.layers[0].mlp.activation == ("gelu" if name == "gelu_python" else "gelu_tanh")
    M.check_weights_fidelity(adapter, IDS)


def test_olmo_reads_the_epsilon_of_its_parameter_free_norms_from_the_layout_and_checks_it() -> None:
    """OLMo's LayerNorm keeps no ε (its forward passes 10⁻⁵ to F.layer_norm): the layout names it and each norm is
    checked on a probe of variance ε, where the gate, on activations of variance about 1, could not tell 10⁻⁶ from
    10⁻⁵; a clamp of q, k and v (clip_qkv) is audited but not bounded."""
    adapter = M.load(_model("olmo"))
    assert {layer.attn_norm.eps for layer in adapter.layers} == {1e-5}
    M.check_weights_fidelity(adapter, IDS)
    _reread(adapter, norm_eps=1e-6)
    with pytest.raises(UnsupportedModelError, match="does not compute with ε = 1e-06"):
        adapter.layers  # noqa: B018 - reading the layers checks the norms
    _reread(adapter, norm_eps=None)
    with pytest.raises(UnsupportedModelError, match="keeps no ε"):
        adapter.layers  # noqa: B018
    clipped = M.load(tiny_model("olmo", clip_qkv=0.5))
    assert capture_row_statistics(clipped, IDS)
    with pytest.raises(UnsupportedModelError, match="sets clip_qkv"):
        M.check_weights_fidelity(clipped, IDS)


def _inputs_and_attentions(model: torch.nn.Module) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Token ids (two seeded 12 × 12 images for a vision model) and the model's eager attentions on them."""
    if not is_vision(model.config):
        return IDS, eager_attentions(model, IDS)
    pixels = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(pixel_values=pixels, output_attentions=True).attentions
    model.set_attn_implementation(implementation)
    return pixels, attentions


@pytest.mark.parametrize("family", MORE_LAYOUT_FAMILIES)
def test_more_layout_families_pass_the_gate_and_audit_the_eager_rows(family: str) -> None:
    model = tiny_model(family)
    adapter = M.load(model)
    assert adapter.family == model.config.model_type
    inputs, reference = _inputs_and_attentions(model)
    for chunk in adapter.stream_attention(inputs):
        torch.testing.assert_close(chunk.probs, reference[chunk.layer], rtol=0, atol=1e-4)
    _, results = M.weights_fidelity(adapter, inputs)
    assert max(r.relative_error for r in results) < 1e-5


def test_exaone4_slides_and_rotates_on_its_sliding_layers_alone() -> None:
    """EXAONE 4 keeps sliding_window on every attention module; its full layer has no window and no RoPE, and
    reading RoPE there is refused by the gate."""
    model = tiny_model("exaone4", sliding_window=5)
    adapter = M.load(model)
    for chunk in adapter.stream_attention(IDS):
        torch.testing.assert_close(chunk.probs, eager_attentions(model, IDS)[chunk.layer], rtol=0, atol=1e-4)
    assert [layer.attention.sliding_window for layer in adapter.layers] == [5, 5, 5, None]
    assert [layer.attention.rotary is None for layer in adapter.layers] == [False, False, False, True]
    M.check_weights_fidelity(adapter, IDS)
    _set(adapter, 3, "attention", rotary=adapter.layers[0].attention.rotary)
    with pytest.raises(WeightsFidelityError, match="layer 3 attention"):
        M.check_weights_fidelity(adapter, IDS)


def test_dinov2_layer_scales_are_folded_into_the_output_projections() -> None:
    """With LayerScales away from 1, the folded weights pass the gate and the unscaled ones are refused."""
    model = tiny_model("dinov2")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("lambda1"):
                parameter.uniform_(0.2, 1.8)
    adapter = M.load(model)
    pixels, _ = _inputs_and_attentions(model)
    M.check_weights_fidelity(adapter, pixels)
    _set(adapter, 1, "mlp", w_out=model.encoder.layer[1].mlp.fc2.weight.detach().clone())
    with pytest.raises(WeightsFidelityError, match="layer 1 mlp"):
        M.check_weights_fidelity(adapter, pixels)


def test_dinov2_with_a_swiglu_mlp_is_read_gated_and_bounded() -> None:
    model = tiny_model("dinov2", use_swiglu_ffn=True)
    adapter = M.load(model)
    assert (adapter.layers[0].mlp.kind, adapter.layers[0].mlp.activation) == ("gated", "silu")
    pixels, reference = _inputs_and_attentions(model)
    _assert_rows_are(reference, adapter, pixels)
    M.check_weights_fidelity(adapter, pixels)
    table = bound_model(adapter, pixels[:1], n_queries=3, iterations=6)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["block_jacobian_estimate"] <= layer_rows["residual_jacobian_upper_bound"]).all()
    _set(adapter, 0, "mlp", w_in=adapter.layers[0].mlp.w_gate, w_gate=adapter.layers[0].mlp.w_in)
    with pytest.raises(WeightsFidelityError, match="layer 0 mlp"):
        M.check_weights_fidelity(adapter, pixels)


MORE_MUTATIONS = {
    "nemotron: γ without the 1 + w offset": (
        "nemotron", 0, "attn_norm", lambda a: _set(a, 0, "attn_norm", gamma=a.layers[0].attn_norm.gamma - 1.0)
    ),
    "arcee: relu in place of relu²": ("arcee", 0, "mlp", lambda a: _set(a, 0, "mlp", activation="relu")),
    "apertus: xIELU's α_p and α_n swapped": ("apertus", 0, "mlp", lambda a: _set(
        a, 0, "mlp", xielu=replace(a.layers[0].mlp.xielu, alpha_p=a.layers[0].mlp.xielu.alpha_n,
                                   alpha_n=a.layers[0].mlp.xielu.alpha_p))),
    "apertus: layer 1's xIELU read for layer 0": (
        "apertus", 0, "mlp", lambda a: _set(a, 0, "mlp", xielu=a.layers[1].mlp.xielu)
    ),
    "apertus: α_n without its β (softplus alone)": ("apertus", 1, "mlp", lambda a: _set(
        a, 1, "mlp", xielu=replace(a.layers[1].mlp.xielu,
                                   alpha_n=a.layers[1].mlp.xielu.alpha_n - a.layers[1].mlp.xielu.beta))),
    "persimmon: fused qkv read in [q; k; v] blocks": (
        "persimmon", 0, "attention", lambda a: _reread(a, qkv_order="blocks")
    ),
    "persimmon: the query LayerNorm's β dropped": ("persimmon", 0, "attention", lambda a: _set(
        a, 0, "attention", q_norm=replace(a.layers[0].attention.q_norm, beta=None))
    ),
    "persimmon: the LayerNorm QK-norm's centring not folded": ("persimmon", 0, "attention", _uncentred),
    "phi: the query LayerNorm's β dropped": ("phi", 0, "attention", lambda a: _set(
        a, 0, "attention", q_norm=replace(a.layers[0].attention.q_norm, beta=None))
    ),
    "phi: the LayerNorm QK-norm's centring not folded": ("phi", 0, "attention", _uncentred),
    "codegen: fused qkv read in [q; k; v] blocks": (
        "codegen", 0, "attention", lambda a: _reread(a, qkv_order="blocks")
    ),
    "clip_text: bidirectional": ("clip_text", 0, "attention", lambda a: _set(a, 0, "attention", causal=False)),
    "clip_text: gelu in place of quick_gelu": ("clip_text", 1, "mlp", lambda a: _set(a, 1, "mlp", activation="gelu")),
    "exaone4: QK-norm dropped": ("exaone4", 0, "attention", lambda a: _set(a, 0, "attention", q_norm=None)),
    "hunyuan_v1_dense: QK-norm read before RoPE": (
        "hunyuan_v1_dense", 0, "attention", lambda a: _reread(a, qk_norm_after_rotary=False)
    ),
    "modernbert: the window read one key too wide": ("modernbert", 1, "attention", lambda a: _set(
        a, 1, "attention", sliding_window=a.layers[1].attention.sliding_window + 1)
    ),
    "modernbert: the window read as causal": (
        "modernbert", 1, "attention", lambda a: _set(a, 1, "attention", causal=True)
    ),
    "modernbert: a norm invented before layer 0's attention": ("modernbert", 0, "attn_norm", lambda a: (
        a.layers.__setitem__(0, replace(a.layers[0], attn_norm=a.layers[0].mlp_norm)))
    ),
    "modernbert: the local RoPE θ on the global layer": ("modernbert", 0, "attention", lambda a: _set(
        a, 0, "attention", rotary=a.layers[1].attention.rotary)
    ),
    "modernbert: the GeGLU halves swapped": (
        "modernbert", 0, "mlp", lambda a: _set(a, 0, "mlp", w_in=a.layers[0].mlp.w_gate, w_gate=a.layers[0].mlp.w_in)
    ),
}  # fmt: skip


MUTATED_CONFIG: dict[str, dict[str, object]] = {"phi": {"qk_layernorm": True}}
"""Config changes of the families ``MORE_MUTATIONS`` mutates away from their defaults (Phi's LayerNorm QK-norm)."""


@pytest.mark.parametrize("name", MORE_MUTATIONS)
def test_the_gate_refuses_mutated_weights_of_more_layout_families(name: str) -> None:
    family, layer, field, mutate = MORE_MUTATIONS[name]
    adapter = M.load(tiny_model(family, **MUTATED_CONFIG.get(family, {})))
    mutate(adapter)
    with pytest.raises(WeightsFidelityError) as caught:
        M.check_weights_fidelity(adapter, IDS)
    assert (caught.value.layer, caught.value.field) == (layer, field)


HUNYUAN_ALPHA_ROPE = {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0}
"""The RoPE of HunYuan's checkpoints: "dynamic" with an α, a fixed NTK stretch of the base (``ntk_alpha``)."""


def test_hunyuan_alpha_rope_is_read_as_the_fixed_base_stretch_and_a_plain_dynamic_reading_is_refused() -> None:
    model = tiny_model("hunyuan_v1_dense", rope_parameters=HUNYUAN_ALPHA_ROPE)
    assert model.model.rotary_emb.rope_type == "ntk_alpha"
    adapter = M.load(model)
    rotary = adapter.layers[0].attention.rotary
    assert rotary is not None and rotary.rope_type == "default" and rotary.base == 10000.0 * 1000.0 ** (6 / 4)
    M.check_weights_fidelity(adapter, IDS)
    _reread(adapter, rotary_alpha=False)  # transformers' dynamic NTK, which leaves the base as it is up to P
    with pytest.raises(WeightsFidelityError) as caught:
        M.check_weights_fidelity(adapter, IDS)
    assert (caught.value.layer, caught.value.field) == (0, "attention")


def test_hunyuan_with_a_rope_attention_factor_is_refused_by_name() -> None:
    """yarn scales cos/sin by m ≈ 1.14 here; a norm after RoPE divides it out (up to ε): no temperature change."""
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.1, "original_max_position_embeddings": 10}
    model = tiny_model("hunyuan_v1_dense", rope_parameters=yarn)
    assert model.model.rotary_emb.attention_scaling != 1.0
    with pytest.raises(UnsupportedModelError, match="attention factor"):
        M.load(model).read_layers()


def test_hunyuan_qk_norm_after_rope_survives_the_weights_file_and_is_bounded_from_it(tmp_path) -> None:
    from attnsens.store.layer_weights import load_layer_weights, save_layer_weights

    layers = M.load(tiny_model("hunyuan_v1_dense")).layers
    assert all(layer.attention.qk_norm_after_rotary for layer in layers)
    back = load_layer_weights(save_layer_weights(layers, tmp_path / "w.safetensors"))
    assert all(layer.attention.qk_norm_after_rotary for layer in back)
    table = bound_model(back, seq_len=11, n_queries=2, iterations=3)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["mha_jacobian_estimate"] <= layer_rows["mha_local_jacobian_upper_bound"]).all()


def test_apertus_reads_each_layers_xielu_as_its_module_applies_it(tmp_path) -> None:
    """α_p = softplus(alpha_p), α_n = β + softplus(alpha_n), β and ε of each layer's own module (drawn per layer by
    the test model), kept by the weights file and bounded from it."""
    from attnsens.store.layer_weights import load_layer_weights, save_layer_weights

    model = tiny_model("apertus")
    layers = M.load(model).layers
    softplus = torch.nn.functional.softplus
    for block, layer in zip(model.model.layers, layers, strict=True):
        act = block.mlp.act_fn
        with torch.no_grad():
            expected = (softplus(act.alpha_p), act.beta + softplus(act.alpha_n), act.beta, act.eps)
        assert layer.mlp.xielu is not None
        read = (layer.mlp.xielu.alpha_p, layer.mlp.xielu.alpha_n, layer.mlp.xielu.beta, layer.mlp.xielu.eps)
        assert read == tuple(float(value) for value in expected)
    assert layers[0].mlp.xielu != layers[1].mlp.xielu
    back = load_layer_weights(save_layer_weights(layers, tmp_path / "w.safetensors"))
    assert [layer.mlp.xielu for layer in back] == [layer.mlp.xielu for layer in layers]
    table = bound_model(back, seq_len=11, n_queries=2, iterations=3)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["block_jacobian_estimate"] <= layer_rows["residual_jacobian_upper_bound"]).all()
    assert (layer_rows["block_lipschitz_upper_bound"] == float("inf")).all()  # xIELU jumps at 0 (ε = −10⁻⁶)


def test_modernbert_attention_reads_its_stream_at_layer_0_and_sees_keys_within_its_window() -> None:
    """ModernBERT's layer 0 has no norm before its attention (an nn.Identity) and its sliding layer a window on both
    sides of each query: the normalized weights say so, and the reference attention's rows on the model's own
    attention inputs are the model's eager rows, zero exactly outside |i − j| ≤ local_attention // 2."""
    from attnsens.geometry.attention import mha_forward

    model = tiny_model("modernbert")
    adapter = M.load(model)
    first, sliding = adapter.layers
    assert (adapter.spec.placement, first.attn_norm is None, sliding.attn_norm is not None) == ("pre", True, True)
    assert [layer.attention.sliding_window for layer in adapter.layers] == [None, model.config.sliding_window + 1]
    assert [layer.attention.rotary.base for layer in adapter.layers] == [160_000.0, 10_000.0]
    seen: dict[int, torch.Tensor] = {}
    with (
        adapter.inference(),
        adapter.layer_input_taps(
            lambda i, field, t: seen.__setitem__(i, t.double()) if field == "attention_input" else None
        ),
    ):
        adapter.forward(IDS)
    reference = eager_attentions(model, IDS)
    distance = (torch.arange(13)[:, None] - torch.arange(13)[None, :]).abs()
    for index, layer in enumerate(adapter.layers):
        rows = mha_forward(seen[index], layer.attention).probabilities
        torch.testing.assert_close(rows, reference[index].double(), rtol=1e-5, atol=1e-6)
    outside = distance > model.config.sliding_window
    assert bool((reference[1][..., outside] == 0).all()) and bool((reference[0][..., outside] > 0).all())


def test_modernbert_survives_the_weights_file_and_is_bounded_from_it(tmp_path) -> None:
    """A layer whose only pre-norm is the MLP's and a bidirectional window go through the weights file."""
    from attnsens.store.layer_weights import load_layer_weights, save_layer_weights

    layers = M.load(tiny_model("modernbert")).layers
    back = load_layer_weights(save_layer_weights(layers, tmp_path / "w.safetensors"))
    assert [(layer.attn_norm is None, layer.attention.causal, layer.attention.sliding_window) for layer in back] == [
        (layer.attn_norm is None, layer.attention.causal, layer.attention.sliding_window) for layer in layers
    ]
    assert [layer.mlp_pre_norm().kind for layer in back] == ["layernorm", "layernorm"]  # layer 0's with no N1 beside
    table = bound_model(back, seq_len=11, n_queries=2, iterations=3)
    layer_rows = table[table["head"] == -1]
    assert (layer_rows["mha_jacobian_estimate"] <= layer_rows["mha_local_jacobian_upper_bound"]).all()
    assert (layer_rows["block_jacobian_estimate"] <= layer_rows["residual_jacobian_upper_bound"]).all()


@pytest.mark.parametrize("family", ["persimmon", "phi"])
def test_a_layernorm_qk_norm_shared_by_the_heads_is_read_centred_with_its_beta_and_bounded(family: str) -> None:
    """Persimmon's default and Phi's ``qk_layernorm``: RMSNorm of the centred projection plus β, which the gate
    checks against the module (the mutations drop β or the centring), and bounded above the estimate."""
    model = tiny_model(family, qk_layernorm=True)
    adapter = M.load(model)
    _assert_rows_are(eager_attentions(model, IDS), adapter)
    attention = adapter.layers[0].attention
    assert attention.q_norm is not None and attention.q_norm.beta is not None and attention.k_norm is not None
    heads = attention.w_q.to(torch.float64).sum(dim=-2)  # each head's rows sum to 0 once centred
    assert heads.abs().max() < 1e-5 * attention.w_q.abs().max()
    M.check_weights_fidelity(adapter, IDS)
    table = bound_model(adapter, IDS[:1], n_queries=4, iterations=8)
    layers = table[table["head"] == -1]
    assert (layers["mha_jacobian_estimate"] <= layers["mha_local_jacobian_upper_bound"]).all()
    assert (layers["mha_local_jacobian_upper_bound"] <= layers["mha_lipschitz_upper_bound"]).all()
