"""Decoder layers run in query slices under the audit's capture (attnsens.models.query_slices).

The capture of every row with slices of 4 queries must give the rows of the capture without slices, token for
token, for every causal family whose attention the tap computes; layers with a mask of their own (padding,
sliding windows, eager attention) must run whole; and every replaced forward must be restored.
"""

from __future__ import annotations

import pytest
import torch

import attnsens.models as M
from attnsens.capture import RowSelection, capture_row_statistics
from attnsens.capture.stream import _split_at_multiples
from attnsens.models import hf_tap, query_slices
from attnsens.study.auditing import audit
from tests.unit.models.tiny_models import DECODER_FAMILIES, FAMILIES, INTERFACE_FAMILIES, VOCAB, tiny_model

IDS = torch.randint(2, VOCAB, (2, 13), generator=torch.Generator().manual_seed(5))
EAGER_ONLY = ("gemma2", "vaultgemma", "bloom", "mpt")
FIELDS = ("p_max", "entropy", "theta_lower", "theta_upper", "argmax", "n_keys")
SLICED = {"gpt2": 2, "gpt_neox": 2, "llama": 2, "qwen2": 1, "qwen3": 2, "gemma": 2, "gemma3_text": 1, "olmo2": 2,
          "opt": 2, "opt_post": 2, "gptj": 2, "phi": 2, "stablelm": 2, "cohere": 2, "ministral": 1, "seed_oss": 2,
          "internlm3": 2, "olmo3": 1, "gpt_bigcode": 2, "smollm3": 1, "helium": 2, "ernie4_5": 2, "glm": 2,
          "glm4": 2, "cohere2": 1, "biogpt": 2, "granite": 2,
          "olmo": 2}  # fmt: skip
"""Layers run in slices, per family. The others' layers run whole: a sliding window's mask in every layer (Mistral,
Phi-3, Starcoder2; Qwen2, Gemma 3, Ministral and OLMo 3 in one of their two), eager attention's mask (Gemma 2,
whose softcap has no sdpa path), taps of their own (BLOOM, MPT), or attention modules read through the interface
alone, without their blocks (Mixtral, the CLIP text tower)."""
CAUSAL = tuple(f for f in (*FAMILIES, *DECODER_FAMILIES, *INTERFACE_FAMILIES) if f not in ("bert", "modernbert"))


def _rows(adapter: M.ModelAdapter, tokens: int, monkeypatch: pytest.MonkeyPatch, **kwargs) -> dict[str, torch.Tensor]:
    """Every statistic of every row, [layer, batch, head, query] (NaN where no row), captured with slices of
    ``tokens`` queries."""
    monkeypatch.setattr(query_slices, "QUERY_SLICE", tokens)
    blocks = capture_row_statistics(adapter, IDS, **kwargs)
    shape = (adapter.spec.n_layer, IDS.shape[0], adapter.spec.n_head, IDS.shape[1])
    out = {}
    for field in FIELDS:
        table = torch.full(shape, float("nan"), dtype=torch.float64)
        for block in blocks:
            values = getattr(block.stats, field).double()
            for j, head in enumerate(block.heads):
                table[block.layer, :, head, block.query_positions[0]] = values[:, j]
        out[field] = table
    return out


def _sliced_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = hf_tap._sliced_call

    def counted(*args, **kwargs):
        calls.append(args[2])  # the layer
        return original(*args, **kwargs)

    monkeypatch.setattr(hf_tap, "_sliced_call", counted)
    return calls


