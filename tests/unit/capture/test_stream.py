"""Streaming capture: statistics of every selected row equal those of the eager attention rows, one chunk at a time."""

from __future__ import annotations

from dataclasses import fields

import pandas as pd
import pytest
import torch

import attnsens.capture as C
import attnsens.models as M
from attnsens.errors import ConfigError
from tests.unit.models.tiny_models import FAMILIES, VOCAB, eager_attentions, tiny_model


def _concat(blocks: list[C.RowBlock]) -> dict[str, torch.Tensor]:
    """All columns of the blocks, in (layer, batch, head, query) order whatever the chunking."""
    parts = [b.columns() for b in blocks]
    columns = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
    order = torch.argsort(
        ((columns["layer"] * 1000 + columns["batch"]) * 1000 + columns["head"]) * 1000 + columns["query"]
    )
    return {name: values[order] for name, values in columns.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_statistics_equal_those_of_eager_rows(family: str) -> None:
    model = tiny_model(family)
    adapter = M.load(model)
    ids = torch.randint(0, VOCAB, (2, 19))
    got = _concat(C.capture_row_statistics(adapter, ids, selection=C.RowSelection(chunk_size=6)))
    reference = eager_attentions(model, ids)
    layer_of, head_of, batch_of, query_of = got["layer"], got["head"], got["batch"], got["query"]
    probs = torch.stack(
        [reference[l][b, h, q] for l, h, b, q in zip(layer_of, head_of, batch_of, query_of, strict=True)]
    )
    n_keys = query_of + 1 if adapter.spec.causal else torch.full_like(query_of, 19)
    expected = C.row_statistics(probs, n_keys=n_keys)
    assert len(layer_of) == 2 * adapter.spec.n_head * 2 * 19
    for f in fields(expected):
        torch.testing.assert_close(got[f.name], getattr(expected, f.name), rtol=2e-5, atol=2e-6, msg=f.name)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_capture_takes_each_rows_entropy_from_its_logits(family: str, monkeypatch) -> None:
    """Every chunk of a capture of every row reaches the statistics with its logits, and the entropy from them
    agrees with −Σ p log p of the same rows within the rows' own rounding (docs/math.md §2.4)."""
    import attnsens.capture.stream as stream

    calls = []

    def checked(probs, *, n_keys=None, exact_support=None, logits=None):
        stats = C.row_statistics(probs, n_keys=n_keys, exact_support=exact_support, logits=logits)
        plain = C.row_statistics(probs, n_keys=n_keys, exact_support=exact_support)
        margin = 2 * 8 * 2.0**-24 * stats.row_sum + 1e-13
        calls.append((logits is not None, bool(((stats.entropy - plain.entropy).abs() <= margin).all())))
        return stats

    monkeypatch.setattr(stream, "row_statistics", checked)
    adapter = M.load(tiny_model(family))
    C.capture_row_statistics(adapter, torch.randint(0, VOCAB, (2, 40)), selection=C.RowSelection(chunk_size=7))
    assert len(calls) > 2 and all(with_logits and agree for with_logits, agree in calls)


def test_chunk_size_does_not_change_results_and_bounds_peak_rows(monkeypatch) -> None:
    adapter = M.load(tiny_model("llama"))
    ids = torch.randint(0, VOCAB, (2, 23))
    shapes = []
    import attnsens.models.attention as rows_module  # the one chunk loop, chunked_rows, calls _chunk_rows there

    original = rows_module._chunk_rows

    def spy(*args, **kwargs):
        probs, n_keys, key_start = original(*args, **kwargs)
        shapes.append((tuple(probs.shape), key_start))
        return probs, n_keys, key_start

    monkeypatch.setattr(rows_module, "_chunk_rows", spy)
    small = _concat(C.capture_row_statistics(adapter, ids, selection=C.RowSelection(chunk_size=4)))
    # One [batch, head, chunk, key] block at a time, over the keys the layer's own (causal) mask allows to some
    # row of the chunk: up to its last query, widened to a multiple of KEY_ALIGNMENT keys where the 23 allow.
    assert len(shapes) == 2 * 6
    aligned = [min(23, -(-4 * (i + 1) // rows_module.KEY_ALIGNMENT) * rows_module.KEY_ALIGNMENT) for i in range(5)]
    assert shapes[:6] == [((2, 6, 4, keys), 0) for keys in aligned] + [((2, 6, 3, 23), 0)]
    whole = _concat(C.capture_row_statistics(adapter, ids, selection=C.RowSelection(chunk_size=23)))
    # Rows are recomputed in float32, and a GEMM of 4 query rows may round differently from one of 23 on some
    # CPUs (different kernels by shape): the first layer's rows agree to a few float32 ulps, not bit for bit.
    first = small["layer"] == 0
    for name in small:
        torch.testing.assert_close(small[name][first], whole[name][first], rtol=1e-6, atol=1e-6, msg=name)
    # Each layer's output is computed from its chunks' rows (every row is captured), so that rounding reaches the
    # later layers' inputs too: there both chunkings agree with the model's own eager rows as closely as any
    # capture does (test_statistics_equal_those_of_eager_rows).
    reference = eager_attentions(adapter.module, ids)
    rows = torch.stack(
        [
            reference[l][b, h, q]
            for l, h, b, q in zip(*(small[k] for k in ("layer", "head", "batch", "query")), strict=True)
        ]
    )
    expected = C.row_statistics(rows, n_keys=small["query"] + 1)
    for got in (small, whole):
        for f in fields(expected):
            torch.testing.assert_close(got[f.name], getattr(expected, f.name), rtol=2e-5, atol=2e-6, msg=f.name)


@pytest.mark.parametrize("family", ["mistral", "qwen2", "bert"])
def test_chunks_cover_the_keys_the_mask_allows_and_argmax_counts_from_key_0(family: str) -> None:
    """Sliding windows of 5 keys (Mistral in both layers, Qwen2 in one) start a chunk's keys late, a left-padded
    batch as well; BERT (bidirectional) computes every key; every statistic, argmax included, is that of the
    model's own eager rows."""
    import attnsens.models.attention as rows_module

    model = tiny_model(family)
    adapter = M.load(model)
    ids = torch.randint(2, VOCAB, (2, 19), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 19, dtype=torch.long)
    mask[1, :4] = 0  # left padding: the second sequence's rows start at key 4
    got = _concat(
        C.capture_row_statistics(
            adapter, ids, attention_mask=mask, selection=C.RowSelection(query_start=4, chunk_size=6)
        )
    )
    reference = eager_attentions(model, ids, attention_mask=mask)
    layer_of, head_of, batch_of, query_of = got["layer"], got["head"], got["batch"], got["query"]
    probs = torch.stack(
        [reference[l][b, h, q] for l, h, b, q in zip(layer_of, head_of, batch_of, query_of, strict=True)]
    )
    expected = C.row_statistics(probs, n_keys=got["n_keys"])
    for f in fields(expected):
        torch.testing.assert_close(got[f.name], getattr(expected, f.name), rtol=2e-5, atol=2e-6, msg=f.name)
    # The narrowed chunks of a layer's (tapped) query and key, a windowed layer where there is one: each holds
    # exactly the keys the mask allows to some of its rows, and every key outside that span is exactly 0 in the
    # full rows.
    kept = {}
    with adapter.inference(), adapter.query_key_tap(lambda layer, q, k, call: kept.setdefault(layer, (q, k, call))):
        adapter.forward(ids, mask)
    windowed = [layer for layer in kept if adapter.attention_window(layer) is not None]
    query, key, call = kept[windowed[0] if windowed else 0]
    assert bool(windowed) == (family != "bert")
    positions = torch.arange(4, 19).expand(2, -1)
    spans = [(0, 6), (6, 12), (12, 15)]
    heads = tuple(range(adapter.spec.n_head))
    key_mask = rows_module.key_padding_mask_of(mask, ids)
    narrow = list(rows_module.chunked_rows(query, key, call, positions, spans, heads=heads,
                                           key_padding_mask=key_mask, narrow_keys=True))  # fmt: skip
    full = list(rows_module.chunked_rows(query, key, call, positions, spans, heads=heads, key_padding_mask=key_mask))
    starts = []
    for chunk, whole in zip(narrow, full, strict=True):
        assert whole.key_start == 0 and whole.probs.shape[-1] == 19
        start, stop = chunk.key_start, chunk.key_start + chunk.probs.shape[-1]
        starts.append(start)
        # The narrowed scores come from a matmul of another shape, which may sum the head dimension in another
        # order: a few float32 ulps of the scores, ~1.5e-6 relative in the rows on some processors (a mask error
        # would move a probability by its own size).
        torch.testing.assert_close(chunk.probs, whole.probs[..., start:stop], rtol=1e-5, atol=1e-7)
        assert torch.equal(chunk.n_keys, whole.n_keys)
        outside = torch.cat([whole.probs[..., :start], whole.probs[..., stop:]], dim=-1)
        assert torch.equal(outside, torch.zeros_like(outside))
        inside = whole.probs[..., start:stop]
        assert bool((inside[..., 0] > 0).any()) and bool((inside[..., -1] > 0).any())  # the span is the tightest
    if family == "bert":
        assert [(c.key_start, c.probs.shape[-1]) for c in narrow] == [(0, 19)] * 3
    else:
        assert starts[-1] > 0  # the window leaves early keys out of late chunks


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_chunks_in_a_workspace_equal_fresh_ones_and_reuse_its_memory(softcap: float | None) -> None:
    """The capture's workspace: the same rows under a causal additive mask with a bias (ALiBi-like) and left
    padding, with and without a softcap (to float32 rounding: its one product per key head stacks the query heads,
    and a GEMM may round by shape; the masked keys exactly 0); every chunk in the same two buffers; a chunk too
    large, or a subset of heads, falls back to fresh tensors."""
    from attnsens.models.attention import AttentionCall, RowWorkspace, chunked_rows

    generator = torch.Generator().manual_seed(5)
    query, key = torch.randn(2, 6, 23, 5, generator=generator), torch.randn(2, 2, 23, 5, generator=generator)
    distance = torch.arange(23).view(23, 1) - torch.arange(23).view(1, 23)
    mask = torch.where(distance >= 0, -0.3 * distance.float(), torch.finfo(torch.float32).min)
    mask = mask.expand(2, 1, 23, 23).clone()
    mask[1, :, :, :3] = torch.finfo(torch.float32).min
    call = AttentionCall(tau=5**0.5, mask=mask, softcap=softcap)
    positions = torch.arange(3, 23).expand(2, -1)
    spans = [(0, 7), (7, 14), (14, 20)]
    workspace = RowWorkspace(2 * 6 * 7 * 23)
    every = tuple(range(6))
    fresh = list(chunked_rows(query, key, call, positions, spans, heads=every, key_padding_mask=None, narrow_keys=True))
    pointers = set()
    reused = chunked_rows(query, key, call, positions, spans, heads=every, key_padding_mask=None, narrow_keys=True,
                          workspace=workspace)  # fmt: skip
    for chunk, expected in zip(reused, fresh, strict=True):
        assert chunk.key_start == expected.key_start
        torch.testing.assert_close(chunk.probs, expected.probs, rtol=1e-6, atol=1e-7)
        assert torch.equal(chunk.probs == 0, expected.probs == 0)
        pointers.add(chunk.probs.data_ptr())
    assert len(pointers) == 1
    small = RowWorkspace(10)  # too small: fresh tensors, the same rows
    for heads, space in ((every, small), ((4, 1), workspace)):
        chunks = chunked_rows(query, key, call, positions, spans, heads=heads, key_padding_mask=None, narrow_keys=True,
                              workspace=space)  # fmt: skip
        for chunk, expected in zip(chunks, fresh, strict=True):
            assert torch.equal(chunk.probs, expected.probs[:, list(heads)])


def test_rows_of_a_query_slice_read_its_queries_by_offset() -> None:
    """A slice of a layer run in query slices passes its own queries only (``query_start``): the rows are those of
    the whole query tensor, bit for bit, in chunks that need not start at the slice's first query; positions
    outside the slice's queries are refused, not read from the wrong row."""
    from attnsens.errors import ShapeError
    from attnsens.models.attention import AttentionCall, attention_rows, chunked_rows

    generator = torch.Generator().manual_seed(8)
    query, key = torch.randn(1, 4, 30, 8, generator=generator), torch.randn(1, 2, 30, 8, generator=generator)
    call = AttentionCall(tau=8**0.5, causal=True)
    positions = torch.arange(30).unsqueeze(0)
    spans = [(12, 15), (15, 20)]
    whole = list(chunked_rows(query, key, call, positions, spans, heads=tuple(range(4)), key_padding_mask=None,
                              narrow_keys=True))  # fmt: skip
    part = list(chunked_rows(query[:, :, 12:20], key, call, positions, spans, heads=tuple(range(4)),
                             key_padding_mask=None, narrow_keys=True, query_start=12))  # fmt: skip
    for got, expected in zip(part, whole, strict=True):
        assert got.key_start == expected.key_start
        assert torch.equal(got.probs, expected.probs)
    for rows, start in (((11, 12), 12), ((19, 20), 12), ((0, 1), -1)):
        with pytest.raises(ShapeError, match="query positions"):
            attention_rows(query[:, :, 12:20], key, tau=1.0, query_positions=torch.tensor([rows]), allowed=None,
                           query_start=start)  # fmt: skip


def test_selection_layers_heads_and_range() -> None:
    adapter = M.load(tiny_model("gpt2"))
    ids = torch.randint(0, VOCAB, (1, 20))
    selection = C.RowSelection(layers=(1,), heads=(2, 0), query_start=5, query_stop=9)
    got = _concat(C.capture_row_statistics(adapter, ids, selection=selection))
    assert set(got["layer"].tolist()) == {1}
    assert set(got["head"].tolist()) == {0, 2}
    assert sorted(set(got["query"].tolist())) == [5, 6, 7, 8]
    assert torch.equal(got["n_keys"], got["query"] + 1)


def test_sampled_positions_are_seeded_sorted_and_differ_between_sequences() -> None:
    selection = C.RowSelection(query_start=3, sample_per_sequence=5, seed=7)
    first = selection.query_positions(4, 40)
    assert torch.equal(first, selection.query_positions(4, 40))
    assert torch.equal(first, first.sort(dim=-1).values)
    assert first.min() >= 3 and first.max() < 40
    assert len({tuple(row) for row in first.tolist()}) > 1
    assert not torch.equal(first, C.RowSelection(query_start=3, sample_per_sequence=5, seed=8).query_positions(4, 40))


def test_bad_selections_raise_config_errors() -> None:
    with pytest.raises(ConfigError, match="query_stop"):
        C.RowSelection(query_start=5, query_stop=5)
    with pytest.raises(ConfigError, match="cannot sample 9"):
        C.RowSelection(sample_per_sequence=9).query_positions(1, 8)
    with pytest.raises(ConfigError, match="no query positions"):
        C.RowSelection(query_start=10).query_positions(1, 8)


def test_accumulator_agrees_with_the_store_summary() -> None:
    from attnsens.store import summarize_rows

    adapter = M.load(tiny_model("gpt_neox"))
    ids = torch.randint(0, VOCAB, (3, 17))
    accumulator = C.RowSummaryAccumulator()
    C.capture_row_statistics(adapter, ids, on_block=accumulator.update)
    computed = pd.DataFrame(accumulator.compute())
    columns = {k: v.numpy() for k, v in _concat(C.capture_row_statistics(adapter, ids)).items()}
    rows = pd.DataFrame(columns).assign(run_id="r", model="m", step=0, seed=0)
    summary = summarize_rows(rows, level="head")
    for name in (
        "n_rows",
        "theta_lower_median",
        "theta_lower_q10",
        "fraction_dominant",
        "p_max_median",
        "entropy_mean",
    ):
        torch.testing.assert_close(
            torch.tensor(computed[name].to_numpy(dtype=float)), torch.tensor(summary[name].to_numpy(dtype=float))
        )


def test_chunks_fit_the_memory_budget_and_stop_at_the_last_causal_key() -> None:
    from attnsens.capture.selection import MASK_BYTES_PER_KEY, WORKING_BYTES_PER_SCORE

    positions = torch.arange(7).expand(3, -1)
    per_row = 3 * (5 * WORKING_BYTES_PER_SCORE + MASK_BYTES_PER_KEY) * 7  # [3, 5, ·, 7] scores, probs and mask
    bounds = C.RowSelection(max_memory=per_row * 2).chunk_bounds(positions, heads=5, n=7, causal=False)
    assert bounds == [(0, 2, 7), (2, 4, 7), (4, 6, 7), (6, 7, 7)]
    assert C.RowSelection(max_memory=1).chunk_bounds(positions, heads=5, n=7, causal=False)[0] == (0, 1, 7)
    # Causal: a chunk computes keys 0..its last query only, so the budget admits more of the early rows.
    causal = C.RowSelection(max_memory=per_row * 2).chunk_bounds(positions, heads=5, n=7, causal=True)
    assert causal == [(0, 3, 3), (3, 5, 5), (5, 7, 7)]
    assert C.RowSelection(chunk_size=2).chunk_bounds(positions, heads=5, n=7, causal=True)[1] == (2, 4, 4)
    # Default budget, one SmolLM2 sequence at its context: 128 MiB / (9 · 8 B + 2 B) / 8192 keys = 221 rows fit,
    # while 16 MiB of float32 scores hold 16 MiB / (9 · 4 B) / 8192 keys = 56 rows: the scores limit decides, and
    # the chunks' scores stay within 16 MiB at every length.
    full = C.RowSelection().chunk_bounds(torch.arange(8192).unsqueeze(0), heads=9, n=8192, causal=False)
    assert full[0] == (0, 56, 8192)
    assert C.RowSelection(max_memory=2**20).chunk_bounds(torch.arange(8192).unsqueeze(0), heads=9, n=8192,
                                                         causal=False)[0] == (0, 1, 8192)  # fmt: skip
    # At 2048 keys the scores limit is 227 rows (1/4 of the rows is 512); at 4096 keys 113.
    for n, rows in ((2048, 227), (4096, 113), (8192, 56)):
        bounds = C.RowSelection().chunk_bounds(torch.arange(n).unsqueeze(0), heads=9, n=n, causal=False)
        assert bounds[0][1] == rows
        assert max(stop - first for first, stop, _ in bounds) * 9 * n * 4 <= 16 * 2**20
    # At 512 keys 1/4 of the rows is 128 (of 512), below the scores limit.
    assert C.RowSelection().chunk_bounds(torch.arange(512).unsqueeze(0), heads=9, n=512, causal=False)[0][1] == 128
    # At least 64 rows under the speed limits (60 rows: one chunk), whatever the fraction.
    assert C.RowSelection().chunk_bounds(torch.arange(60).unsqueeze(0), heads=9, n=60, causal=False) == [(0, 60, 60)]
    with pytest.raises(ConfigError, match="max_memory"):
        C.RowSelection(max_memory=0)


def _deepseek_latent_attention() -> torch.nn.Module:
    """DeepSeek-V3's multi-head latent attention: queries and keys of 12 (8 + 4 rotary), values of 6 per head."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from tests.unit.models.tiny_models import spread_weights

    torch.manual_seed(0)
    config = DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=40, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, first_k_dense_replace=3, kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=6, max_position_embeddings=41, attn_implementation="sdpa",
    )  # fmt: skip
    model = DeepseekV3ForCausalLM(config)
    spread_weights(model)
    return model.eval()


FUSED_OUTPUT_MODELS = {
    "llama": lambda: tiny_model("llama", num_hidden_layers=3),
    # A rotary of 0.4 × 4 dimensions: Phi rotates int(1.6) = 1 of them against a cos/sin of 2, whose broadcast
    # widens the queries and keys to 5 while the values keep 4.
    "phi, queries wider than values": lambda: tiny_model(
        "phi",
        num_hidden_layers=3,
        num_attention_heads=3,
        num_key_value_heads=3,
        hidden_size=12,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.4},
    ),
    "deepseek_v3, latent attention": _deepseek_latent_attention,
}


@pytest.mark.parametrize("name", FUSED_OUTPUT_MODELS)
def test_a_layer_whose_every_row_is_captured_runs_on_them(name: str) -> None:
    """Where every row of every head is captured (float32, no padding), each layer's output is computed from the
    rows the capture reduced (softmax(rows)·V) in place of the layer's own attention call: the hidden state the
    forward under the capture hands to its last layer (the pass stops after that layer's rows) is the plain
    (sdpa) forward's, to float32 rounding, also where the values' head size is not the queries'. Sampled rows, a
    subset of heads or a padded batch leave the layer's own call in place."""
    import attnsens.capture.stream as stream

    model = FUSED_OUTPUT_MODELS[name]()
    adapter = M.load(model)
    ids = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(4))
    last_layer = adapter.base.layers[-1]  # what the adapter runs: the model without its head

    def into_last_layer(run) -> torch.Tensor:
        inputs = []
        handle = last_layer.register_forward_pre_hook(lambda _m, args: inputs.append(args[0].detach().clone()))
        try:
            run()
        finally:
            handle.remove()
        return inputs[0]

    with torch.no_grad():
        plain = into_last_layer(lambda: adapter.base(input_ids=ids))

    def captured(**kwargs) -> tuple[torch.Tensor, int]:
        calls = 0
        original = stream.attention_output

        def spy(*args):
            nonlocal calls
            calls += 1
            return original(*args)

        stream.attention_output = spy
        try:
            hidden = into_last_layer(lambda: C.capture_row_statistics(adapter, ids, **kwargs))
        finally:
            stream.attention_output = original
        return hidden, calls

    padded = torch.ones(2, 23, dtype=torch.long)
    padded[1, :3] = 0  # the second sequence left-padded by three tokens
    fused, calls = captured(selection=C.RowSelection(chunk_size=6))
    assert calls == (adapter.spec.n_layer - 1) * 4  # four chunks of each layer but the last, whose output no one reads
    # On the scale of the residual stream, as a final norm would put it: float32 rounding.
    scale = plain.pow(2).mean().sqrt()
    torch.testing.assert_close(fused / scale, plain / scale, rtol=1e-5, atol=1e-5)
    for kwargs in (
        {"selection": C.RowSelection(sample_per_sequence=5)},
        {"selection": C.RowSelection(heads=(0, 1))},
        {"attention_mask": padded, "selection": C.RowSelection(query_start=3)},
    ):
        assert captured(**kwargs)[1] == 0, kwargs


def test_the_forward_pass_stops_after_the_last_layer_asked_for() -> None:
    """Capturing layers 0 and 1 of a four-layer model runs layers 0 and 1 only (the rest of the pass would change
    nothing that is captured), with the same rows as a capture of every layer; stream_attention likewise."""
    adapter = M.load(tiny_model("llama", num_hidden_layers=4))
    ids = torch.randint(0, VOCAB, (1, 19), generator=torch.Generator().manual_seed(8))
    ran: list[int] = []
    handles = [
        layer.register_forward_pre_hook(lambda _m, _a, index=index: ran.append(index))
        for index, layer in enumerate(adapter.base.layers)
    ]
    try:
        every = C.capture_row_statistics(adapter, ids)
        assert ran == [0, 1, 2, 3]  # the last layer's rows are reduced before the pass stops, after its attention
        ran.clear()
        first_two = C.capture_row_statistics(adapter, ids, selection=C.RowSelection(layers=(0, 1)))
        assert ran == [0, 1]
        ran.clear()
        chunks = list(adapter.stream_attention(ids, layers=(1,)))
        assert ran == [0, 1] and {chunk.layer for chunk in chunks} == {1}
    finally:
        for handle in handles:
            handle.remove()
    assert [block.layer for block in first_two] == [block.layer for block in every if block.layer < 2]
    for mine, theirs in zip(first_two, (block for block in every if block.layer < 2), strict=True):
        for field in fields(mine.stats):
            torch.testing.assert_close(getattr(mine.stats, field.name), getattr(theirs.stats, field.name))


def test_a_stop_wrapped_by_a_model_wrapper_still_ends_the_pass_and_other_errors_surface() -> None:
    """A wrapper around the model that re-raises the tap's StopForward as its own error (``raise … from``) still
    ends the pass quietly; an error raised while handling it, or any other error, reaches the caller."""
    from attnsens.models.adapter import StopForward

    adapter = M.load(tiny_model("llama"))
    ids = torch.randint(0, VOCAB, (1, 7))

    def failing(error_from):
        def forward(_ids, _mask=None):
            try:
                raise StopForward
            except StopForward as stop:
                raise RuntimeError("wrapped") from (stop if error_from else None)

        return forward

    adapter.forward = failing(error_from=True)  # type: ignore[method-assign]
    assert adapter.forward_until_stopped(ids) is True
    adapter.forward = failing(error_from=False)  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="wrapped"):
        adapter.forward_until_stopped(ids)
    del adapter.forward
    assert adapter.forward_until_stopped(ids) is False  # no tap stops it: the whole pass runs


def test_the_heap_is_trimmed_after_layers_whose_rows_are_fresh_tensors_only(monkeypatch) -> None:
    import attnsens.capture.stream as stream

    adapter = M.load(tiny_model("llama"))
    ids = torch.randint(0, VOCAB, (1, 17))
    trims = []
    monkeypatch.setattr(stream, "TRIM_WORKING_SET", 1)  # every chunk counts as large
    monkeypatch.setattr(stream, "release_free_memory", lambda: trims.append(1))
    # Every head: the rows live in the shared buffers, so there is nothing to give back after a layer.
    C.capture_row_statistics(adapter, ids)
    assert trims == []
    # A subset of heads: fresh tensors each chunk, trimmed after each layer.
    C.capture_row_statistics(adapter, ids, selection=C.RowSelection(heads=(0,)))
    assert len(trims) == adapter.spec.n_layer


def test_aligned_spans_widen_causal_and_windowed_chunks_with_exact_zeros() -> None:
    """The capture's chunks are widened to a multiple of KEY_ALIGNMENT keys (a faster QKᵀ): the span moves its stop
    later, or its start earlier where n ends first; the keys it adds are exactly 0 in every row, and the rest equal
    the tight chunk's rows to float32 rounding (a GEMM of another shape)."""
    from attnsens.models.attention import KEY_ALIGNMENT, AttentionCall, aligned_span, chunked_rows

    assert aligned_span((0, 5), 100, 16) == (0, 16)
    assert aligned_span((3, 36), 100, 16) == (3, 51)
    assert aligned_span((70, 99), 100, 16) == (68, 100)  # past n: the start moves earlier
    assert aligned_span((0, 40), 40, 16) == (0, 40)  # n shorter than the widened span: all of it
    assert aligned_span((4, 20), 100, 16) == (4, 20)  # already a multiple
    generator = torch.Generator().manual_seed(3)
    n = 61
    query, key = torch.randn(1, 4, n, 8, generator=generator), torch.randn(1, 2, n, 8, generator=generator)
    positions = torch.arange(n).expand(1, -1)
    spans = [(0, 9), (9, 30), (30, 47), (47, 61)]
    every = tuple(range(4))
    for call in (AttentionCall(tau=8**0.5, causal=True), AttentionCall(tau=8**0.5, causal=True, window=20)):
        tight = list(chunked_rows(query, key, call, positions, spans, heads=every, key_padding_mask=None,
                                  narrow_keys=True))  # fmt: skip
        wide = list(chunked_rows(query, key, call, positions, spans, heads=every, key_padding_mask=None,
                                 narrow_keys=True, align_keys=KEY_ALIGNMENT))  # fmt: skip
        widened = 0
        for narrow, aligned in zip(tight, wide, strict=True):
            start, width = aligned.key_start, aligned.probs.shape[-1]
            assert width % KEY_ALIGNMENT == 0 or width == n or start == 0
            assert start <= narrow.key_start and narrow.key_start + narrow.probs.shape[-1] <= start + width
            widened += width > narrow.probs.shape[-1]
            offset = narrow.key_start - start
            end = offset + narrow.probs.shape[-1]
            torch.testing.assert_close(aligned.probs[..., offset:end], narrow.probs, rtol=1e-6, atol=1e-7)
            outside = torch.cat([aligned.probs[..., :offset], aligned.probs[..., end:]], dim=-1)
            assert torch.equal(outside, torch.zeros_like(outside))
            assert torch.equal(aligned.n_keys, narrow.n_keys)
        assert widened >= 2
