"""Streamed attention rows agree with the model's own eager ``output_attentions`` to float32 rounding."""

from __future__ import annotations

import pytest
import torch

import attnsens.models as M
from attnsens.errors import ConfigError, InputError
from tests.unit.models.tiny_models import FAMILIES, VOCAB, eager_attentions, tiny_model


def _gathered(reference: torch.Tensor, heads: tuple[int, ...], positions: torch.Tensor) -> torch.Tensor:
    rows = reference[:, list(heads)]
    index = positions[:, None, :, None].expand(-1, rows.shape[1], -1, rows.shape[3])
    return torch.gather(rows, 2, index)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_row_matches_eager_attention(family: str, implementation: str) -> None:
    model = tiny_model(family, attn_implementation=implementation)
    adapter = M.load(model)
    ids = torch.randint(0, VOCAB, (2, 23))
    reference = eager_attentions(model, ids)
    chunks = list(adapter.stream_attention(ids, chunk_size=7))
    assert [c.layer for c in chunks] == [0] * 4 + [1] * 4  # ceil(23 / 7) chunks per layer
    for chunk in chunks:
        expected = _gathered(reference[chunk.layer], chunk.heads, chunk.query_positions)
        torch.testing.assert_close(chunk.probs, expected, rtol=1e-5, atol=1e-6)
        masked = expected == 0
        assert torch.equal(chunk.probs[masked], torch.zeros_like(chunk.probs[masked]))


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_selected_heads_and_positions_match_eager(family: str) -> None:
    """Grouped-query heads (Llama 6 query heads on 2 key heads) and sparse positions per sequence."""
    model = tiny_model(family)
    adapter = M.load(model)
    ids = torch.randint(0, VOCAB, (3, 29))
    positions = torch.tensor([[0, 5, 28], [3, 4, 17], [1, 20, 27]])
    heads = (4, 1) if family == "llama" else (2, 0)
    reference = eager_attentions(model, ids)
    chunks = list(adapter.stream_attention(ids, layers=[1], heads=heads, query_positions=positions, chunk_size=2))
    assert [c.layer for c in chunks] == [1, 1]
    for chunk in chunks:
        assert chunk.heads == heads
        torch.testing.assert_close(
            chunk.probs, _gathered(reference[1], heads, chunk.query_positions), rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(chunk.n_keys, chunk.query_positions + 1)


def test_padding_keys_get_exact_zero_probability_in_bert() -> None:
    model = tiny_model("bert")
    adapter = M.load(model)
    ids = torch.randint(0, VOCAB, (2, 17))
    mask = torch.ones(2, 17, dtype=torch.long)
    mask[1, 11:] = 0
    reference = eager_attentions(model, ids, attention_mask=mask)
    positions = torch.tensor([[0, 8, 16], [0, 5, 10]])
    (chunk,) = adapter.stream_attention(ids, layers=[0], query_positions=positions, attention_mask=mask)
    torch.testing.assert_close(chunk.probs, _gathered(reference[0], chunk.heads, positions), rtol=1e-5, atol=1e-6)
    assert torch.all(chunk.probs[1, :, :, 11:] == 0)
    assert chunk.n_keys.tolist() == [[17, 17, 17], [11, 11, 11]]


def test_model_output_is_unchanged_while_tapped() -> None:
    model = tiny_model("llama")
    adapter = M.load(model)
    ids = torch.randint(0, VOCAB, (1, 13))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        seen = []
        with adapter.query_key_tap(lambda layer, q, k, call: seen.append((layer, q.shape, k.shape, call.tau))):
            tapped = model(input_ids=ids).logits
    assert torch.equal(plain, tapped)
    assert seen == [(i, (1, 6, 13, 6), (1, 2, 13, 6), pytest.approx(6**0.5)) for i in range(2)]


def test_tap_is_removed_after_use() -> None:
    model = tiny_model("gpt2")
    adapter = M.load(model)
    seen = []
    with adapter.query_key_tap(lambda *args: seen.append(args[0])):
        pass
    with torch.no_grad():
        model(input_ids=torch.randint(0, VOCAB, (1, 5)))
    assert seen == []


@pytest.mark.parametrize("selection", [{"layers": [0, 0]}, {"heads": [1, 1]}])
def test_a_repeated_layer_or_head_is_a_config_error(selection: dict[str, list[int]]) -> None:
    adapter = M.load(tiny_model("gpt2"))
    with pytest.raises(ConfigError, match="more than once"):
        list(adapter.stream_attention(torch.randint(0, VOCAB, (1, 5)), **selection))


def test_bad_input_is_rejected_at_the_call_not_at_the_first_chunk() -> None:
    adapter = M.load(tiny_model("gpt2"))
    too_long = torch.zeros(1, adapter.spec.max_positions + 1, dtype=torch.long)
    with pytest.raises(InputError, match="exceeds the context"):
        adapter.stream_attention(too_long)  # not iterated
    with pytest.raises(ConfigError):
        adapter.stream_attention(torch.zeros(1, 3, dtype=torch.long), layers=[adapter.spec.n_layer])


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_gpt2_with_reordered_and_upcast_attention_matches_eager(implementation: str) -> None:
    """GPT-2's eager path with ``reorder_and_upcast_attn`` bypasses the interface; its rows are still tapped."""
    model = tiny_model("gpt2", attn_implementation=implementation, reorder_and_upcast_attn=True,
                       scale_attn_by_inverse_layer_idx=True)  # fmt: skip
    ids = torch.randint(0, VOCAB, (2, 11))
    reference = eager_attentions(model, ids)
    chunks = list(M.load(model).stream_attention(ids))
    assert [chunk.layer for chunk in chunks] == [0, 1]
    for chunk in chunks:
        torch.testing.assert_close(chunk.probs, reference[chunk.layer], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("causal", "window"), [(True, None), (True, 5), (False, None), (False, 5)])
def test_the_key_span_of_a_maskless_call_is_the_span_its_mask_allows(causal: bool, window: int | None) -> None:
    from attnsens.models.attention import AttentionCall, allowed_span

    n = 40
    call = AttentionCall(tau=1.0, causal=causal, window=window)
    generator = torch.Generator().manual_seed(0)
    for rows in (1, 3, 17):
        positions = torch.sort(torch.randperm(n, generator=generator)[:rows]).values.expand(2, -1)
        full, _, n_keys = call.allowed(positions, n)
        span = call.key_span(positions, n)
        assert span == allowed_span(full, n)
        narrow, _, narrow_n_keys = call.allowed(positions, n, keys=span)
        start, stop = span
        expected = None if full is None else full[..., start:stop]
        assert (narrow is None and expected is None) or bool((narrow == expected).all())
        assert torch.equal(narrow_n_keys, n_keys)
        if window is not None:  # a flash kernel's window: keys within window − 1 before the query (or either side)
            distance = positions[..., None] - torch.arange(n)
            distance = distance if causal else distance.abs()
            expected_keys = (distance >= 0) & (distance < window)
            assert full is not None and torch.equal(full.expand_as(expected_keys), expected_keys)
    masked = AttentionCall(tau=1.0, mask=torch.ones(1, 1, n, n, dtype=torch.bool))
    assert masked.key_span(positions, n) is None
    with pytest.raises(ValueError, match="key_span"):
        masked.allowed(positions, n, keys=(0, n))