@pytest.mark.parametrize("family", CAUSAL)
def test_rows_in_query_slices_are_the_rows_of_whole_layers(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(family, attn_implementation="eager" if family in EAGER_ONLY else "sdpa")
    adapter = M.load(model)
    whole = _rows(adapter, 10**9, monkeypatch)
    calls = _sliced_calls(monkeypatch)
    sliced = _rows(adapter, 4, monkeypatch)
    # 13 tokens in slices of 4: four calls a sliced layer.
    assert len(calls) == 4 * SLICED.get(family, 0), calls
    for field in FIELDS:
        assert not bool(whole[field].isnan().any())
        torch.testing.assert_close(sliced[field], whole[field], rtol=1e-5, atol=1e-5, msg=field)
    assert all("forward" not in vars(block) for block in adapter.blocks())
    assert query_slices.current() is None and query_slices._buffers is None


def test_padding_a_layer_subset_or_a_subset_of_rows_runs_whole_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = M.load(tiny_model("llama"))
    calls = _sliced_calls(monkeypatch)
    padded = torch.ones_like(IDS)
    padded[1, 10:] = 0
    _rows(adapter, 4, monkeypatch, attention_mask=padded)
    _rows(adapter, 4, monkeypatch, selection=RowSelection(layers=(1,)))
    _rows(adapter, 4, monkeypatch, selection=RowSelection(heads=(0,)))
    assert calls == []
    _rows(adapter, 4, monkeypatch)
    assert calls == [0] * 4 + [1] * 4


def test_the_audit_of_sliced_layers_is_the_audit_of_whole_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = M.load(tiny_model("qwen3"))
    monkeypatch.setattr(query_slices, "QUERY_SLICE", 10**9)
    whole = audit(adapter, IDS).summary
    monkeypatch.setattr(query_slices, "QUERY_SLICE", 3)
    sliced = audit(adapter, IDS).summary
    numeric = [c for c in whole.columns if whole[c].dtype.kind == "f"]
    assert numeric
    torch.testing.assert_close(torch.tensor(sliced[numeric].to_numpy()), torch.tensor(whole[numeric].to_numpy()),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_gpt2_with_its_reordered_attention_runs_whole_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("gpt2", reorder_and_upcast_attn=True, attn_implementation="eager")
    model.set_attn_implementation("sdpa")  # no mask of its own: only the reordered path keeps the layers whole
    adapter = M.load(model)
    assert adapter.query_sliceable_layers() == []
    calls = _sliced_calls(monkeypatch)
    _rows(adapter, 4, monkeypatch)
    assert calls == []


def test_a_slice_whose_attention_skips_the_tap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = M.load(tiny_model("llama"))
    monkeypatch.setattr(query_slices, "answered", lambda: None)  # as if the attention ran past the tap
    with pytest.raises(RuntimeError, match="0 attention calls through the tap"):
        _rows(adapter, 4, monkeypatch)
    assert query_slices.current() is None and all("forward" not in vars(block) for block in adapter.blocks())


def test_only_sdpa_attention_runs_in_slices() -> None:
    """Eager attention is always given a mask; other kernels (flash attention) may apply a sliding window that
    the call to the interface does not show."""
    model = tiny_model("llama")
    assert len(M.load(model).query_sliceable_layers()) == 2
    model.set_attn_implementation("eager")
    assert M.load(model).query_sliceable_layers() == []


class _Layer(torch.nn.Module):
    """Counts its calls and the tokens of each; adds the position ids to its input."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: list[int] = []

    def forward(self, hidden_states: torch.Tensor, *args, position_ids=None, **kwargs) -> torch.Tensor:
        self.widths.append(hidden_states.shape[1])
        if query_slices.current() is not None:
            query_slices.answered()  # it has no attention: as if the tap had computed it
        return hidden_states + (0 if position_ids is None else position_ids[..., None])


def test_only_calls_the_slicer_understands_are_sliced() -> None:
    layer = _Layer()
    hidden = torch.zeros(1, 10, 2)
    positions = torch.arange(10)[None]
    with query_slices.in_query_slices([layer], 4):
        out = layer(hidden, position_ids=positions, use_cache=False)
        torch.testing.assert_close(out, positions[..., None].expand(1, 10, 2).float())
        assert layer.widths == [4, 4, 2]
        layer.widths.clear()
        layer(hidden, attention_mask=torch.ones(1, 1, 10, 10))  # a mask of its own
        layer(hidden, torch.zeros(1))  # a positional argument that is not None
        layer(hidden, alibi=torch.zeros(1, 10))  # a tensor the slicer does not know
        layer(hidden, cache_position=torch.arange(5))  # not one per token
        layer(hidden[:, :4])  # short enough already
        assert layer.widths == [10, 10, 10, 10, 4]
        layer.widths.clear()
        layer(hidden, None, None, position_ids=positions)  # GPT-2's blocks pass empty arguments by position
        out = layer(hidden_states=hidden, position_ids=positions)  # the hidden states by name
        torch.testing.assert_close(out, positions[..., None].expand(1, 10, 2).float())
        assert layer.widths == [4, 4, 2] * 2
    assert "forward" not in vars(layer)


def test_with_overwrite_a_layer_writes_its_output_over_its_own_input_only() -> None:
    layer, positions = _Layer(), torch.arange(10)[None]
    expected = positions[..., None].expand(1, 10, 2).float()
    hidden = torch.zeros(1, 10, 2)
    with query_slices.in_query_slices([layer], 4):
        out = layer(hidden, position_ids=positions)
    assert out is not hidden and not hidden.any()  # without overwrite the caller's input is left alone
    with query_slices.in_query_slices([layer], 4, overwrite=True):
        out = layer(hidden, position_ids=positions)
        assert out is hidden
        torch.testing.assert_close(hidden, expected)
        # Every slice read its own input rows before they were overwritten: two calls add the positions twice.
        torch.testing.assert_close(layer(out, position_ids=positions), 2 * expected)
        # A view (of a parameter, of a wider tensor) or another dtype is never written over.
        wide = torch.zeros(1, 10, 4)
        assert layer(wide[..., :2], position_ids=positions) is not None and not wide.any()
        double = torch.zeros(1, 10, 2, dtype=torch.float64)
        assert layer(double, position_ids=positions.double()) is double  # the output's dtype: written over
        single = torch.zeros(1, 10, 2)
        assert layer(single, position_ids=positions.double()) is not single and not single.any()
    assert layer.widths == [4, 4, 2] * 6


class _OldLayer(_Layer):
    """Returns its hidden states in a tuple, with a None for the weights, as transformers 4's decoder layers do."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, None]:
        return (super().forward(hidden_states, *args, **kwargs), None)


def test_a_layer_that_returns_a_tuple_gets_its_tuple_back() -> None:
    layer = _OldLayer()
    positions = torch.arange(10)[None]
    with query_slices.in_query_slices([layer], 4):
        out, weights = layer(torch.zeros(1, 10, 2), position_ids=positions)
    torch.testing.assert_close(out, positions[..., None].expand(1, 10, 2).float())
    assert weights is None and layer.widths == [4, 4, 2]


def test_spans_are_cut_at_the_slice_bounds() -> None:
    assert _split_at_multiples([(0, 3), (3, 9), (9, 13)], 4) == [(0, 3), (3, 4), (4, 8), (8, 9), (9, 12), (12, 13)]
    assert _split_at_multiples([(0, 8)], 4) == [(0, 4), (4, 8)]


def test_sliced_layers_chunk_by_their_causal_keys_within_the_budget_and_the_workspace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sliced layer's chunks are sized by the keys up to their last query: under a budget of 12 rows of all 40
    keys, the first chunk holds more rows than a chunk over all keys could, no chunk exceeds the budget, and every
    chunk's rows live in the shared workspace (a chunk the workspace could not hold would be a fresh tensor)."""
    from attnsens.capture import stream
    from attnsens.capture.selection import MASK_BYTES_PER_KEY, WORKING_BYTES_PER_SCORE
    from attnsens.models.attention import RowWorkspace

    adapter = M.load(tiny_model("llama"))
    heads, n = adapter.spec.n_head, 40
    ids = torch.randint(2, VOCAB, (1, n), generator=torch.Generator().manual_seed(1))
    per_key = heads * WORKING_BYTES_PER_SCORE + MASK_BYTES_PER_KEY
    selection = RowSelection(max_memory=12 * n * per_key)
    chunks: list[tuple[int, int]] = []
    fresh: list[bool] = []
    original_views = RowWorkspace.views

    def views(self, shape, device):
        got = original_views(self, shape, device)
        fresh.append(got is None)
        chunks.append((shape[2], shape[3]))  # rows, keys
        return got

    monkeypatch.setattr(RowWorkspace, "views", views)
    monkeypatch.setattr(query_slices, "QUERY_SLICE", 16)
    calls = _sliced_calls(monkeypatch)
    capture_row_statistics(adapter, ids, selection=selection)
    assert calls and chunks and not any(fresh)
    assert chunks[0][0] > 12  # 16 rows (one slice) over 16 keys fit the budget
    # The budget counts each chunk's keys up to its last query; alignment may add up to 15 keys.
    assert all(rows * (keys - 15) * per_key <= selection.max_memory for rows, keys in chunks)
    assert stream.KEY_ALIGNMENT == 16 and all(keys % 16 == 0 or keys == n for _, keys in chunks)
